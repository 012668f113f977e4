"""Workflows: a DAG of jobs enqueued atomically, each step running once all the
steps it comes after have finished, reading their outputs if it asks to.

::

    wf = Workflow("import-42")
    fetch = wf.add(fetch_page.using(queue="io"), url, step="fetch")
    parse = wf.add(parse_page, after=[fetch], reads=[fetch], step="parse")
    wf.add(index, after=[parse], on_failure="run")
    wf.on_complete(notify_done, import_id=42)
    handle = wf.enqueue()            # inside the caller's transaction

Inside a job declared ``takes_context=True``, ``context.dependency_output("fetch")``
returns what the ``fetch`` step returned.

When a dependency is canceled or discarded, the edge's ``on_failure`` decides
(:class:`~django_hopper.types.DependencyFailure`): ``"cancel"`` (the
default) cancels the dependent and so on down the graph, ``"discard"``
discards it, ``"run"`` runs it anyway (it sees the failed state among its
dependencies when it reads them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_hopper import signals, topology
from django_hopper.api import parse_job_id
from django_hopper.batches import call_params
from django_hopper.engine import get_engine
from django_hopper.engine.params import JobDependency, WorkflowInsertParams
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.jobs import JobHandle
from django_hopper.types import DependencyFailure
from django_hopper.validation import json_normalize

if TYPE_CHECKING:
    from django_hopper.engine.params import JobInsertParams
    from django_hopper.jobs import JobFunction, JobHandle, PreparedJob
    from django_hopper.types import WorkflowRow

__all__ = ["Node", "Workflow", "WorkflowHandle", "get_workflow"]


@dataclass(slots=True)
class Node:
    """One step of a workflow under construction (what ``Workflow.add`` returns)."""

    workflow: Workflow
    index: int
    step: str | None
    params: JobInsertParams
    #: (dependency index, on_failure, reads)
    edges: list[tuple[int, str, bool]] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<Node {self.step or self.index} of {self.workflow.name}>"


class WorkflowHandle:
    """What ``Workflow.enqueue`` returns: the workflow's ID and its jobs' handles."""

    def __init__(
        self, id: uuid.UUID, jobs: list[JobHandle], steps: Mapping[str, JobHandle], alias: str
    ) -> None:
        self.id = id
        self.jobs = jobs
        #: Handles of the named steps, by name.
        self.steps = dict(steps)
        self._alias = alias

    def __getitem__(self, step: str) -> JobHandle:
        return self.steps[step]

    def refresh(self) -> WorkflowRow:
        """Read the workflow: its batch progress, jobs and edges."""
        return get_workflow(self.id, alias=self._alias)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id} ({len(self.jobs)} jobs)>"


class Workflow:
    """A DAG of jobs under construction; nothing is written before ``enqueue``."""

    def __init__(self, name: str, *, metadata: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidJob(f"a workflow needs a name, not {name!r}", field="name")
        self.name = name
        self.metadata = dict(metadata or {})
        self.nodes: list[Node] = []
        self._steps: dict[str, Node] = {}
        self._callbacks: dict[str, JobInsertParams] = {}

    def _resolve(self, ref: Node | str, field: str) -> Node:
        """Return the node a reference names, refusing one outside this workflow."""
        if isinstance(ref, Node):
            if ref.workflow is not self:
                raise InvalidJob(
                    f"{field}: {ref!r} belongs to workflow {ref.workflow.name!r}, not "
                    f"{self.name!r}; an edge must join two jobs of the same workflow",
                    field=field,
                )
            return ref
        if isinstance(ref, str):
            node = self._steps.get(ref)
            if node is None:
                raise InvalidJob(
                    f"{field}: no step named {ref!r} in workflow {self.name!r} (add it first)",
                    field=field,
                )
            return node
        raise InvalidJob(f"{field} must name a step or a node, not {ref!r}", field=field)

    def add(
        self,
        fn: JobFunction[Any, Any] | PreparedJob | str,
        /,
        *args: Any,
        step: str | None = None,
        after: Iterable[Node | str] = (),
        reads: Iterable[Node | str] = (),
        on_failure: str | Mapping[str, str] = "cancel",
        **kwargs: Any,
    ) -> Node:
        """Add a job that runs after ``after`` (and ``reads``, which it also reads).

        ``fn`` is a job function with its arguments, or a prepared job
        (``fn.using(...).prepare(...)``), which carries its own.

        ``on_failure`` is one policy for every edge, or a mapping from a
        dependency's step name to its policy (the others cancel).
        """

        index = len(self.nodes)
        params = call_params(fn, args, kwargs, f"steps[{step or index}]")
        if step is not None and (not isinstance(step, str) or not step):
            raise InvalidJob(f"step must be a non-empty string, not {step!r}", field="step")
        if step is not None and step in self._steps:
            raise InvalidJob(
                f"step name {step!r} is used twice in workflow {self.name!r}", field="step"
            )
        if params.unique_key is not None:
            raise InvalidJob(
                f"step {step or index}: workflow jobs cannot have a unique key (a skipped "
                "duplicate would leave its dependents waiting forever)",
                field="unique_key",
            )
        policies = [on_failure] if isinstance(on_failure, str) else list(on_failure.values())
        for policy in policies:
            if policy not in DependencyFailure.values():
                words = ", ".join(DependencyFailure.values())
                raise InvalidJob(
                    f"on_failure must be one of {words}, not {policy!r}", field="on_failure"
                )
        read_nodes = [self._resolve(r, "reads") for r in reads]
        deps: dict[int, Node] = {n.index: n for n in [self._resolve(a, "after") for a in after]}
        deps.update({n.index: n for n in read_nodes})
        read_ix = {n.index for n in read_nodes}
        if not isinstance(on_failure, str):
            # A key naming no dependency would be ignored, and the edge it
            # meant to set would silently cancel instead.
            dep_steps = {d.step for d in deps.values() if d.step}
            for key in on_failure:
                if key not in dep_steps:
                    raise InvalidJob(
                        f"step {step or index}: on_failure names {key!r}, which is not one "
                        f"of its dependencies ({', '.join(sorted(dep_steps)) or 'none named'})",
                        field="on_failure",
                    )
        node = Node(self, index, step, params)
        for dep in deps.values():
            if isinstance(on_failure, str):
                policy = on_failure
            else:
                policy = on_failure.get(dep.step or "", DependencyFailure.CANCEL)
            node.edges.append((dep.index, policy, dep.index in read_ix))
        self.nodes.append(node)
        if step is not None:
            self._steps[step] = node
        return node

    def on_success(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job completed."""
        self._callbacks["on_success"] = call_params(fn, args, kwargs, "on_success")

    def on_failure(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job finished and one was canceled or discarded."""
        self._callbacks["on_failure"] = call_params(fn, args, kwargs, "on_failure")

    def on_complete(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job finished, whatever their outcome."""
        self._callbacks["on_complete"] = call_params(fn, args, kwargs, "on_complete")

    def enqueue(self) -> WorkflowHandle:
        """Write the workflow atomically, inside the caller's transaction if there is one."""

        queues = [n.params.queue for n in self.nodes]
        queues += [c.queue for c in self._callbacks.values()]
        engine = get_engine(topology.single_alias(queues, "a workflow"))
        result = engine.workflow_insert(
            WorkflowInsertParams(
                name=self.name,
                jobs=signals.enqueuing(None, [n.params for n in self.nodes]),
                steps=[n.step or "" for n in self.nodes] if self._steps else (),
                deps=[
                    JobDependency(job=n.index, depends_on=d, on_failure=policy, reads=reads)
                    for n in self.nodes
                    for d, policy, reads in n.edges
                ],
                on_success=self._callbacks.get("on_success"),
                on_failure=self._callbacks.get("on_failure"),
                on_complete=self._callbacks.get("on_complete"),
                metadata=json_normalize(self.metadata, "metadata"),
                notify=True,
            )
        )
        if signals.job_enqueued.receivers:
            signals.job_enqueued.send(
                sender=None, jobs=[r.job for r in result.jobs if not r.duplicate], duplicates=[]
            )
        handles = [JobHandle(r.job, alias=engine.alias) for r in result.jobs]
        steps = {n.step: handles[n.index] for n in self.nodes if n.step}
        return WorkflowHandle(result.id, handles, steps, engine.alias)


def get_workflow(workflow_id: uuid.UUID | str, *, alias: str | None = None) -> WorkflowRow:
    """Return a workflow's batch, jobs and edges; raise NotFound if there is none."""

    wid = parse_job_id(workflow_id, "workflow_id")
    row = get_engine(alias).workflow_get(wid)
    if row is None:
        raise NotFound(f"workflow {wid} does not exist")
    return row


def steps_of(nodes: Sequence[Node]) -> list[str]:
    """Return the step names of nodes (unnamed ones by index), for messages."""
    return [n.step or str(n.index) for n in nodes]
