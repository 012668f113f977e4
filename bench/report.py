"""Turn benchmark JSON into the Markdown results table of docs/benchmark.md.

``python -m bench.report bench-results/a.json [b.json ...]`` prints one table
per engine: a column per run and one for the median, each hopper figure with
its ratio to the raw bound of the same run, so that runs can be compared and
pasted into the docs as they are.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], str]]


def _rate(v: Any) -> str:
    """Format a rate."""
    return "n/a" if v is None else f"{v:,.0f}"


def _ratio(a: Any, b: Any) -> str:
    """Format a / b as a ratio."""
    return "n/a" if not a or not b else f"{a / b:.2f}x"


def _with_ratio(
    value: Callable[[dict[str, Any]], Any],
    bound: Callable[[dict[str, Any]], Any],
    key: str = "",
) -> Callable[[dict[str, Any]], str]:
    """Return a cell showing a hopper figure and its ratio to the bound of the same run.

    The ratio stored with the run (``ratios[key]``) is preferred: in a median
    column it is the median of the runs' ratios, not a ratio of medians.
    """

    def cell(r: dict[str, Any]) -> str:
        stored = (r.get("ratios") or {}).get(key)
        shown = f"{stored:.2f}x" if stored else _ratio(value(r), bound(r))
        return f"{_rate(value(r))} ({shown})"

    return cell


def _growth(key: str) -> Callable[[dict[str, Any]], str]:
    """Return a cell comparing a growth case's throughput and latency to the empty case."""

    def cell(r: dict[str, Any]) -> str:
        stored = r.get("ratios") or {}
        tp_r, lat_r = stored.get(f"{key}_throughput"), stored.get(f"{key}_latency")
        if tp_r and lat_r:
            return f"{tp_r:.2f}x / {lat_r:.2f}x"
        c, e = r["growth"][key], r["growth"]["empty"]
        tp, etp = c["processing"]["jobs_per_s"], e["processing"]["jobs_per_s"]
        med, emed = c["latency"].get("median_ms"), e["latency"].get("median_ms")
        return f"{_ratio(tp, etp)} / {_ratio(med, emed)}"

    return cell


def _statement(st: dict[str, Any]) -> str:
    """Format a statement probe: wall ms, and the server's planning + execution ms."""
    if st.get("median_ms") is None:
        return "n/a"
    out = f"{st['median_ms']:.1f}"
    if "execution_ms" in st:
        out += f" ({st['planning_ms']:.1f} + {st['execution_ms']:.1f})"
    return out


def _memory(r: dict[str, Any]) -> str:
    """Format the RSS samples of the memory run."""
    rss = r["memory"].get("rss_kb") or {}
    marks = [rss.get(k) for k in ("10%", "50%", "100%")]
    return " / ".join("?" if v is None else f"{v / 1024:.0f}" for v in marks) + " MB"


ROWS: list[Row] = [
    ("raw cycle, 1 connection (jobs/s)", lambda r: _rate(r["raw"]["cycle_1conn"]["jobs_per_s"])),
    ("raw cycle, 2 connections", lambda r: _rate(r["raw"]["cycle_2conn"]["jobs_per_s"])),
    ("raw one-row inserts (rows/s)", lambda r: _rate(r["raw"]["insert_one"]["jobs_per_s"])),
    ("raw multi-row inserts", lambda r: _rate(r["raw"]["insert_multi"]["jobs_per_s"])),
    (
        "processing, 1 process (x raw 1 conn)",
        _with_ratio(
            lambda r: r["processing"]["1proc"]["jobs_per_s"],
            lambda r: r["raw"]["cycle_1conn"]["jobs_per_s"],
            "processing_1proc",
        ),
    ),
    (
        "processing, 2 processes (x raw 2 conns)",
        _with_ratio(
            lambda r: r["processing"]["2proc"]["jobs_per_s"],
            lambda r: r["raw"]["cycle_2conn"]["jobs_per_s"],
            "processing_2proc",
        ),
    ),
    (
        "(diagnostic) 1 process, concurrency 100",
        _with_ratio(
            lambda r: r["processing"]["1proc_c100"]["jobs_per_s"],
            lambda r: r["raw"]["cycle_1conn"]["jobs_per_s"],
            "processing_1proc_c100",
        ),
    ),
    (
        "1 process, tracing (0.1) + metrics on (x off)",
        _with_ratio(
            lambda r: r["processing"]["1proc_observed"]["jobs_per_s"],
            # Off measured in the same alternated pairs; before the pairs, the run's 1 process.
            lambda r: (
                r["processing"]["1proc_observed"].get("off_jobs_per_s")
                or r["processing"]["1proc"]["jobs_per_s"]
            ),
            "processing_observed",
        ),
    ),
    (
        "worker CPU per job, 1 process (µs)",
        lambda r: f"{r['processing']['1proc'].get('cpu_us_per_job', 0):,.0f}",
    ),
    (
        "enqueue(), 1 per transaction (x one-row)",
        _with_ratio(
            lambda r: r["enqueue"]["one_per_tx"]["jobs_per_s"],
            # The raw insert alternated with it; before the pairs, the run's raw insert.
            lambda r: (
                r["enqueue"]["one_per_tx"].get("raw_jobs_per_s")
                or r["raw"]["insert_one"]["jobs_per_s"]
            ),
            "enqueue_one_per_tx",
        ),
    ),
    (
        "enqueue_many, 1,000 (x multi-row)",
        _with_ratio(
            lambda r: r["enqueue"]["many_1000"]["jobs_per_s"],
            lambda r: r["raw"]["insert_multi"]["jobs_per_s"],
            "enqueue_many_1000",
        ),
    ),
    (
        "enqueue_many unique keys, 1,000 (x multi-row)",
        _with_ratio(
            lambda r: r["enqueue"]["unique_many_1000"]["jobs_per_s"],
            lambda r: r["raw"]["insert_multi"]["jobs_per_s"],
            "insert_many_unique_1000",
        ),
    ),
    (
        "workflow of 10,000 jobs, one transaction: s (build + enqueue)",
        lambda r: (
            f"{r['workflow']['seconds']:.2f} ({r['workflow']['build_s']:.2f} + "
            f"{r['workflow']['insert_s']:.2f})"
        ),
    ),
    (
        "claim of 10 alone: ms (server plan + run)",
        lambda r: _statement(r["growth"]["empty"].get("claim") or {}),
    ),
    (
        "finalize of 10 alone: ms (server plan + run)",
        lambda r: _statement(r["growth"]["empty"].get("finalize") or {}),
    ),
    (
        "pickup latency median / p95 (ms)",
        lambda r: f"{r['latency'].get('median_ms', 0):.1f} / {r['latency'].get('p95_ms', 0):.1f}",
    ),
    ("100k x scale waiting: throughput / latency vs empty", _growth("waiting_small")),
    ("1M x scale waiting: throughput / latency vs empty", _growth("waiting_large")),
    ("1M x scale in history: throughput / latency vs empty", _growth("history_large")),
    ("worker RSS at 10% / 50% / 100%", _memory),
    (
        "cold: enqueue() in atomic(), 1 per transaction (x one-row)",
        _with_ratio(
            lambda r: r["cold"]["enqueue_one_per_tx"]["jobs_per_s"],
            lambda r: (
                r["cold"]["enqueue_one_per_tx"].get("raw_jobs_per_s")
                or r["raw"]["insert_one"]["jobs_per_s"]
            ),
            "cold_enqueue_one_per_tx",
        ),
    ),
    (
        "cold: 1 process (x raw 1 conn)",
        _with_ratio(
            lambda r: r["cold"]["1proc"]["jobs_per_s"],
            lambda r: r["raw"]["cycle_1conn"]["jobs_per_s"],
            "cold_1proc",
        ),
    ),
    (
        "cold: 2 processes (x raw 2 conns)",
        _with_ratio(
            lambda r: r["cold"]["2proc"]["jobs_per_s"],
            lambda r: r["raw"]["cycle_2conn"]["jobs_per_s"],
            "cold_2proc",
        ),
    ),
    (
        "cold: pickup latency median / p95 (ms)",
        lambda r: (
            f"{r['cold']['latency'].get('median_ms', 0):.1f} / "
            f"{r['cold']['latency'].get('p95_ms', 0):.1f}"
        ),
    ),
    (
        "round trips: enqueue() autocommit / in atomic() / unique key in atomic()",
        lambda r: " / ".join(
            f"{r['round_trips'][k]['round_trips']:.0f}"
            for k in (
                "enqueue() in autocommit",
                "enqueue() in transaction.atomic()",
                "enqueue() with a unique key, in atomic()",
            )
        ),
    ),
]


def targets_table(engine: str, trees: list[dict[str, Any]], columns: list[str]) -> str:
    """Return the Markdown table of the targets: each run's figure and its verdict."""
    from bench.run import evaluate_targets

    per_tree = [evaluate_targets(engine, t) for t in trees]
    out = ["| target | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for i, (label, _, _) in enumerate(per_tree[0]):
        cells = []
        for evaluated in per_tree:
            _, value, verdict = evaluated[i]
            cells.append("n/a" if value is None else f"{value:.2f} {verdict}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table(engine: str, runs: list[dict[str, Any]], median: dict[str, Any] | None) -> str:
    """Return the Markdown table of one engine's runs (and their medians)."""
    columns = [f"run {i + 1}" for i in range(len(runs))]
    trees = list(runs)
    if median is not None and len(runs) > 1:
        columns.append("median")
        trees.append(median)
    out = [f"**{engine}**", "", "| figure | " + " | ".join(columns) + " |"]
    out.append("|---|" + "---|" * len(columns))
    for label, cell in ROWS:
        cells = []
        for tree in trees:
            try:
                cells.append(cell(tree))
            except (KeyError, TypeError):
                cells.append("n/a")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(targets_table(engine, trees, columns))
    return "\n".join(out)


def main(paths: list[str]) -> int:
    """Print a table per engine found in the given JSON files (their runs pooled)."""
    from bench.run import median_tree, ratios

    pooled: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        print(f"<!-- {path}: scale {data['meta']['scale']}, {data['meta']['started']} -->")
        for engine, result in data["engines"].items():
            for run in result.get("runs", []):
                if "ratios" not in run:  # written before runs stored their ratios
                    try:
                        run["ratios"] = ratios(run)
                    except (KeyError, TypeError):
                        pass
                pooled.setdefault(engine, []).append(run)
    for engine, runs in pooled.items():
        if runs:
            print(table(engine, runs, median_tree(runs) if len(runs) > 1 else None))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
