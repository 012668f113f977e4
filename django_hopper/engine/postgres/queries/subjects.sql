-- Data-subject queries of the PostgreSQL engine.
--
-- subject_erase runs these in one transaction: the live jobs of the subject
-- end in history with their data removed (which fences a running attempt:
-- every write an attempt makes is conditional on its live row), history rows
-- in every partition lose their data in place, and the step ledgers, attempt
-- logs and dependency outputs of both go. What a row keeps is its identity,
-- state, counters, times, batch and step name: what an operator needs to see
-- that a job existed and was erased, nothing the job was handed or produced.

-- name: subject_erase.lock
-- First, lock the subject's live jobs. A finalize (or cancel, expiry) moving one
-- to history right now is waited for, so the history statement that follows, a
-- later snapshot, finds it there; the rows locked here cannot move until the
-- erasure commits. A retry moving a job back from history is waited for by the
-- history statement, and the live statement, later again, finds it live.
SELECT j.id FROM hopper_job j WHERE j.subject = %(subject)s ORDER BY j.id FOR UPDATE

-- name: subject_erase
-- End the subject's live jobs: into history as discarded, data removed, marked
-- erased_at; their batches get the progress a finalize would record, and an
-- awaited job wakes its waiters. Returns (id, was running, batch_id) per job.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
gone AS (
    DELETE FROM hopper_job j
    WHERE j.subject = %(subject)s
    RETURNING j.*
),
archived AS (
    INSERT INTO hopper_job_history ({job_columns_history})
    SELECT g.id, g.kind, g.queue, 'discarded', g.priority, g.attempt, g.max_attempts,
           g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, '{}'::jsonb, '{}'::jsonb,
           '[]'::jsonb, NULL, NULL, NULL, '[]'::jsonb, g.batch_id, g.expires_at,
           g.cancel_requested_at, g.awaited, g.created_at, NULL, NULL, NULL, NULL, NULL,
           g.step, NULL, c.now, c.now, NULL
    FROM gone g CROSS JOIN clock c
),
{gone_failed_progress},
woken AS (
    SELECT count(pg_notify(%(done_channel)s, g.id::text)) AS n FROM gone g WHERE g.awaited
)
SELECT g.id, g.state = 'running', g.batch_id FROM gone g CROSS JOIN woken

-- name: subject_erase.history
-- Remove the data of the subject's jobs in history, in every partition.
UPDATE hopper_job_history h
SET args = '{}'::jsonb, metadata = '{}'::jsonb, errors = '[]'::jsonb, unique_key = NULL,
    ordering_key = NULL, partition_key = NULL, tags = '[]'::jsonb, snooze_reason = NULL,
    progress = NULL, output = NULL, subject = NULL,
    erased_at = coalesce(%(now)s::timestamptz, now())
WHERE h.subject = %(subject)s
RETURNING h.id

-- name: subject_erase.ledger
-- Delete the step ledgers and attempt logs of the erased jobs, and empty the
-- outputs their workflows kept for dependents (the state stays: dependents
-- still see how the step ended). Returns the three counts.
WITH ids AS (SELECT unnest(%(ids)s::uuid[]) AS id),
steps AS (
    DELETE FROM hopper_job_step s USING ids WHERE s.job_id = ids.id RETURNING 1
),
logs AS (
    DELETE FROM hopper_job_log l USING ids WHERE l.job_id = ids.id RETURNING 1
),
results AS (
    UPDATE hopper_dependency_result r SET output = NULL
    FROM ids WHERE r.job_id = ids.id AND r.output IS NOT NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM logs), (SELECT count(*) FROM results)

-- name: subject_erase.record
-- That the erasure happened: when, and how many rows; the subject as a digest.
INSERT INTO hopper_erasure (subject_digest, erased_at, jobs, running, steps, logs, results)
VALUES (%(digest)s, coalesce(%(now)s::timestamptz, now()), %(jobs)s, %(running)s, %(steps)s,
        %(logs)s, %(results)s)
RETURNING id, erased_at
