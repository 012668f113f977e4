"""Job methods of the PostgreSQL engine.

The hot paths (insert, claim, finalize) are one statement each; see
``queries/jobs.sql``. Operator actions that need several statements run in
one atomic block, and raise their hopper exceptions only after it has ended,
so that a caller's surrounding transaction stays usable.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.db import transaction
from psycopg.types.json import JsonbBinaryDumper

from django_hopper.engine.decode import as_stored, runnable
from django_hopper.engine.params import (
    JobClaimParams,
    JobClaimResult,
    JobDiscardExpiredParams,
    JobFinalized,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
    JobInsertResult,
    JobListParams,
    JobRecordProgressParams,
    JobRescueParams,
    JobReturnManyParams,
    JobScheduleParams,
    RescueCandidate,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import QUERIES, PostgresSupport, db_errors
from django_hopper.engine.postgres.workflows import attach_dependencies, jobs_finished
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.exceptions import (
    DatabaseError,
)
from django_hopper.ids import new_ids
from django_hopper.types import (
    CHANNEL_DONE,
    CHANNEL_INSERT,
    FINAL_STATES,
    LIVE_STATES,
    AttemptLog,
    ConflictAction,
    JobID,
    JobRow,
    JobState,
    Progress,
)

#: How often an insert re-reads unique keys whose holder vanished between the
#: insert and the read (finalized by a concurrent transaction) before giving up.
_UNIQUE_ROUNDS = 5

_NO_DELAY = dt.timedelta(0)

#: Claims of at most this many jobs have their limit written into the statement
#: (one prepared statement per distinct limit, so only small ones).
_LITERAL_LIMIT_MAX = 64
#: Finalizes of more results than this are planned for their values (an unnamed
#: statement): the generic plan's nested loop compares each job with every
#: result, which costs more than planning (~0.5 ms) beyond a few dozen.
_GENERIC_FINALIZE_MAX = 16
_CLAIM_BY_LIMIT: dict[tuple[str, int], str] = {}


def _claim_sql(limit: int, name: str = "job_claim") -> str:
    """Return the unlimited-path claim, with ``limit`` written in when it is small.

    With ``LIMIT $n`` a parameter, PostgreSQL estimates it at a tenth of the
    rows, so the generic plan looks costlier than a custom one and the claim
    would be planned again on every call (about 1 ms); forcing the generic
    plan takes a ``set_config`` pipelined with the claim, and the pipeline
    costs more than the claim itself. With the limit a literal, the generic
    plan costs what a custom one does, and PostgreSQL settles on it by
    itself after five runs: one statement, one round trip, no planning.
    ``limit`` is a validated integer, never text from outside.
    """
    sql = _CLAIM_BY_LIMIT.get((name, limit))
    if sql is None:
        sql = QUERIES[name]
        if limit <= _LITERAL_LIMIT_MAX:
            literal = str(int(limit))
            sql = sql.replace("%(limit)s", literal).replace("%(scan)s", literal)
            _CLAIM_BY_LIMIT[name, limit] = sql
    return sql


def _insert_one_sql(sql: str) -> str:
    """Return job_insert_many for a single job (every ``enqueue()``), derived from its text.

    The same rules, one input: the ``unnest`` of one-element arrays (each a
    parameter) becomes a one-row ``VALUES`` of scalar parameters, and the
    wake-up needs no ``DISTINCT`` over one queue. psycopg dumps fifteen
    one-element lists slower than it dumps the scalars, and the server runs
    the ``VALUES`` row and the plain wake-up faster than the function scan and
    the hash aggregate: 105 against 90 µs a statement inside a transaction
    (minimum of 25 interleaved rounds of 100).
    """
    m = re.search(r"unnest\((.*?)\)\s+WITH ORDINALITY AS t\((.*?)\)", sql, re.S)
    if m is None:  # pragma: no cover - the text of job_insert_many
        raise AssertionError("job_insert_many no longer unnests its input")
    scalars = re.sub(r"::(\w+)\[\]", r"::\1", m.group(1))
    one = f"{sql[: m.start()]}(VALUES ({scalars}, 1::int8)) AS t({m.group(2)}){sql[m.end() :]}"
    if "SELECT DISTINCT queue FROM inserted" not in one:  # pragma: no cover - same
        raise AssertionError("job_insert_many no longer wakes each queue once")
    return one.replace("SELECT DISTINCT queue FROM inserted", "SELECT queue FROM inserted")


_INSERT_ONE = _insert_one_sql(QUERIES["job_insert_many"])


def _plain(p: JobInsertParams, opts: JobInsertOpts) -> bool:
    """Return whether ``job_insert_many.one`` stores this job as ``job_insert_many`` would.

    True when every field the statement writes as a constant is at its
    default: no schedule, TTL, ordering or partition key, batch, subject,
    tags, metadata or awaiting, the statement's own clock, and wake-ups on.
    """
    return (
        opts.notify
        and opts.now is None
        and p.scheduled_at is None
        and p.ttl is None
        and p.ordering_key is None
        and p.partition_key is None
        and p.batch_id is None
        and p.subject is None
        and not p.tags
        and type(p.metadata) is dict
        and not p.metadata
        and not p.awaited
    )


_COPY_TYPES = [
    "uuid", "text", "text", "text", "int2", "int4", "int4", "timestamptz", "int8", "jsonb",
    "jsonb", "jsonb", "text", "text", "jsonb", "uuid", "timestamptz", "bool", "timestamptz",
    "text",
]  # fmt: skip


class _EncodedJson:
    """The key that registers :class:`_EncodedJsonbDumper` on a COPY's cursor (its oid counts)."""


class _EncodedJsonbDumper(JsonbBinaryDumper):
    """Send JSON text already encoded by the engines' one encoder as binary ``jsonb``.

    COPY would otherwise encode each value again with psycopg's own
    ``json.dumps``, which writes ``NaN`` and lets a NUL through to the
    server: the values are refused by the same rules as every other insert.
    """

    _dumps = staticmethod(str)


_DEFAULT_OPTS = JobInsertOpts()


class JobsMixin(PostgresSupport):
    """Every job method of the contract."""

    # -- insert ---------------------------------------------------------------

    def _job_insert_many(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = _DEFAULT_OPTS
    ) -> list[JobInsertResult]:
        """Insert a batch in one statement; settle unique keys only when the batch has them."""
        if len(params) == 1 and params[0].unique_key is None:
            return [self._insert_one(params[0], opts)]
        ids = convert.job_ids(params)
        if not any(p.unique_key is not None for p in params):
            # The hot path: one statement (wake-ups included), autocommit or the
            # caller's transaction.
            arrays = convert.insert_arrays(params, ids)
            extra = {"now": opts.now, "notify": opts.notify, "channel": CHANNEL_INSERT}
            rows = self._fetchall("job_insert_many", {**arrays, **extra}, prepare=True)
            if len(rows) != len(params):  # pragma: no cover - no unique key, no conflict
                raise DatabaseError(f"inserted {len(rows)} of {len(params)} jobs")
            by_id = {row[0]: row for row in rows}
            return [
                JobInsertResult(convert.inserted_job(p, arrays, i, by_id[job_id]))
                for i, (p, job_id) in enumerate(zip(params, ids, strict=True))
            ]
        with db_errors(), self._atomic():
            return self._insert_unique(params, ids, opts)

    def _insert_one(self, p: JobInsertParams, opts: JobInsertOpts) -> JobInsertResult:
        """Insert one job without a unique key (every ``enqueue()``): one statement.

        A job whose other fields are all at their defaults (:func:`_plain`)
        takes ``job_insert_many.one``, seven parameters; any other, the values
        of :func:`convert.insert_values` in ``_INSERT_ONE``. In ``atomic()`` the
        statement carries the transaction's ``BEGIN`` when it is the first
        (``_fetchall(begin=True)``).
        """
        job_id = p.id if p.id is not None else new_ids(1)[0]
        if _plain(p, opts):
            args = convert.dump_json(p.args, "args")
            plain = {
                "id": job_id,
                "kind": p.kind,
                "queue": p.queue,
                "priority": p.priority,
                "max_attempts": p.max_attempts,
                "args": args,
                "channel": CHANNEL_INSERT,
            }
            rows = self._fetchall("job_insert_many.one", plain, prepare=True, begin=True)
            if len(rows) != 1:  # pragma: no cover - no unique key, no conflict
                raise DatabaseError(f"inserted {len(rows)} of 1 job")
            # The row is built when first read (JobInsertResult), from values
            # that never change: a caller keeping only the ID never pays for it.
            row = partial(
                convert.plain_inserted,
                job_id,
                p.kind,
                p.queue,
                p.priority,
                p.max_attempts,
                rows[0][0],
                args,
            )
            return JobInsertResult(build=row)
        values = convert.insert_values(p, job_id)
        values["now"] = opts.now
        values["channel"] = CHANNEL_INSERT
        values["notify"] = opts.notify
        rows = self._fetchall("job_insert_many", values, sql=_INSERT_ONE, prepare=True, begin=True)
        if len(rows) != 1:  # pragma: no cover - no unique key, no conflict
            raise DatabaseError(f"inserted {len(rows)} of 1 job")
        sent = {"args": [values["args"]], "metadata": [values["metadata"]]}
        return JobInsertResult(convert.inserted_job(p, sent, 0, rows[0]))

    def _insert_unique(
        self, params: Sequence[JobInsertParams], ids: list[JobID], opts: JobInsertOpts
    ) -> list[JobInsertResult]:
        """Insert, then resolve the inputs whose unique key a job already holds.

        The insert's ON CONFLICT waits for an uncommitted holder, so by the
        time it skips an input the holder is committed and the next statement
        reads it. A holder finalized in between is gone from the live table:
        it is then found in history (unique_finished) or the input is inserted
        in the next round. Inputs with unique_finished that were inserted are
        checked against history afterwards, so that a job finalized while the
        insert ran is still found.
        """
        n = len(params)
        results: list[JobInsertResult | None] = [None] * n
        pending = list(range(n))
        for _ in range(_UNIQUE_ROUNDS):
            sub = [params[i] for i in pending]
            sub_ids = [ids[i] for i in pending]
            arrays = convert.insert_arrays(sub, sub_ids)
            # Each round's insert wakes the workers of the queues it inserted
            # available jobs into, in the same statement (at commit). A job it
            # inserts and then undoes (a finished duplicate) costs one spurious
            # wake-up, which finds nothing more to claim: cheaper than a
            # statement of its own for the wake-ups.
            values = {**arrays, "now": opts.now, "notify": opts.notify, "channel": CHANNEL_INSERT}
            rows = self._fetchall("job_insert_many", values, prepare=True, begin=True)
            returned = {row[0]: row for row in rows}
            inserted = {
                job_id: convert.inserted_job(p, arrays, k, returned[job_id])
                for k, (p, job_id) in enumerate(zip(sub, sub_ids, strict=True))
                if job_id in returned
            }
            missing: list[int] = []
            for i in pending:
                job = inserted.get(ids[i])
                if job is None:
                    missing.append(i)
                else:
                    results[i] = JobInsertResult(job)
            holders = self._unique_holders([params[i] for i in missing], opts) if missing else {}
            unresolved: list[int] = []
            for i in missing:
                holder = holders.get((params[i].kind, params[i].unique_key))
                if holder is None:
                    unresolved.append(i)
                else:
                    results[i] = JobInsertResult(holder, duplicate=True)
            check = [
                i
                for i in pending
                if params[i].unique_finished and (ids[i] in inserted or i in unresolved)
            ]
            if check:
                finished = self._finished_duplicates([params[i] for i in check])
                undo: list[JobID] = []
                for pos, job in finished.items():
                    i = check[pos]
                    if ids[i] in inserted:
                        undo.append(ids[i])
                    else:
                        unresolved.remove(i)
                    results[i] = JobInsertResult(job, duplicate=True)
                if undo:
                    self._execute("job_insert_many.undo", {"ids": undo})
            pending = unresolved
            if not pending:
                return [r for r in results if r is not None]
        raise DatabaseError(
            f"could not settle the unique keys of {len(pending)} job(s): their holders kept "
            "changing while the insert ran"
        )

    def _unique_holders(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts
    ) -> dict[tuple[str, str | None], JobRow]:
        """Read (or, with REPLACE, overwrite and read) the live jobs holding these keys."""
        if opts.on_conflict == ConflictAction.REPLACE:
            rows = self._fetchall(
                "job_insert_many.replace",
                {
                    "kind": [p.kind for p in params],
                    "unique_key": [p.unique_key for p in params],
                    "priority": [p.priority for p in params],
                    "max_attempts": [p.max_attempts for p in params],
                    "scheduled_at": [p.scheduled_at for p in params],
                    "args": [convert.dump_json(p.args, "args") for p in params],
                    "metadata": [convert.dump_json(p.metadata, "metadata") for p in params],
                    "now": opts.now,
                },
            )
        else:
            rows = self._fetchall(
                "job_insert_many.existing",
                {"kind": [p.kind for p in params], "unique_key": [p.unique_key for p in params]},
            )
        return {(row[COL.kind], row[COL.unique_key]): job_from_row(row) for row in rows}

    def _finished_duplicates(self, params: Sequence[JobInsertParams]) -> dict[int, JobRow]:
        """Return, by position in ``params``, the newest history job each input duplicates."""
        rows = self._fetchall(
            "job_insert_many.finished",
            {
                "kind": [p.kind for p in params],
                "unique_key": [p.unique_key for p in params],
                "states": [",".join(p.unique_finished) for p in params],
            },
        )
        return {row[0] - 1: job_from_row(row[1:]) for row in rows}

    def _job_insert_copy(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = _DEFAULT_OPTS
    ) -> list[JobInsertResult]:
        """Bulk-load jobs with COPY: IDs made here, database now read once, rows built here."""
        ids = convert.job_ids(params)
        # Encoded before the COPY starts: a value the encoder refuses writes nothing.
        encoded = [
            (
                convert.dump_json(p.args, "args"),
                convert.dump_json(p.metadata, "metadata"),
                convert.dump_json(list(p.tags), "tags"),
            )
            for p in params
        ]
        with db_errors(), self._atomic():
            now = opts.now or self.now()
            jobs: list[JobRow] = []
            with (
                self.connection.cursor() as cursor,
                cursor.cursor.copy(QUERIES["job_insert_copy"]) as copy,
            ):
                cursor.cursor.adapters.register_dumper(_EncodedJson, _EncodedJsonbDumper)
                copy.set_types(_COPY_TYPES)
                for job_id, p, (args, metadata, tags_json) in zip(
                    ids, params, encoded, strict=True
                ):
                    scheduled_at = p.scheduled_at or now
                    state = JobState.SCHEDULED if scheduled_at > now else JobState.AVAILABLE
                    expires_at = now + p.ttl if p.ttl else None
                    tags = list(p.tags)
                    copy.write_row(
                            (
                                job_id, p.kind, p.queue, state, p.priority, 0, p.max_attempts,
                                scheduled_at, 0, args, metadata, "[]", p.ordering_key,
                                p.partition_key, tags_json, p.batch_id, expires_at, p.awaited,
                                now, p.subject,
                            )
                        )  # fmt: skip
                    jobs.append(
                        JobRow(
                            id=job_id,
                            kind=p.kind,
                            queue=p.queue,
                            state=state,
                            priority=p.priority,
                            attempt=0,
                            max_attempts=p.max_attempts,
                            scheduled_at=scheduled_at.astimezone(dt.UTC),
                            created_at=now,
                            args=as_stored(p.args, args, convert.load_json),
                            metadata=as_stored(p.metadata, metadata, convert.load_json),
                            ordering_key=p.ordering_key,
                            partition_key=p.partition_key,
                            tags=tags,
                            batch_id=p.batch_id,
                            expires_at=expires_at,
                            awaited=p.awaited,
                            subject=p.subject,
                        )
                    )
        return [JobInsertResult(job) for job in jobs]

    # -- claim and schedule ---------------------------------------------------

    def _job_claim(self, params: JobClaimParams) -> JobClaimResult:
        """Claim up to ``limit`` jobs of a queue in one statement (SKIP LOCKED)."""
        # The unlimited path; the limited one is QueuesMixin._job_claim_limited (queues.py).
        return self._claim_rows(params, self._claim_statement("job_claim", params))

    def _job_claim_keyless(self, params: JobClaimParams) -> JobClaimResult | None:
        """Claim as ``_job_claim`` does, without the ordering-key CTEs; None when
        the queue has keyed candidates (the one row returned says so, no job)."""
        rows = self._claim_statement("job_claim.keyless", params)
        if len(rows) == 1 and rows[0][0] is None:
            # No job claimed: the row only carries the probe's answer.
            if rows[0][-1]:
                return None
            rows = []
        return self._claim_rows(params, rows)

    def _claim_statement(self, name: str, params: JobClaimParams) -> list[tuple[Any, ...]]:
        """Run one of the unlimited path's claim statements; return its rows."""
        total = params.limit + params.ahead
        return self._fetchall(
            name,
            {"queue": params.queue, "client_id": params.client_id, "limit": total,
             "scan": total, "free": params.limit, "now": params.now},
            sql=_claim_sql(total, name),
            prepare=True,
            generic_plan=total > _LITERAL_LIMIT_MAX,
        )  # fmt: skip

    def _claim_rows(self, params: JobClaimParams, rows: list[tuple[Any, ...]]) -> JobClaimResult:
        """Build the claim's result from its rows (job columns, then ``ahead``)."""
        claimed = [job_from_row(row) for row in rows]
        ahead = frozenset(j.id for j, row in zip(claimed, rows, strict=True) if row[JOB_WIDTH])
        jobs = runnable(self, params, claimed)
        return JobClaimResult(jobs=attach_dependencies(self, jobs), ahead=ahead)

    def _job_return_many(self, params: JobReturnManyParams) -> list[tuple[JobID, str]]:
        """Give back claimed-ahead jobs in one statement, in ID order (lock order)."""
        pairs = sorted(params.jobs)
        rows = self._fetchall(
            "job_return_many",
            {"id": [i for i, _ in pairs], "fence": [f for _, f in pairs],
             "client_id": params.client_id, "now": params.now},
        )  # fmt: skip
        return [(row[0], row[1]) for row in rows]

    def _job_schedule(self, params: JobScheduleParams) -> tuple[int, list[str]]:
        """Promote due scheduled and retryable jobs; say which queues got them."""
        row = self._fetchone(
            "job_schedule", {"queue": params.queue, "limit": params.limit, "now": params.now}
        )
        return (int(row[0]), list(row[1])) if row else (0, [])

    # -- finalize and progress ------------------------------------------------

    def _job_finalize_many(self, params: JobFinalizeParams) -> list[JobFinalized]:
        """Apply a batch of results in one statement, each fenced to its claim."""
        keep_logs = params.keep_logs
        # Two results with the same job and fence are one result twice: keep the first.
        seen: set[tuple[JobID, int]] = set()
        results = []
        for f in params.jobs:
            if (f.id, f.fence) not in seen:
                seen.add((f.id, f.fence))
                results.append(f)
        if params.no_batches and all(
            f.state == JobState.COMPLETED
            and f.archive
            and f.log is None
            and f.error is None
            and not f.snooze
            and f.lease_token is None
            and f.delay >= _NO_DELAY
            for f in results
        ):
            # The common batch: a much smaller statement, same semantics.
            values: dict[str, Any] = {
                "id": convert.uuid_array([f.id for f in results]),
                "attempted_by": convert.int_array([f.attempted_by for f in results]),
                "fence": convert.int_array([f.fence for f in results]),
                "output": convert.text_array(
                    [
                        None if f.output is None else convert.dump_json(f.output, "output")
                        for f in results
                    ]
                ),
                "now": params.now,
                "done_channel": CHANNEL_DONE,
            }
            name = "job_finalize_many.completed"
            name += ".skip_locked" if params.skip_locked else ""
            rows = self._fetchall(
                name, values, prepare=True, plan_each=len(results) > _GENERIC_FINALIZE_MAX
            )
            return [JobFinalized(id=row[0], fence=row[1]) for row in rows]
        name = "job_finalize_many"
        name += ".skip_locked" if params.skip_locked else ""
        values = {
            **convert.finalize_arrays(results),
            "now": params.now,
            "done_channel": CHANNEL_DONE,
            "has_logs": any(f.log is not None for f in results),
            "has_snooze": any(f.snooze for f in results),
            "has_dropped": any(f.state == JobState.COMPLETED and not f.archive for f in results),
            "trim_logs": keep_logs > 0 and any(f.log is not None for f in results),
            "keep_logs": keep_logs,
            # Batch and workflow bookkeeping; skipped when no job has a batch.
            "batches": not params.no_batches,
            "insert_channel": CHANNEL_INSERT,
        }
        rows = self._fetchall(
            name, values, prepare=True, plan_each=len(results) > _GENERIC_FINALIZE_MAX
        )
        return [JobFinalized(id=row[0], fence=row[1]) for row in rows]

    def _job_record_progress(self, params: JobRecordProgressParams) -> Progress | None:
        """Store a running attempt's progress, fenced to its claim and attempt."""
        values = {
            "id": params.id,
            "attempted_by": params.attempted_by,
            "fence": params.fence,
            "attempt": params.attempt,
            "lease_token": params.lease_token,
            "keep_step": bool(params.keep_step),
            "step": params.step or "",
            "cursor": convert.dump_json(params.cursor, "cursor"),
            "now": params.now,
        }
        if not params.no_wait:
            row = self._fetchone("job_record_progress", values, prepare=True)
        elif self.connection.in_atomic_block:
            # A refused lock aborts the transaction; a savepoint keeps the caller's usable.
            with transaction.atomic(using=self.alias, savepoint=True):
                row = self._fetchone("job_record_progress.no_wait", values, prepare=True)
        else:
            row = self._fetchone("job_record_progress.no_wait", values, prepare=True)
        if row is None:
            return None
        return Progress.from_json(convert.load_json(row[0]))

    # -- reads ----------------------------------------------------------------

    def _job_get(self, id: JobID) -> JobRow | None:
        """Return a job, live first, then from history."""
        row = self._fetchone("job_get", {"id": id})
        return job_from_row(row) if row else None

    def _job_logs(self, id: JobID) -> list[AttemptLog]:
        """Return a job's attempt logs, oldest first."""
        return [convert.log_from_row(row) for row in self._fetchall("job_logs", {"id": id})]

    def _job_list(self, params: JobListParams) -> list[JobRow]:
        """List live and history jobs together, in ID order, in one query."""
        limit = params.limit
        states = list(params.states) or None
        values = {
            "live": states is None or any(s in LIVE_STATES for s in states),
            "history": states is None or any(s in FINAL_STATES for s in states),
            "queue": params.queue,
            "kinds": list(params.kinds) or None,
            "states": states,
            "ordering_key": params.ordering_key,
            "after": params.after,
            "ids": list(params.ids) or None,
            "priorities": list(params.priorities) or None,
            "tags_any": list(params.tags_any) or None,
            "tags_all": list(params.tags_all) or None,
            "metadata": (
                None if params.metadata is None else convert.dump_json(params.metadata, "metadata")
            ),
            "limit": limit,
        }
        name = "job_list.newest_first" if params.newest_first else "job_list"
        return [job_from_row(row) for row in self._fetchall(name, values)]

    # -- operator actions -----------------------------------------------------

    def _job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]:
        """Move waiting jobs past their TTL to history as discarded."""
        with db_errors(), self._atomic():
            rows = self._fetchall("job_discard_expired", {"limit": params.limit, "now": params.now})
            jobs = [job_from_row(row) for row in rows]
            jobs_finished(self, jobs)
        return jobs

    def _job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]:
        """List running jobs whose client is gone, or that have run too long."""
        stuck_after = params.stuck_after if params.stuck_after > dt.timedelta(0) else None
        rows = self._fetchall(
            "job_rescue_candidates",
            {"stuck_after": stuck_after, "limit": params.limit, "now": params.now},
        )
        return [
            RescueCandidate(
                job=job_from_row(row), stuck=bool(row[JOB_WIDTH]), ahead=bool(row[JOB_WIDTH + 1])
            )
            for row in rows
        ]
