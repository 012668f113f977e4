"""Small server-rendered SVG drawings: a workflow's graph and the overview's bar charts.

No JavaScript and nothing fetched from elsewhere: the page carries its
pictures, escaped like any other text.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper.admin.common import admin_url
from django_hopper.types import JobID, WorkflowRow

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 170, 34, 50, 12, 6


def levels(ids: Sequence[JobID], edges: Sequence[tuple[JobID, JobID]]) -> dict[JobID, int]:
    """Return each job's column: the length of the longest chain of jobs it runs after."""
    after: dict[JobID, list[JobID]] = {i: [] for i in ids}
    for job, depends_on in edges:
        if job in after and depends_on in after:
            after[job].append(depends_on)
    level: dict[JobID, int] = {}

    def depth(i: JobID, seen: frozenset[JobID]) -> int:
        if i in level:
            return level[i]
        if i in seen:  # a cycle cannot be inserted; draw it flat rather than recurse forever
            return 0
        d = max((depth(p, seen | {i}) + 1 for p in after[i]), default=0)
        level[i] = d
        return d

    for i in ids:
        depth(i, frozenset())
    return level


def dag_svg(wf: WorkflowRow) -> SafeString:
    """Draw the workflow left to right: a column per depth, a box per step, a line per edge."""
    ids = [j.id for j in wf.jobs]
    if not ids:
        return mark_safe("-")
    level = levels(ids, [(e.job, e.depends_on) for e in wf.edges])
    rows: dict[int, int] = {}
    at: dict[JobID, tuple[int, int]] = {}
    for i in ids:
        col = level[i]
        row = rows.get(col, 0)
        rows[col] = row + 1
        at[i] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    width = PAD * 2 + (max(rows) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values()) * (NODE_H + GAP_Y) - GAP_Y
    lines = format_html_join(
        "",
        '<line x1="{}" y1="{}" x2="{}" y2="{}" marker-end="url(#hopper-arrow)"/>',
        (
            (
                at[e.depends_on][0] + NODE_W,
                at[e.depends_on][1] + NODE_H // 2,
                at[e.job][0] - 2,
                at[e.job][1] + NODE_H // 2,
            )
            for e in wf.edges
            if e.job in at and e.depends_on in at
        ),
    )
    nodes = format_html_join(
        "",
        '<a href="{}"><g><title>{} ({})</title><rect class="{}" x="{}" y="{}" width="{}" '
        'height="{}"/><text x="{}" y="{}">{}</text><text x="{}" y="{}">{}</text></g></a>',
        (
            (
                admin_url("job", "find", j.id),
                wf.steps.get(j.id) or j.kind,
                j.state,
                j.state,
                at[j.id][0],
                at[j.id][1],
                NODE_W,
                NODE_H,
                at[j.id][0] + 6,
                at[j.id][1] + 14,
                (wf.steps.get(j.id) or j.kind.rsplit(".", 1)[-1])[:26],
                at[j.id][0] + 6,
                at[j.id][1] + 28,
                j.state,
            )
            for j in wf.jobs
        ),
    )
    return format_html(
        '<svg class="hopper-dag" role="img" aria-label="workflow graph" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg"><defs><marker '
        'id="hopper-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>'
        "{}{}</svg>",
        width,
        height,
        width,
        height,
        lines,
        nodes,
    )


def bar_chart(
    ok: Sequence[int], bad: Sequence[int], width: int = 150, height: int = 30, label: str = ""
) -> SafeString:
    """Draw per-interval counts as stacked bars (finished fine below, failed on top)."""
    buckets = max(len(ok), len(bad), 1)
    peak = max((a + b for a, b in zip(ok, bad, strict=False)), default=0) or 1
    step = width / buckets
    bars = []
    for n, (a, b) in enumerate(zip(ok, bad, strict=False)):
        x = round(n * step, 1)
        w = max(round(step - 1, 1), 1)
        ha = round(a / peak * (height - 2), 1)
        hb = round(b / peak * (height - 2), 1)
        if a:
            bars.append(("ok", x, round(height - ha, 1), w, ha))
        if b:
            bars.append(("bad", x, round(height - ha - hb, 1), w, hb))
    rects = format_html_join("", '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>', bars)
    return format_html(
        '<svg class="hopper-chart" role="img" aria-label="{}" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg"><title>{}</title>{}</svg>',
        label,
        width,
        height,
        width,
        height,
        label,
        rects,
    )
