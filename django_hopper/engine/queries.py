"""Named SQL, kept in ``.sql`` files beside each engine (procrastinate's way).

A file holds blocks introduced by ``-- name: <query_name>``; everything up to
the next such line is the query. Names are entity first (``job_claim``). A
multi-statement operation names its extra statements ``<name>.<part>``; the
engines must offer the same set of base names (a test checks it).

One small substitution pass runs when the files are loaded (River's
``sqlctemplate`` is the precedent), so that what several statements share is
written once per engine and every statement the server sees is plain SQL:

* **Fragments.** ``{name}`` or ``{name:alias}`` is replaced by a fragment;
  with an alias, every column of a column-list fragment is qualified by it.
  The job column lists are built here from :data:`JOB_COLUMNS`, the one order
  both engines return job rows in: ``{job_columns}`` (a job row of the live
  table: its columns, then ``{no_history}``), ``{job_columns_live}`` (the live
  table's columns alone, for inserts into it) and ``{job_columns_history}``
  (every column of a history row). An engine defines its own fragments in
  blocks introduced by ``-- fragment: <name>`` (each engine's ``no_history``
  is the pair of NULLs, typed as it needs them, that stand for
  ``finalized_at, output`` on a live row). A brace word that names no fragment
  is left alone, for the few statements a caller formats itself
  (``PRAGMA busy_timeout = {ms}``). A fragment may use other fragments.
* **Variants.** A line ``-- variant: <name> FLAG [FLAG ...]`` inside a block
  declares a second query made from the same text with those flags on
  (``-- variant: job_claim.limited LIMITED``); the block's own query has every
  flag off. ``/*IF FLAG*/ a /*ELSE*/ b /*END*/`` keeps ``a`` where the flag is
  on and ``b`` (or nothing, without ``/*ELSE*/``) where it is off; sections do
  not nest. A flag a block tests must be declared by one of its variants and
  the other way round, so a misspelt flag fails at load, not in production.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

#: A named placeholder of the query files (``%(name)s``, Django's paramstyle), or
#: an escaped percent sign (``%%``). The engines' hot paths that bypass Django's
#: cursor rewrite them with it into their driver's own paramstyle.
NAMED_PLACEHOLDER = re.compile(r"%\(([A-Za-z_]\w*)\)s|%%")

#: The columns of every job row the engines return, in this order: the live
#: table's columns (``step``, ``subject``, ``erased_at`` last), then
#: ``finalized_at`` and ``output``, which a live row returns as NULL. Written
#: once, here: the SQL gets it through the ``{job_columns}`` fragments and the
#: converters read rows through :data:`COL`.
JOB_COLUMNS_LIVE: tuple[str, ...] = (
    "id", "kind", "queue", "state", "priority", "attempt", "max_attempts", "scheduled_at",
    "attempted_at", "attempted_by", "fence", "args", "metadata", "errors", "unique_key",
    "ordering_key", "partition_key", "tags", "batch_id", "expires_at", "cancel_requested_at",
    "awaited", "created_at", "snooze_reason", "progress", "lease_token", "lease_expires_at",
    "lease_renewed_at", "step", "subject", "erased_at",
)  # fmt: skip
JOB_COLUMNS: tuple[str, ...] = (*JOB_COLUMNS_LIVE, "finalized_at", "output")
#: How many columns a job row has (a query may add its own after them).
JOB_WIDTH = len(JOB_COLUMNS)


@dataclass(frozen=True, slots=True)
class _JobColumnIndex:
    """The position of each column of :data:`JOB_COLUMNS` in a job row, by name."""

    id: int
    kind: int
    queue: int
    state: int
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: int
    attempted_at: int
    attempted_by: int
    fence: int
    args: int
    metadata: int
    errors: int
    unique_key: int
    ordering_key: int
    partition_key: int
    tags: int
    batch_id: int
    expires_at: int
    cancel_requested_at: int
    awaited: int
    created_at: int
    snooze_reason: int
    progress: int
    lease_token: int
    lease_expires_at: int
    lease_renewed_at: int
    step: int
    subject: int
    erased_at: int
    finalized_at: int
    output: int


#: Named positions in a job row: ``row[COL.step]``, never ``row[28]``.
COL = _JobColumnIndex(**{name: i for i, name in enumerate(JOB_COLUMNS)})

_BLOCK = re.compile(r"^--\s*(name|fragment):\s*([a-z_][a-z0-9_.]*)\s*$", re.MULTILINE)
_VARIANT = re.compile(r"^--\s*variant:\s*(.+?)\s*$")
_FRAGMENT = re.compile(r"\{([a-z_][a-z0-9_]*)(?::([a-z_][a-z0-9_]*))?\}")
_SECTION = re.compile(r"/\*IF ([A-Z_]+)\*/(.*?)(?:/\*ELSE\*/(.*?))?/\*END\*/", re.DOTALL)
_FLAG_TEST = re.compile(r"/\*IF ([A-Z_]+)\*/")

#: The column-list fragments built from JOB_COLUMNS; the live row adds the
#: engine's ``no_history`` fragment.
_COLUMN_LISTS: dict[str, tuple[str, ...]] = {
    "job_columns_live": JOB_COLUMNS_LIVE,
    "job_columns_history": JOB_COLUMNS,
}


#: The job columns that hold times. An engine whose driver converts a column by
#: its declared type (SQLite under Django parses ``datetime`` columns, and raises
#: for a stored text that looks like a time but is not one) defines the fragment
#: ``read_time``: an operator written before each time column of a select list
#: (``+``, SQLite's no-op), so the value reaches the decoder as stored and a bad
#: one is that row's ``decode_error`` rather than a failed read.
TIME_COLUMNS = frozenset(
    {
        "scheduled_at", "attempted_at", "expires_at", "cancel_requested_at", "created_at",
        "lease_expires_at", "lease_renewed_at", "erased_at", "finalized_at",
    }
)  # fmt: skip


def _columns(names: tuple[str, ...], alias: str | None, read_time: str | None = None) -> str:
    """Write a column list, each name qualified by ``alias`` when given; with
    ``read_time``, a select list whose time columns are read through it."""
    prefix = f"{alias}." if alias else ""
    if read_time is None:
        return ", ".join(prefix + name for name in names)
    return ", ".join(
        f"{read_time}{prefix}{name} AS {name}" if name in TIME_COLUMNS else prefix + name
        for name in names
    )


def _read_time(m: re.Match[str], fragments: dict[str, str]) -> str | None:
    """Return the engine's ``read_time`` operator for a column list that is read (a
    select or returning list), None for a target list (``INSERT INTO t (...)``)."""
    if "read_time" not in fragments or m.string[: m.start()].rstrip().endswith("("):
        return None
    return fragments["read_time"]


def _expand(text: str, fragments: dict[str, str]) -> str:
    """Replace every fragment reference in ``text``; leave other brace words alone."""

    def one(m: re.Match[str]) -> str:
        name, alias = m.group(1), m.group(2)
        if name in _COLUMN_LISTS:
            return _columns(_COLUMN_LISTS[name], alias, _read_time(m, fragments))
        if name == "job_columns":
            if "no_history" not in fragments:
                raise ValueError("{job_columns} needs the engine's fragment no_history")
            read_time = _read_time(m, fragments)
            return f"{_columns(JOB_COLUMNS_LIVE, alias, read_time)}, {fragments['no_history']}"
        if name in fragments:
            if alias:
                raise ValueError(f"fragment {name!r} takes no alias")
            return fragments[name]
        return m.group(0)

    # A fragment may use others (and the column lists): expand until nothing changes.
    for _ in range(8):
        expanded = _FRAGMENT.sub(one, text)
        if expanded == text:
            if any(m.group(1) in fragments for m in _FRAGMENT.finditer(text)):
                break  # a fragment that expands to itself
            return text
        text = expanded
    raise ValueError("fragments nest too deep (or use themselves)")


def _strip(body: str) -> str:
    """Drop comment-only lines so the text sent to the server stays small."""
    lines = [ln for ln in body.splitlines() if not ln.strip().startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


def _render(text: str, flags: frozenset[str]) -> str:
    """Resolve the ``/*IF FLAG*/`` sections of a query for one set of flags."""
    text = _SECTION.sub(lambda m: m.group(2) if m.group(1) in flags else (m.group(3) or ""), text)
    return "\n".join(ln for ln in text.splitlines() if ln.strip())


def _variants(name: str, body: str, text: str) -> dict[str, frozenset[str]]:
    """Return a block's variants and their flags, ``{name: flags}``, checked
    against the sections of ``text`` (the block with its fragments expanded)."""
    variants: dict[str, frozenset[str]] = {}
    for line in body.splitlines():
        m = _VARIANT.match(line.strip())
        if m:
            vname, *flags = shlex.split(m.group(1))
            if not vname.startswith(f"{name}.") or not flags:
                raise ValueError(f"variant {vname!r} of {name!r}: name it {name}.<part> FLAG...")
            variants[vname] = frozenset(flags)
    tested = set(_FLAG_TEST.findall(text))
    declared = set().union(*variants.values()) if variants else set()
    if tested != declared:
        raise ValueError(
            f"query {name!r}: flags tested {sorted(tested)} but declared {sorted(declared)}"
        )
    return variants


def _blocks(text: str) -> list[tuple[str, str, str]]:
    """Split a ``.sql`` file's text into ``(kind, name, body)`` blocks."""
    marks = list(_BLOCK.finditer(text))
    return [
        (
            m.group(1),
            m.group(2),
            text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else None],
        )
        for i, m in enumerate(marks)
    ]


def _fragments(blocks: list[tuple[str, str, str]], known: dict[str, str]) -> dict[str, str]:
    """Add the fragment blocks to ``known``; a name defined twice is an error."""
    frags = dict(known)
    for kind, name, body in blocks:
        if kind == "fragment":
            if name in frags or name in _COLUMN_LISTS or name == "job_columns":
                raise ValueError(f"fragment {name!r} is defined twice")
            frags[name] = _strip(body)
    return frags


def _queries(blocks: list[tuple[str, str, str]], frags: dict[str, str]) -> dict[str, str]:
    """Build ``{name: query}`` from the query blocks, every variant included."""
    out: dict[str, str] = {}
    for kind, name, body in blocks:
        if kind != "name":
            continue
        text = _expand(_strip(body), frags)
        variants = _variants(name, body, text)
        for qname, flags in {name: frozenset[str](), **variants}.items():
            if qname in out:
                raise ValueError(f"query {qname!r} is defined twice")
            out[qname] = _render(text, flags).strip()
    return out


def parse(text: str, fragments: dict[str, str] | None = None) -> dict[str, str]:
    """Split one ``.sql`` file's text into ``{name: query}``, substitutions made.

    ``fragments`` are fragments defined elsewhere; the file's own are added.
    """
    blocks = _blocks(text)
    return _queries(blocks, _fragments(blocks, fragments or {}))


@cache
def load(engine_dir: str) -> dict[str, str]:
    """Load every ``queries/*.sql`` file of an engine folder, substitutions made.

    A fragment may be used in any file of the engine, whichever file defines it.
    """
    files = [
        (p.name, _blocks(p.read_text()))
        for p in sorted((Path(engine_dir) / "queries").glob("*.sql"))
    ]
    frags: dict[str, str] = {}
    for _name, blocks in files:
        frags = _fragments(blocks, frags)
    out: dict[str, str] = {}
    for fname, blocks in files:
        for name, sql in _queries(blocks, frags).items():
            if name in out:
                raise ValueError(f"query {name!r} is defined twice ({fname})")
            out[name] = sql
    return out


def base_names(queries: dict[str, str]) -> set[str]:
    """Return the query names without their ``.part`` suffixes."""
    return {name.split(".", 1)[0] for name in queries}
