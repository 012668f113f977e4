"""Summarize a py-spy profile (raw collapsed stacks) into where a worker spends its CPU.

The profile is recorded with ``--idle``, so every thread is sampled all the
time: a sample whose leaf frame is a wait is counted as waiting (on the
database, or idle on another thread), the rest as CPU. py-spy's own idle
detection is not used because a thread blocked in C (``SimpleQueue.get``) can
look busy to it. The CPU part is what caps a no-op workload: the GIL runs one
thread's Python at a time. Each CPU stack goes in the first category whose
marker it contains.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

#: (category, markers): a stack belongs to the first category with a marker in it.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("startup and imports", ("_find_and_load", "django/setup", "apps/registry.py", "checks")),
    ("claim (job_claim)", ("job_claim",)),
    ("finalize (job_finalize_many)", ("job_finalize_many",)),
    ("heartbeat, leader, maintenance", ("client_renew", "heartbeat", "maintenance/", "leader")),
    ("notifications (listener)", ("listener", "notif")),
    ("running jobs (executor, per job)", ("worker/execution.py", "bench/jobs.py")),
    ("completer (queueing results)", ("worker/completer.py",)),
    ("producer and worker loop", ("worker/worker.py",)),
    ("thread handoffs (threading, queue)", ("threading.py", "queue.py", "concurrent/futures")),
)
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def parse(path: Path) -> list[tuple[list[str], int]]:
    """Return (frames root first, samples) per line of a py-spy raw file."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def short(frame: str) -> str:
    """Return ``func (module/file.py)`` without the line and the site-packages prefix."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file")
    for marker in ("site-packages/", "lib/python3", "/work/main/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m.group('func')} ({file})"


def categorize(frames: list[str]) -> str:
    """Return the category of one stack."""
    joined = ";".join(frames)
    for name, markers in CATEGORIES:
        if any(marker in joined for marker in markers):
            return name
    return "other"


#: (role, markers): a thread's role is the first whose marker appears in its stacks.
ROLES: tuple[tuple[str, str], ...] = (
    ("main (producer in --burst)", "Command.handle"),
    ("completer", "Completer._run"),
    ("notifier", "otifier"),
    ("heartbeat", "eartbeat"),
    ("asyncio loop", "Executor._run_loop"),
    ("job threads", "Executor._job_thread"),
    ("executor threads", "concurrent/futures/thread.py"),
    ("maintenance", "maintenance/"),
    ("producer", "Producer.run"),
)
#: Leaf frames of a thread that is waiting, not running: on the database (a
#: psycopg wait) or on other threads (a queue, a condition, an event).
DB_WAIT = ("Connection.wait", "EpollSelector.select", "wait_epoll", "wait_c", "wait_select")
IDLE_WAIT = (
    "Condition.wait",
    "Event.wait",
    "_worker (concurrent",
    "Thread.join",
    "_wait_for_tstate_lock",
    "sleep",
    "SimpleQueue.get",
    "Queue.get",
    "select (",
    # A job thread blocked in its queue's get(), a C call with no frame of its own.
    "Executor._job_thread",
)


def summarize(path: Path) -> dict[str, Any]:
    """Return, per thread role, its wall time split into DB wait, idle and CPU by category.

    The profile is recorded with ``--idle`` so that waiting shows too; a
    leaf frame that is a wait is counted as such, everything else as CPU.
    """
    stacks = parse(path)
    by_thread: dict[str, list[tuple[list[str], int]]] = {}
    for frames, n in stacks:
        tid = frames[0] if frames and frames[0].startswith("thread (") else "thread (?)"
        by_thread.setdefault(tid, []).append(([f for f in frames if f != tid], n))
    roles: dict[str, dict[str, Any]] = {}
    cpu_total = 0
    cpu_cats: Counter[str] = Counter()
    cpu_self: Counter[str] = Counter()
    cat_leaves: dict[str, Counter[str]] = {}
    for entries in by_thread.values():
        joined = ";".join(";".join(f) for f, _ in entries)
        role = next((r for r, marker in ROLES if marker in joined), "other")
        info = roles.setdefault(
            role, {"threads": 0, "samples": 0, "db_wait": 0, "idle": 0, "cpu": 0}
        )
        info["threads"] += 1
        for frames, n in entries:
            info["samples"] += n
            leaf = short(frames[-1]) if frames else "?"
            if not frames:
                info["idle"] += n  # no Python frame: a thread parked in native code
            elif any(m in leaf for m in DB_WAIT):
                info["db_wait"] += n
            elif any(m in leaf for m in IDLE_WAIT):
                info["idle"] += n
            else:
                info["cpu"] += n
                cpu_total += n
                cat = categorize(frames)
                cpu_cats[cat] += n
                cpu_self[leaf] += n
                cat_leaves.setdefault(cat, Counter())[leaf] += n
    total = cpu_total or 1
    return {
        "file": str(path),
        "cpu_samples": cpu_total,
        "threads": {
            role: {
                **info,
                **{
                    k: round(info[k] / max(1, info["samples"]), 3)
                    for k in ("db_wait", "idle", "cpu")
                },
            }
            for role, info in roles.items()
        },
        "categories": {k: round(v / total, 4) for k, v in cpu_cats.most_common()},
        "top_self": [(f, round(n / total, 4)) for f, n in cpu_self.most_common(20)],
        "category_leaves": {
            k: [(f, round(n / total, 4)) for f, n in c.most_common(5)]
            for k, c in cat_leaves.items()
        },
    }


def render_summary(s: dict[str, Any]) -> str:
    """Return the summary as text."""
    if "error" in s:
        return f"profile: {s['error']}"
    lines = [f"== profile of one worker ({s['file']}) ==", ""]
    lines.append("Wall time of each thread: waiting on the database / idle / on the CPU")
    for role, t in sorted(s["threads"].items(), key=lambda kv: -kv[1]["samples"]):
        lines.append(
            f"  {role:<18} x{t['threads']:<3} db {t['db_wait'] * 100:5.1f}%  "
            f"idle {t['idle'] * 100:5.1f}%  cpu {t['cpu'] * 100:5.1f}%"
        )
    lines.append(f"Where the CPU goes ({s['cpu_samples']:,} samples on the CPU)")
    for name, share in s["categories"].items():
        lines.append(f"  {share * 100:5.1f}%  {name}")
        for leaf, lshare in s["category_leaves"].get(name, [])[:3]:
            lines.append(f"           {lshare * 100:5.1f}%  {leaf}")
    lines.append("Heaviest functions on the CPU (self)")
    lines.extend(f"  {share * 100:5.1f}%  {f}" for f, share in s["top_self"][:15])
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(render_summary(summarize(Path(sys.argv[1]))))
