"""Job methods of the SQLite engine.

SQLite runs one writing transaction at a time, so a claim needs no row locks:
the transaction that promotes and claims is the only writer until it ends.
Every batch operation is a fixed number of set-based statements whatever the
batch size, with the batch passed as one JSON parameter.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.db import OperationalError

from django_hopper.engine.decode import runnable
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
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.engine.sqlite.convert import (
    db_time,
    dumps,
    inserted_row,
    job_from_row,
    plain_inserted,
)
from django_hopper.engine.sqlite.support import (
    JSON_CONTAINS,
    Q,
    SQLiteSupport,
    is_locked,
    register_functions,
    translate_errors,
)
from django_hopper.engine.sqlite.workflows import attach_dependencies, finished_of, jobs_finished
from django_hopper.exceptions import (
    NotSupported,
    UniqueConflict,
)
from django_hopper.ids import new_id
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

_FINAL = frozenset(FINAL_STATES)
_LIVE = frozenset(LIVE_STATES)
_STAY_LIVE = frozenset((JobState.RETRYABLE, JobState.SCHEDULED))
_ALL_STATES = _FINAL | _LIVE
_DEFAULT_OPTS = JobInsertOpts()
#: The finalize's statements for a batch of any results, and for a uniform one.
_FINALIZE_MOVE = ("job_finalize_many", "job_finalize_many.uniform")
_FINALIZE_DELETE = ("job_finalize_many.delete", "job_finalize_many.delete.uniform")


def _uniform_batch(by_key: dict[tuple[str, int], Any], first: Any) -> dict[str, Any]:
    """Return the parameters of job_finalize_many's ``.uniform`` variants: each
    result as its job ID's hex digits then its fence, and what they all share."""
    return {
        "results": json.dumps([f"{job_id}{fence}" for job_id, fence in by_key]),
        "client": first.attempted_by,
        "state": str(first.state),
        "archive": 1 if first.archive else 0,
    }


def _claim_key(job: JobRow) -> tuple[int, dt.datetime, int]:
    """Return the claim order of a job: priority first, then schedule, then ID
    (its integer: the UUID's order, compared in C rather than by ``UUID.__lt__``)."""
    return (-job.priority, job.scheduled_at, job.id.int)


def _first_state(
    p: JobInsertParams, now: dt.datetime, now_s: str
) -> tuple[dt.datetime, str, JobState]:
    """Return a new job's scheduled time (value and stored text) and its first state.

    A job due now or earlier starts available, a later one scheduled; the
    stored texts compare in time order, so the comparison needs no decode.
    """
    if p.scheduled_at is None:
        return now, now_s, JobState.AVAILABLE
    sched_s = db_time(p.scheduled_at, "scheduled_at")
    state = JobState.SCHEDULED if sched_s > now_s else JobState.AVAILABLE
    return p.scheduled_at, sched_s, state


def _plain(p: JobInsertParams, tags: list[str], expires: dt.datetime | None) -> bool:
    """Return whether :func:`plain_inserted` builds the row of ``p`` as inserted:
    available now, every field but the arguments at its default."""
    return (
        p.scheduled_at is None
        and expires is None
        and not tags
        and p.ordering_key is None
        and p.partition_key is None
        and p.batch_id is None
        and p.subject is None
        and not p.awaited
        and type(p.metadata) is dict
        and not p.metadata
    )


class JobsMixin(SQLiteSupport):
    """The job half of the engine contract on SQLite."""

    # -- insert ---------------------------------------------------------------

    @translate_errors
    def _job_insert_many(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = _DEFAULT_OPTS
    ) -> list[JobInsertResult]:
        """Insert the batch in one statement; report unique-key holders as duplicates."""
        if len(params) == 1 and params[0].unique_key is None:
            return [self._insert_one(params[0], opts)]
        now, now_s = self._now(opts.now)
        rows: list[list[Any]] = []
        jobs: list[JobRow] = []
        finished: list[list[Any]] = []
        for i, p in enumerate(params):
            job_id = p.id or new_id()
            sched, sched_s, state = _first_state(p, now, now_s)
            expires = None if p.ttl is None else now + p.ttl
            tags = list(p.tags)
            args = dumps(p.args, "args")
            metadata = dumps(p.metadata, "metadata")
            rows.append(
                [
                    job_id.hex,
                    p.kind,
                    p.queue,
                    state,
                    p.priority,
                    p.max_attempts,
                    sched_s,
                    args,
                    metadata,
                    p.unique_key,
                    p.ordering_key,
                    p.partition_key,
                    dumps(tags, "tags") if tags else "[]",
                    p.batch_id.hex if p.batch_id else None,
                    db_time(expires, "ttl") if expires is not None else None,
                    1 if p.awaited else 0,
                    p.subject,
                ]
            )
            jobs.append(
                inserted_row(
                    job_id,
                    p,
                    state,
                    sched,
                    now,
                    tags,
                    expires,
                    args,
                    metadata,
                    errors=[],
                    unique_key=p.unique_key,
                    batch_id=p.batch_id,
                )
            )
            if p.unique_key is not None and p.unique_finished:
                finished.append([i, p.kind, p.unique_key, json.dumps(list(p.unique_finished))])

        results: list[JobInsertResult | None] = [None] * len(params)
        with self._atomic(), self._hot_cursor() as c:
            if finished:
                # Inputs whose key a finished job in the named states holds are not
                # inserted: drop them from the insert, keep the newest such job.
                c.execute(Q["job_insert_many.finished"], {"keys": json.dumps(finished)})
                to_insert: list[list[Any]] = list(rows)
                for r in c.fetchall():
                    i = r[0]
                    if results[i] is None:
                        results[i] = JobInsertResult(job=job_from_row(r[1:]), duplicate=True)
                        to_insert[i] = []
                to_insert = [row for row in to_insert if row]
            else:
                to_insert = rows
            inserted: set[str] = set()
            if to_insert:
                c.execute(Q["job_insert_many"], {"rows": json.dumps(to_insert), "now": now_s})
                inserted = {r[0] for r in c.fetchall()}
            conflicted = [
                i
                for i, p in enumerate(params)
                if p.unique_key is not None and rows[i][0] not in inserted
            ]
            for i, row in enumerate(rows):
                if row[0] in inserted:
                    results[i] = JobInsertResult(job=jobs[i], duplicate=False)
            if conflicted:
                self._insert_conflicts(c, params, rows, conflicted, results, opts, now_s)
        if opts.notify:
            queues = sorted(
                {
                    r.job.queue
                    for r in results
                    if r and not r.duplicate and r.job.state == JobState.AVAILABLE
                }
            )
            if queues:
                self.notify(CHANNEL_INSERT, queues)
        return results  # type: ignore[return-value]

    def _insert_one(self, p: JobInsertParams, opts: JobInsertOpts) -> JobInsertResult:
        """Insert one job without a unique key (every ``enqueue()``): one statement.

        The row ``job_insert_many`` would write for it, its values bound
        directly (``job_insert_many.one``). No transaction of its own: one
        statement is atomic by itself, in autocommit and in the caller's
        transaction alike, and a job without a unique key has nothing to settle.
        """
        now, now_s = self._now(opts.now)
        job_id = p.id or new_id()
        sched, sched_s, state = _first_state(p, now, now_s)
        expires = None if p.ttl is None else now + p.ttl
        tags = list(p.tags)
        args = dumps(p.args, "args")
        metadata = dumps(p.metadata, "metadata")
        values = {
            "id": job_id.hex,
            "kind": p.kind,
            "queue": p.queue,
            "state": state,
            "priority": p.priority,
            "max_attempts": p.max_attempts,
            "scheduled_at": sched_s,
            "args": args,
            "metadata": metadata,
            "ordering_key": p.ordering_key,
            "partition_key": p.partition_key,
            "tags": dumps(tags, "tags") if tags else "[]",
            "batch_id": p.batch_id.hex if p.batch_id else None,
            "expires_at": db_time(expires, "ttl") if expires is not None else None,
            "awaited": 1 if p.awaited else 0,
            "now": now_s,
            "subject": p.subject,
        }
        with self._hot_cursor() as c:
            c.execute(Q["job_insert_many.one"], values)
        if opts.notify and state == JobState.AVAILABLE:
            self.notify(CHANNEL_INSERT, [p.queue])
        if _plain(p, tags, expires):
            # The row is built when first read (JobInsertResult), from values
            # that never change (the arguments as the text written, decoded
            # then): a caller keeping only the ID never pays for it.
            row = partial(
                plain_inserted, job_id, p.kind, p.queue, p.priority, p.max_attempts, now, args
            )
            return JobInsertResult(build=row)
        job = inserted_row(
            job_id,
            p,
            state,
            sched,
            now,
            tags,
            expires,
            args,
            metadata,
            errors=[],
            batch_id=p.batch_id,
        )
        return JobInsertResult(job=job, duplicate=False)

    def _insert_conflicts(
        self,
        c: Any,
        params: Sequence[JobInsertParams],
        rows: list[list[Any]],
        conflicted: list[int],
        results: list[JobInsertResult | None],
        opts: JobInsertOpts,
        now_s: str,
    ) -> None:
        """Resolve inputs that were not inserted: the live holder of the key wins,
        replaced first with ConflictAction.REPLACE; else the finished duplicate stands."""
        if opts.on_conflict == ConflictAction.REPLACE:
            replace = [
                [
                    params[i].kind,
                    params[i].unique_key,
                    rows[i][7],
                    rows[i][8],
                    rows[i][4],
                    rows[i][5],
                    rows[i][6],
                ]
                for i in conflicted
            ]
            c.execute(Q["job_insert_many.replace"], {"rows": json.dumps(replace), "now": now_s})
        keys = [[params[i].kind, params[i].unique_key] for i in conflicted]
        c.execute(Q["job_insert_many.existing"], {"keys": json.dumps(keys)})
        live = {(r[COL.kind], r[COL.unique_key]): r for r in c.fetchall()}
        for i in conflicted:
            row = live.get((params[i].kind, params[i].unique_key))
            if row is not None:
                results[i] = JobInsertResult(job=job_from_row(row), duplicate=True)
            elif results[i] is None:
                # Neither inserted nor held: only a concurrent delete between the
                # statements could do this, which one writer at a time rules out.
                raise UniqueConflict(
                    f"job {params[i].kind!r} with unique key {params[i].unique_key!r} "
                    "was neither inserted nor found"
                )

    def _job_insert_copy(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = _DEFAULT_OPTS
    ) -> list[JobInsertResult]:
        """Refuse: SQLite has no COPY (``supports_copy`` is False)."""
        raise NotSupported("the sqlite engine has no COPY; use job_insert_many")

    # -- claim and schedule ---------------------------------------------------

    @translate_errors
    def _job_claim(self, params: JobClaimParams) -> JobClaimResult:
        """Promote the queue's due jobs and claim the best ones, in one transaction."""
        result = self._claim_unlimited(params, keyless=False)
        # Only the keyless statement reports keyed candidates (None).
        return result if result is not None else JobClaimResult(jobs=[])

    @translate_errors
    def _job_claim_keyless(self, params: JobClaimParams) -> JobClaimResult | None:
        """Claim as ``_job_claim`` does, without the ordering-key CTEs; None, with
        nothing written, when the queue has keyed candidates."""
        return self._claim_unlimited(params, keyless=True)

    def _claim_unlimited(self, params: JobClaimParams, *, keyless: bool) -> JobClaimResult | None:
        """The unlimited claim, through job_claim or (``keyless``) job_claim.keyless."""
        with self._atomic(), self._hot_cursor() as c:
            # Read the clock under the write lock (BEGIN IMMEDIATE), so that
            # database time follows the order in which writers commit.
            _, now_s = self._now(params.now)
            total = params.limit + params.ahead
            args: dict[str, Any] = {
                "queue": params.queue,
                "now": now_s,
                "client_id": params.client_id,
                "limit": total,
                "free": params.limit,
                # The unlimited path; the limited one is QueuesMixin.job_claim (queues.py).
                "scan": total,
                "partition_limit": 0,
                "limited": False,
            }
            c.execute(Q["job_claim.promote"], args)
            c.execute(Q["job_claim.keyless" if keyless else "job_claim"], args)
            rows = c.fetchall()
            if keyless and not rows:
                # Nothing claimed: say whether keyed candidates closed the gate
                # (the write lock is still held, so the answer is the claim's).
                c.execute(Q["job_claim.keys"], {"queue": params.queue})
                keys = c.fetchone()
                if keys is not None and keys[0]:
                    return None
        jobs = [job_from_row(r) for r in rows]
        ahead = frozenset(j.id for j, r in zip(jobs, rows, strict=True) if r[JOB_WIDTH] is not None)
        jobs.sort(key=_claim_key)
        jobs = runnable(self, params, jobs)
        if any(j.batch_id is not None for j in jobs):
            jobs = attach_dependencies(self, jobs)
        return JobClaimResult(jobs=jobs, ahead=ahead)

    @translate_errors
    def _job_return_many(self, params: JobReturnManyParams) -> list[tuple[JobID, str]]:
        """Give back claimed-ahead jobs in one statement."""
        _, now_s = self._now(params.now)
        pairs = json.dumps([[i.hex, f] for i, f in params.jobs])
        with self._cursor() as c:
            c.execute(
                Q["job_return_many"],
                {"jobs": pairs, "client_id": params.client_id, "now": now_s},
            )
            return [(uuid.UUID(hex=r[0]), r[1]) for r in c.fetchall()]

    @translate_errors
    def _job_schedule(self, params: JobScheduleParams) -> tuple[int, list[str]]:
        """Make due scheduled and retryable jobs available; say which queues got them."""
        _, now_s = self._now(params.now)
        with self._cursor() as c:
            c.execute(
                Q["job_schedule"], {"now": now_s, "queue": params.queue, "limit": params.limit}
            )
            queues = [r[0] for r in c.fetchall()]
        return len(queues), queues

    # -- finalize and progress -----------------------------------------------

    @translate_errors
    def _job_finalize_many(self, params: JobFinalizeParams) -> list[JobFinalized]:
        """Apply a batch of results, each fenced to its claim, in one transaction.

        The batch is checked and encoded before the transaction, so the write
        lock is held for the statements alone; only what carries the time (a
        retry's or snooze's schedule, an error's ``at``) is stamped under it,
        in commit order with every other writer's.
        """
        by_key, batch, timed = self._finalize_batch(params)
        if params.skip_locked:
            with self._hot_cursor() as c, self._short_lock_wait(c, "job_finalize_many"):
                try:
                    with self._atomic(savepoint=True):
                        args, now_s = self._finalize_args(params, by_key, batch, timed)
                        return self._finalize(c, args, by_key, params, now_s)
                except (OperationalError, sqlite3.OperationalError) as exc:
                    if is_locked(exc):
                        return []
                    raise
        with self._atomic(), self._hot_cursor() as c:
            args, now_s = self._finalize_args(params, by_key, batch, timed)
            applied = self._finalize(c, args, by_key, params, now_s)
        self._checkpoint_after(len(by_key))
        return applied

    def _finalize_batch(
        self, params: JobFinalizeParams
    ) -> tuple[dict[tuple[str, int], Any], list[list[Any]] | str | dict[str, Any], list[int]]:
        """Check and encode the results: return them by (id, fence), the batch
        parameter and the indexes of the rows that carry the time (see
        job_finalize_many).

        The batch is the parameters of job_finalize_many's ``.uniform`` variants
        (a dict) when every result is a final one of the same client, state and
        archive flag, with no job lease, error or output; else JSON text when
        nothing in it carries the time, else the rows.
        """
        by_key: dict[tuple[str, int], Any] = {}
        first: Any = None
        uniform = True
        for f in params.jobs:
            key = (f.id.hex, f.fence)
            if key in by_key:
                continue  # of two results of one claim, at most one applies
            by_key[key] = f
            if not uniform:
                continue
            if (
                f.state not in _FINAL
                or f.lease_token is not None
                or f.error is not None
                or f.output is not None
            ):
                uniform = False
            elif first is None:
                first = f
            elif (
                f.state != first.state
                or bool(f.archive) != bool(first.archive)
                or f.attempted_by != first.attempted_by
            ):
                uniform = False
        if uniform and first is not None:
            return by_key, _uniform_batch(by_key, first), []
        batch: list[list[Any]] = []
        timed: list[int] = []
        for (job_id, fence), f in by_key.items():
            if f.error is not None or f.state in _STAY_LIVE:
                timed.append(len(batch))
            batch.append(
                [
                    job_id,
                    fence,
                    f.attempted_by,
                    f.lease_token.hex if f.lease_token else None,
                    f.state,
                    None,  # the schedule of a result that waits again: stamped under the lock
                    1 if f.snooze else 0,
                    f.snooze_reason,
                    None,  # the error, with its time: stamped under the lock
                    dumps(f.output, "output") if f.output is not None else None,
                    1 if f.archive else 0,
                ]
            )
        return by_key, (batch if timed else json.dumps(batch)), timed

    def _finalize_args(
        self,
        params: JobFinalizeParams,
        by_key: dict[tuple[str, int], Any],
        batch: list[list[Any]] | str | dict[str, Any],
        timed: list[int],
    ) -> tuple[dict[str, Any], str]:
        """Read the time (under the write lock) and stamp it on the rows that carry
        it; return the statements' parameters and the time's stored text."""
        now, now_s = self._now(params.now)
        if isinstance(batch, dict):
            return {**batch, "now": now_s}, now_s
        if isinstance(batch, str):
            return {"results": batch, "now": now_s}, now_s
        at = now.astimezone(dt.UTC).isoformat()
        for i in timed:
            row = batch[i]
            f = by_key[(row[0], row[1])]
            if f.state in _STAY_LIVE:
                row[5] = db_time(now + f.delay)
            if f.error is not None:
                e = f.error.to_json()
                e["at"] = at
                row[8] = json.dumps(e)
        return {"results": json.dumps(batch), "now": now_s}, now_s

    def _finalize(
        self,
        c: Any,
        args: dict[str, Any],
        by_key: dict[tuple[str, int], Any],
        params: JobFinalizeParams,
        now_s: str,
    ) -> list[JobFinalized]:
        """Run the finalize statements; return the applied results in input order.

        A statement that no result of the batch can match is not run: the
        history insert when every result is a completion without archive, the
        update of jobs that wait again when no result is retryable or scheduled.
        """
        results = by_key.values()
        uniform = "state" in args  # the parameters of the .uniform variants
        if any(f.state != JobState.COMPLETED or f.archive for f in results):
            c.execute(Q[_FINALIZE_MOVE[uniform]], args)
        c.execute(Q[_FINALIZE_DELETE[uniform]], args)
        gone = c.fetchall()
        stayed: list[Any] = []
        if any(f.state in _STAY_LIVE for f in results):
            c.execute(Q["job_finalize_many.live"], args)
            stayed = c.fetchall()

        applied: set[tuple[str, int]] = set()
        logs: list[list[Any]] = []
        dropped: list[str] = []
        done: list[str] = []
        finished: list[list[Any]] = []  # batch and workflow jobs
        for job_id, fence, attempt, awaited, batch_id, step in gone:
            key = (job_id, fence)
            applied.add(key)
            f = by_key[key]
            if batch_id is not None and not params.no_batches:
                state = f.state if f.state in _FINAL else JobState.CANCELED  # cancel wins
                output = dumps(f.output, "output") if f.output is not None else None
                finished.append([job_id, batch_id, step, state, output])
            if f.state == JobState.COMPLETED and not f.archive:
                dropped.append(job_id)
            elif awaited:
                done.append(str(f.id))
            if f.log is not None and not (f.state == JobState.COMPLETED and not f.archive):
                logs.append([job_id, attempt, 0, f.log])
        snoozes: list[list[Any]] = []
        for job_id, fence, attempt in stayed:
            key = (job_id, fence)
            applied.add(key)
            f = by_key[key]
            # The log belongs to the attempt that ran, before a snooze gave it back.
            ran = attempt + (1 if f.snooze else 0)
            if f.snooze:
                # A snooze, with a log or without, drops the previous snooze's log.
                snoozes.append([job_id, ran, 1])
            if f.log is not None:
                logs.append([job_id, ran, 1 if f.snooze else 0, f.log])
        if dropped:
            c.execute(Q["job_finalize_many.log_delete"], {"ids": json.dumps(dropped)})
        if snoozes:
            c.execute(Q["job_finalize_many.log_unsnooze"], {"logs": json.dumps(snoozes)})
        if logs:
            logs_s = json.dumps(logs)
            c.execute(Q["job_finalize_many.log"], {"logs": logs_s, "now": now_s})
            if params.keep_logs > 0:
                ids = json.dumps(sorted({entry[0] for entry in logs}))
                c.execute(Q["job_finalize_many.log_keep"], {"ids": ids, "keep": params.keep_logs})
        if finished:
            # One writer: record, promote dependents and settle batches right here.
            jobs_finished(self, c, finished, params.now)
        if done:
            self.notify(CHANNEL_DONE, done)
        return [JobFinalized(id=f.id, fence=f.fence) for key, f in by_key.items() if key in applied]

    @translate_errors
    def _job_record_progress(self, params: JobRecordProgressParams) -> Progress | None:
        """Store a running attempt's progress, fenced to its claim and attempt."""
        now, _ = self._now(params.now)
        progress = Progress(
            step=params.step, cursor=params.cursor, recorded_at=now.astimezone(dt.UTC)
        )
        args = {
            "progress": dumps(progress.to_json(), "cursor"),
            "keep_step": 1 if params.keep_step else 0,
            "id": params.id.hex,
            "fence": params.fence,
            "attempt": params.attempt,
            "lease": params.lease_token.hex if params.lease_token else None,
            "client": params.attempted_by,
        }
        if params.no_wait:
            with self._cursor() as c, self._job_write_no_wait(c, "job_record_progress", params.id):
                c.execute(Q["job_record_progress"], args)
                row = c.fetchone()
        else:
            with self._cursor() as c:
                c.execute(Q["job_record_progress"], args)
                row = c.fetchone()
        if row is None:
            return None
        return Progress.from_json(json.loads(row[0]))

    # -- reads ----------------------------------------------------------------

    @translate_errors
    def _job_get(self, id: JobID) -> JobRow | None:
        """Return a job by ID, live first, then from history."""
        with self._cursor() as c:
            c.execute(Q["job_get"], {"id": id.hex})
            row = c.fetchone()
        return None if row is None else job_from_row(row)

    @translate_errors
    def _job_logs(self, id: JobID) -> list[AttemptLog]:
        """Return a job's attempt logs, oldest first."""
        with self._cursor() as c:
            c.execute(Q["job_logs"], {"id": id.hex})
            return [AttemptLog(attempt=a, log=log, snoozed=bool(s)) for a, s, log in c.fetchall()]

    @translate_errors
    def _job_list(self, params: JobListParams) -> list[JobRow]:
        """List live and history jobs matching the filter, in ID order."""
        states = params.states
        live = history = True
        if states:
            live = any(s in _LIVE for s in states)
            history = any(s in _FINAL for s in states)
        # Unset, the cursor is a bound every hex ID passes, so the ID range stays indexable.
        after = (
            params.after.hex if params.after is not None else ("g" if params.newest_first else "")
        )
        args = {
            "live": int(live),
            "history": int(history),
            "after": after,
            "queue": params.queue,
            "ordering_key": params.ordering_key,
            "kinds": json.dumps(list(params.kinds)) if params.kinds else None,
            "states": json.dumps(list(states)) if states else None,
            "ids": json.dumps([i.hex for i in params.ids]) if params.ids else None,
            "priorities": json.dumps(list(params.priorities)) if params.priorities else None,
            "tags_any": json.dumps(list(params.tags_any)) if params.tags_any else None,
            "tags_all": json.dumps(list(params.tags_all)) if params.tags_all else None,
            "metadata": dumps(params.metadata, "metadata") if params.metadata is not None else None,
            "limit": params.limit,
        }
        sql = Q["job_list.newest_first" if params.newest_first else "job_list"]
        with self._cursor() as c:
            try:
                c.execute(sql, args)
            except OperationalError as exc:
                # A connection opened before this module registered its functions.
                if JSON_CONTAINS not in str(exc):
                    raise
                register_functions(self.connection.connection)
                c.execute(sql, args)
            return [job_from_row(r) for r in c.fetchall()]

    # -- operator actions -----------------------------------------------------

    @translate_errors
    def _job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]:
        """Move waiting jobs past their TTL to history as discarded."""
        now, now_s = self._now(params.now)
        args = {"now": now_s, "at": now.astimezone(dt.UTC).isoformat(), "limit": params.limit}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_discard_expired"], args)
            rows = c.fetchall()
            if rows:
                c.execute(
                    Q["job_discard_expired.delete"], {"ids": json.dumps([r[0] for r in rows])}
                )
                if any(r[COL.batch_id] is not None for r in rows):
                    expired = [job_from_row(r) for r in rows]
                    jobs_finished(self, c, finished_of(expired), params.now)
        jobs = [job_from_row(r) for r in rows]
        jobs.sort(key=lambda j: (j.expires_at, j.id))
        return jobs

    @translate_errors
    def _job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]:
        """List running jobs whose client lease is gone, and (optionally) stuck ones."""
        now, now_s = self._now(params.now)
        stuck_before = None
        if params.stuck_after > dt.timedelta(0):
            stuck_before = db_time(now - params.stuck_after)
        with self._cursor() as c:
            c.execute(
                Q["job_rescue_candidates"],
                {"now": now_s, "stuck_before": stuck_before, "limit": params.limit},
            )
            return [
                RescueCandidate(job=job_from_row(r[1:]), stuck=bool(r[0]), ahead=bool(r[-1]))
                for r in c.fetchall()
            ]
