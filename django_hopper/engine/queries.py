"""Named SQL, kept in ``.sql`` files beside each engine (procrastinate's way).

A file holds blocks introduced by ``-- name: <query_name>``; everything up to
the next such line is the query. Names are entity first (``job_claim``). A
multi-statement operation names its extra statements ``<name>.<part>``; the
engines must offer the same set of base names (a test checks it).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_.]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a ``.sql`` file's text into ``{name: query}``."""
    out: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        # Drop comment-only lines so the text sent to the server stays small.
        lines = [ln for ln in body.splitlines() if not ln.strip().startswith("--")]
        name = m.group(1)
        if name in out:
            raise ValueError(f"query {name!r} is defined twice")
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


@cache
def load(engine_dir: str) -> dict[str, str]:
    """Load every ``queries/*.sql`` file of an engine folder."""
    out: dict[str, str] = {}
    for path in sorted((Path(engine_dir) / "queries").glob("*.sql")):
        for name, sql in parse(path.read_text()).items():
            if name in out:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            out[name] = sql
    return out


def base_names(queries: dict[str, str]) -> set[str]:
    """Return the query names without their ``.part`` suffixes."""
    return {name.split(".", 1)[0] for name in queries}
