-- Job queries of the PostgreSQL engine.
--
-- Every query that returns jobs returns the same 31 columns in the same order,
-- written {job_columns:alias} (a live row) or {job_columns_history:alias}
-- (queries.JOB_COLUMNS, expanded when the file is loaded: engine/queries.py):
-- the live table's 29, then finalized_at and output (NULL for live jobs). Database time is coalesce(%(now)s, now()), so tests
-- can inject a clock. Optional filters are written `(%(x)s IS NULL OR ...)`:
-- parameters are bound client side, so the planner folds the unused ones away.
-- The hot statements (insert, claim, finalize, progress) are prepared with
-- server-side binding instead (support.py): every parameter needs a type the
-- server can infer, and in their generic plans the flags are one-time filters.

-- fragment: no_history
-- finalized_at and output of a live row, typed so that a UNION with history
-- rows or a CTE's RETURNING keeps the columns' types.
NULL::timestamptz AS finalized_at, NULL::jsonb AS output

-- fragment: history_metadata_g
-- A job's metadata as history keeps it: without the ordering-key wake marker,
-- which only a live job's next claim reads (metadata that is not an object is
-- kept as it is).
CASE WHEN jsonb_typeof(g.metadata) = 'object' THEN g.metadata - '_hopper_wake'
     ELSE g.metadata END

-- name: now
SELECT now()

-- name: job_insert_many
-- One statement for the whole batch. A unique key held by a live job makes
-- ON CONFLICT skip the input (waiting for an uncommitted holder), never an
-- IntegrityError; the engine then reads the holder (job_insert_many.existing).
-- It returns only what the database decided: the engine knows the rest. With
-- %(notify)s it also wakes the workers of each queue that got an available job,
-- at commit, in the same round trip.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
input AS (
    SELECT t.*, coalesce(t.sched, c.now) AS scheduled_at, c.now
    FROM unnest(%(id)s::uuid[], %(kind)s::text[], %(queue)s::text[], %(priority)s::int2[],
                %(max_attempts)s::int4[], %(scheduled_at)s::timestamptz[], %(args)s::text[],
                %(metadata)s::text[], %(tags)s::text[], %(unique_key)s::text[],
                %(ordering_key)s::text[], %(partition_key)s::text[], %(batch_id)s::uuid[],
                %(ttl)s::interval[], %(awaited)s::bool[], %(subject)s::text[])
         WITH ORDINALITY AS t(id, kind, queue, priority, max_attempts, sched, args, metadata,
                              tags, unique_key, ordering_key, partition_key, batch_id, ttl,
                              awaited, subject, ord)
    CROSS JOIN clock c
),
inserted AS (
    INSERT INTO hopper_job AS j (id, kind, queue, state, priority, attempt, max_attempts,
                                 scheduled_at, fence, args, metadata, errors, unique_key,
                                 ordering_key, partition_key, tags, batch_id, expires_at,
                                 awaited, created_at, subject)
    SELECT i.id, i.kind, i.queue,
           CASE WHEN i.scheduled_at > i.now THEN 'scheduled' ELSE 'available' END,
           i.priority, 0, i.max_attempts, i.scheduled_at, 0, i.args::jsonb,
           i.metadata::jsonb, '[]'::jsonb, i.unique_key, i.ordering_key, i.partition_key,
           i.tags::jsonb, i.batch_id, i.now + i.ttl, i.awaited, i.now, i.subject
    FROM input i
    ORDER BY i.ord
    ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING j.id, j.state, j.scheduled_at, j.expires_at, j.created_at, j.queue
),
woken AS (
    SELECT count(pg_notify(%(channel)s::text, w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted
          WHERE %(notify)s::boolean AND state = 'available') w
)
SELECT i.id, i.state, i.scheduled_at, i.expires_at, i.created_at
FROM inserted i CROSS JOIN woken

-- name: job_insert_many.one
-- One job without a unique key whose other fields are all at their defaults
-- (no schedule, TTL, ordering or partition key, tags, metadata, batch, subject
-- or awaiting; the statement's clock; wake-ups on): the common enqueue(). The
-- insert of job_insert_many for such an input with its constant columns
-- written in: seven parameters instead of nineteen, no input CTE. The job is
-- available from now(), so the statement returns only that time (its
-- created_at and scheduled_at; the engine knows the rest), and wakes its
-- queue's workers at commit. Any other single job takes job_insert_many
-- (jobs.py, _INSERT_ONE).
INSERT INTO hopper_job (id, kind, queue, state, priority, attempt, max_attempts, scheduled_at,
                        fence, args, metadata, errors, tags, awaited, created_at)
VALUES (%(id)s::uuid, %(kind)s::text, %(queue)s::text, 'available', %(priority)s::int2, 0,
        %(max_attempts)s::int4, now(), 0, %(args)s::text::jsonb, '{}'::jsonb, '[]'::jsonb,
        '[]'::jsonb, false, now())
RETURNING created_at, pg_notify(%(channel)s::text, queue)

-- name: job_insert_many.existing
-- The live jobs holding the unique keys of inputs the insert skipped.
SELECT {job_columns:j}
FROM hopper_job j
JOIN unnest(%(kind)s::text[], %(unique_key)s::text[]) AS k(kind, unique_key)
  ON j.kind = k.kind AND j.unique_key = k.unique_key
WHERE j.unique_key IS NOT NULL

-- name: job_insert_many.replace
-- ConflictAction.REPLACE: overwrite the holders that are not running; return
-- every holder as it is afterwards (the running ones unchanged).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
input AS (
    SELECT t.*, coalesce(t.sched, c.now) AS scheduled_at, c.now
    FROM unnest(%(kind)s::text[], %(unique_key)s::text[], %(priority)s::int2[],
                %(max_attempts)s::int4[], %(scheduled_at)s::timestamptz[], %(args)s::text[],
                %(metadata)s::text[])
         AS t(kind, unique_key, priority, max_attempts, sched, args, metadata)
    CROSS JOIN clock c
),
replaced AS (
    UPDATE hopper_job j
    SET args = i.args::jsonb,
        metadata = i.metadata::jsonb,
        priority = i.priority,
        max_attempts = i.max_attempts,
        scheduled_at = i.scheduled_at,
        state = CASE WHEN j.state = 'pending' THEN 'pending'
                     WHEN i.scheduled_at > i.now THEN 'scheduled'
                     ELSE 'available' END,
        snooze_reason = NULL
    FROM input i
    WHERE j.kind = i.kind AND j.unique_key = i.unique_key AND j.unique_key IS NOT NULL
      AND j.state <> 'running'
    RETURNING {job_columns:j}
)
SELECT * FROM replaced
UNION ALL
SELECT {job_columns:j}
FROM hopper_job j
JOIN input i ON j.kind = i.kind AND j.unique_key = i.unique_key
WHERE j.unique_key IS NOT NULL AND j.state = 'running'

-- name: job_insert_many.finished
-- unique_finished: the newest job in history with the input's kind and key in
-- one of its states (a comma-separated list), per input ordinal.
SELECT DISTINCT ON (k.ord) k.ord, {job_columns_history:h}
FROM unnest(%(kind)s::text[], %(unique_key)s::text[], %(states)s::text[])
     WITH ORDINALITY AS k(kind, unique_key, states, ord)
JOIN hopper_job_history h
  ON h.kind = k.kind AND h.unique_key = k.unique_key
 AND h.state = ANY (string_to_array(k.states, ','))
WHERE h.unique_key IS NOT NULL
ORDER BY k.ord, h.finalized_at DESC, h.id DESC

-- name: job_insert_many.undo
-- Remove jobs this insert made that turned out to duplicate a finished job.
DELETE FROM hopper_job WHERE id = ANY (%(ids)s::uuid[])

-- name: job_insert_copy
COPY hopper_job (id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, fence,
                 args, metadata, errors, ordering_key, partition_key, tags, batch_id, expires_at,
                 awaited, created_at, subject)
FROM STDIN (FORMAT BINARY)

-- name: job_claim
-- variant: job_claim.limited LIMITED
-- variant: job_claim.keyless KEYLESS
-- Two prepared statements from one text. job_claim is the unlimited path: its
-- gate is also closed on a queue with limits (so the worker switches paths), it
-- has no partition ranking, and the engine writes %(limit)s and %(scan)s (equal
-- there) in as literals (jobs.py, _claim_sql) so that PostgreSQL settles on the
-- generic plan by itself; every use of them stays an expression that is valid
-- with a literal or a parameter. job_claim.limited (LIMITED) adds the
-- partition limit. One statement each. `due` locks the best plain scheduled/retryable jobs whose
-- time has come (index hopper_job_due; sorted in claim order, since a later
-- due job may have the higher priority), `avail` the best plain available
-- ones (index hopper_job_claim); the best `limit` of both are claimed, and the
-- due ones not claimed are promoted to available. A paused queue yields
-- nothing (and, on the unlimited path, a queue with limits), and so does a
-- client whose lease has expired: the rescue may already own what it would
-- claim. The uncorrelated gate is two primary-key probes, evaluated once, no lock.
-- Ordering keys (docs/queue-controls.md): only the head of a key (its oldest
-- live job that is not pending) is a candidate, and only while no job of the
-- key runs. `kwin` reads a bounded window of the queue's keyed candidates in
-- claim order (4 * %(scan)s + 400 rows of hopper_job_keyed) and `kfast` keeps
-- its heads (one hopper_job_ordering probe each), so the usual cost depends on
-- neither the number of keys nor the jobs waiting behind a head. Only when the
-- window is full of jobs that are not heads (a deep lane behind a running head,
-- many higher-priority waiting jobs) and the best heads may lie beyond it does
-- `kwalk` turn on the exact walk of every key (`okeys`: a skip scan of
-- hopper_job_ordering, `heads`: one probe per key), whose cost grows with the
-- number of keys. A queue without ordering keys pays one empty index probe.
-- Partition limit (limited path): each candidate's rank in its partition plus
-- the partition's running jobs must not pass %(partition_limit)s (0: none);
-- the candidate CTEs read %(scan)s rows so that full partitions are skipped.
-- The updates find their rows by `id = ANY (ARRAY(...))`, a primary-key probe
-- per row whatever the table's estimate (a join on the CTE may turn into a
-- sequential scan of the live table when its statistics are stale).
-- job_claim.keyless (KEYLESS) is the unlimited path without the ordering-key
-- CTEs: a plan a third the size, which PostgreSQL starts much faster. `keys`
-- probes hopper_job_keyed once (the condition `kwin` reads, in its order: only
-- that index yields the first row without reading every match, so the plan
-- never depends on the statistics; an EXISTS would drop the ORDER BY and, with
-- many keyed candidates estimated, scan the table for the first); when the queue
-- has a keyed candidate the gate is closed and the one row returned carries
-- keyed = true and no job, so the engine claims again with job_claim. When it
-- has none, `kwin` of job_claim would be empty in this same snapshot (and so
-- `kfast`, `kwalk`, `heads` and `keyed`): both statements claim the same jobs,
-- and a keyed job committed after the snapshot is seen by neither.
WITH RECURSIVE
/*IF KEYLESS*/
keys AS (
    SELECT (SELECT true FROM hopper_job k
            WHERE k.queue = %(queue)s AND k.ordering_key IS NOT NULL
              AND k.state IN ('available', 'scheduled', 'retryable')
            ORDER BY k.priority DESC, k.scheduled_at, k.id
            LIMIT 1) IS NOT NULL AS keyed
),
/*END*/
gate AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM hopper_queue q
        WHERE q.name = %(queue)s
          AND (q.paused_at IS NOT NULL/*IF LIMITED*//*ELSE*/ OR q.global_limit > 0
               OR q.rate_per_sec > 0 OR q.partition_limit > 0/*END*/))
        AND EXISTS (SELECT 1 FROM hopper_client c
                    WHERE c.id = %(client_id)s
                      AND c.expires_at > coalesce(%(now)s::timestamptz, now()))/*IF KEYLESS*/
        AND NOT (SELECT keyed FROM keys)/*END*/ AS open
),
due AS (
    SELECT j.id, j.priority, j.scheduled_at, j.expires_at, j.partition_key
    FROM hopper_job j
    WHERE j.queue = %(queue)s
      AND j.state IN ('scheduled', 'retryable')
      AND j.scheduled_at <= coalesce(%(now)s::timestamptz, now())
      AND j.ordering_key IS NULL
      AND (SELECT open FROM gate)
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(scan)s
    FOR UPDATE OF j SKIP LOCKED
),
avail AS (
    SELECT j.id, j.priority, j.scheduled_at, j.partition_key
    FROM hopper_job j
    WHERE j.queue = %(queue)s
      AND j.state = 'available'
      AND (j.expires_at IS NULL OR j.expires_at > coalesce(%(now)s::timestamptz, now()))
      AND j.ordering_key IS NULL
      AND (SELECT open FROM gate)
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(scan)s
    FOR UPDATE OF j SKIP LOCKED
),
-- Ordering keys. `kwin` reads the first keyed candidates of the queue in claim
-- order (index hopper_job_keyed; a bounded window, whatever the number of keys
-- or of jobs behind a head). Every window row is non-pending, so within the window
-- only the oldest row of a key (lane_pos = 1) can be a head; `kfast` probes those,
-- best first, with one hopper_job_ordering lookup each (no older non-pending job
-- of the key) and drops keys with a running job. If the window is full and holds
-- fewer heads than needed, and the unkeyed candidates do not already fill the
-- claim ahead of the window's end, `kwalk` turns on the exhaustive key walk
-- (`okeys`/`heads`, as before), so the result is exactly the best heads.
/*IF KEYLESS*//*ELSE*/
kwin AS (
    SELECT w.id, w.priority, w.scheduled_at, w.ordering_key, w.claimable,
           row_number() OVER (PARTITION BY w.ordering_key ORDER BY w.id) AS lane_pos
    FROM (
        SELECT j.id, j.priority, j.scheduled_at, j.ordering_key,
               (j.state = 'available' OR j.scheduled_at <= coalesce(%(now)s::timestamptz, now())
                OR j.metadata ? '_hopper_wake')
               AND (j.expires_at IS NULL OR j.expires_at > coalesce(%(now)s::timestamptz, now())) AS claimable
        FROM hopper_job j
        WHERE j.queue = %(queue)s AND j.ordering_key IS NOT NULL
          AND j.state IN ('available', 'scheduled', 'retryable')
          AND (SELECT open FROM gate)
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT (4 * %(scan)s + 400)
    ) w
),
kfast AS (
    SELECT c.id
    FROM (
        SELECT k.id, k.ordering_key
        FROM kwin k
        WHERE k.lane_pos = 1 AND k.claimable
          AND k.ordering_key NOT IN (SELECT r.ordering_key FROM hopper_job r
                                     WHERE r.state = 'running' AND r.queue = %(queue)s
                                       AND r.ordering_key IS NOT NULL)
        ORDER BY k.priority DESC, k.scheduled_at, k.id
        OFFSET 0
    ) c
    -- ORDER BY/LIMIT/OFFSET keep this a per-row probe of hopper_job_ordering: flattened
    -- into a hash anti-join it hashes every job of a big key and is quadratic.
    WHERE NOT EXISTS (SELECT 1 FROM hopper_job o
                      WHERE o.queue = %(queue)s AND o.ordering_key = c.ordering_key
                        AND o.id < c.id AND o.state <> 'pending'
                      ORDER BY o.id DESC
                      LIMIT 1 OFFSET 0)
    -- m exceeds n: heads locked by a concurrent claim are skipped in `keyed`.
    LIMIT (2 * %(scan)s + 16)
),
kwalk AS (
    SELECT (SELECT count(*) FROM kfast) < %(scan)s
       AND (SELECT count(*) FROM kwin) >= (4 * %(scan)s + 400)
       AND NOT coalesce((
           SELECT (-l.priority, l.scheduled_at, l.id) > (-u.priority, u.scheduled_at, u.id)
           FROM (SELECT k.priority, k.scheduled_at, k.id FROM kwin k
                 ORDER BY k.priority, k.scheduled_at DESC, k.id DESC
                 LIMIT 1) l,
                (SELECT x.priority, x.scheduled_at, x.id
                 FROM (SELECT a.priority, a.scheduled_at, a.id FROM avail a
                       UNION ALL
                       SELECT d.priority, d.scheduled_at, d.id FROM due d
                       WHERE d.expires_at IS NULL OR d.expires_at > coalesce(%(now)s::timestamptz, now())) x
                 ORDER BY x.priority DESC, x.scheduled_at, x.id
                 OFFSET %(limit)s - 1
                 LIMIT 1) u
/*END*/
           /*IF LIMITED*/WHERE %(partition_limit)s <= 0/*END*/
/*IF KEYLESS*//*ELSE*/
           ), false) AS needed
),
okeys AS (
    (SELECT j.ordering_key AS k
     FROM hopper_job j
     WHERE j.queue = %(queue)s AND j.ordering_key IS NOT NULL AND (SELECT needed FROM kwalk)
     ORDER BY j.ordering_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.ordering_key
            FROM hopper_job j
            WHERE j.queue = %(queue)s AND j.ordering_key > o.k
            ORDER BY j.ordering_key
            LIMIT 1)
    FROM okeys o
    WHERE o.k IS NOT NULL
),
heads AS (
    SELECT h.id
    FROM okeys o
    CROSS JOIN LATERAL (
        SELECT j.id, j.state
        FROM hopper_job j
        WHERE j.queue = %(queue)s AND j.ordering_key = o.k AND j.state <> 'pending'
        ORDER BY j.id
        LIMIT 1
    ) h
    WHERE o.k IS NOT NULL
      AND h.state <> 'running'
      AND o.k NOT IN (SELECT r.ordering_key FROM hopper_job r
                      WHERE r.state = 'running' AND r.queue = %(queue)s
                        AND r.ordering_key IS NOT NULL)
),
keyed AS (
    SELECT j.id, j.priority, j.scheduled_at, j.partition_key
    FROM hopper_job j
    WHERE j.id = ANY (ARRAY(SELECT f.id FROM kfast f UNION SELECT h.id FROM heads h))
      AND (j.state = 'available'
           OR (j.state IN ('scheduled', 'retryable')
               AND (j.scheduled_at <= coalesce(%(now)s::timestamptz, now())
                    OR j.metadata ? '_hopper_wake')))
      AND (j.expires_at IS NULL OR j.expires_at > coalesce(%(now)s::timestamptz, now()))
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(scan)s
    FOR UPDATE OF j SKIP LOCKED
),
/*END*/
/*IF LIMITED*/
partition_running AS (
    SELECT r.partition_key, count(*) AS n
    FROM hopper_job r
    WHERE %(partition_limit)s > 0
      AND r.state = 'running' AND r.queue = %(queue)s AND r.partition_key IS NOT NULL
    GROUP BY r.partition_key
),
/*END*/
ranked AS (
    SELECT c.id, c.keyed,
           row_number() OVER (ORDER BY c.priority DESC, c.scheduled_at, c.id) AS n
    FROM (
        SELECT u.id, u.priority, u.scheduled_at, u.partition_key, u.keyed/*IF LIMITED*/,
               row_number() OVER (PARTITION BY u.partition_key
                                  ORDER BY u.priority DESC, u.scheduled_at, u.id) AS rank/*END*/
        FROM (
            SELECT a.id, a.priority, a.scheduled_at, a.partition_key, false AS keyed FROM avail a
            UNION ALL
            SELECT d.id, d.priority, d.scheduled_at, d.partition_key, false FROM due d
            WHERE d.expires_at IS NULL OR d.expires_at > coalesce(%(now)s::timestamptz, now())
/*IF KEYLESS*//*ELSE*/
            UNION ALL
            SELECT k.id, k.priority, k.scheduled_at, k.partition_key, true FROM keyed k
/*END*/
        ) u
    ) c
/*IF LIMITED*/
    LEFT JOIN partition_running pr ON pr.partition_key = c.partition_key
    WHERE %(partition_limit)s <= 0 OR c.partition_key IS NULL
       OR c.rank + coalesce(pr.n, 0) <= %(partition_limit)s
/*END*/
),
-- The first %(free)s candidates in claim order start at once; the rest of the
-- %(limit)s are claimed ahead of a free slot (the worker buffers them), and are
-- never keyed: a key's head waits for a free slot rather than in a buffer.
picked AS (
    SELECT r.id, r.n > %(free)s AS ahead
    FROM ranked r
    WHERE r.n <= %(free)s OR NOT r.keyed
    ORDER BY r.n
    LIMIT %(limit)s
),
promoted AS (
    UPDATE hopper_job j
    SET state = 'available', snooze_reason = NULL
    WHERE j.id = ANY (ARRAY(SELECT d.id FROM due d
                            WHERE d.id NOT IN (SELECT p.id FROM picked p)))
),
claimed AS (
    UPDATE hopper_job j
    SET state = 'running',
        attempt = j.attempt + 1,
        fence = j.fence + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        attempted_by = %(client_id)s,
        snooze_reason = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        lease_renewed_at = NULL,
        claimed_ahead_at = CASE WHEN j.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE p.ahead))
                                THEN coalesce(%(now)s::timestamptz, now()) END,
        metadata = CASE WHEN j.ordering_key IS NOT NULL AND j.metadata ? '_hopper_wake'
                             AND jsonb_typeof(j.metadata) = 'object'
                        THEN j.metadata - '_hopper_wake' ELSE j.metadata END
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked p))
    RETURNING {job_columns:j}, j.claimed_ahead_at IS NOT NULL AS ahead
)
/*IF KEYLESS*/
SELECT c.*, k.keyed FROM claimed c RIGHT JOIN keys k ON true
ORDER BY c.priority DESC, c.scheduled_at, c.id
/*ELSE*/
SELECT * FROM claimed ORDER BY priority DESC, scheduled_at, id
/*END*/

-- name: job_return_many
-- Give back jobs a worker claimed ahead of a free slot and never started: each
-- one still running in that claim (client and fence, no job lease) and marked
-- claimed ahead goes back to available (scheduled if its time is still to
-- come) with its attempt given back and its mark cleared. The fence stays
-- bumped, so any result of that claim is refused. A job with a cancel
-- requested is left running (the worker ends it as canceled, fenced).
-- Primary-key probes in ID order; returns the jobs given back and their queues.
UPDATE hopper_job j
SET state = CASE WHEN j.scheduled_at > coalesce(%(now)s::timestamptz, now())
                 THEN 'scheduled' ELSE 'available' END,
    attempt = greatest(j.attempt - 1, 0),
    claimed_ahead_at = NULL
FROM unnest(%(id)s::uuid[], %(fence)s::int8[]) AS i(id, fence)
WHERE j.id = i.id
  AND j.fence = i.fence
  AND j.state = 'running'
  AND j.attempted_by = %(client_id)s::int8
  AND j.lease_token IS NULL
  AND j.claimed_ahead_at IS NOT NULL
  AND j.cancel_requested_at IS NULL
RETURNING j.id, j.queue

-- name: job_schedule
-- Promote due scheduled/retryable jobs (the leader's sweep, every second);
-- returns how many and the queues that got them, to wake their workers. Its
-- cost follows the due jobs and the queues holding waiting jobs, never the jobs
-- waiting for a later time: `queues` walks the distinct queues of index
-- hopper_job_due (one probe each, a skip scan), and `due` reads each queue's
-- due jobs from the same index in time order, a range that ends at the first
-- job not due (the index leads with the queue, so a sweep across queues
-- ordered by time alone would read every waiting job of the index). `heads`
-- probes each queue's oldest waiting job (the first entry of its range), and
-- the queues whose head is due are swept oldest head first, each oldest first,
-- %(limit)s jobs in all: no queue takes precedence by its name, and a queue
-- whose due jobs keep a sweep full (its head moving on with every sweep) cannot
-- starve another whose head stays put (a claim promotes its own queue's due
-- jobs anyway). Row locks are taken with SKIP LOCKED, never waited for, and no
-- queue row is locked, so no order of queues can deadlock against the claim,
-- the operator paths or the queue controls. The update finds its rows by
-- primary key: a join on the CTE may hash the whole live table, and the plan's
-- estimates stay small enough that PostgreSQL never JIT-compiles it.
WITH RECURSIVE queues AS (
    SELECT coalesce(%(queue)s::text,
                    (SELECT j.queue FROM hopper_job j
                     WHERE j.state IN ('scheduled', 'retryable')
                     ORDER BY j.queue
                     LIMIT 1)) AS queue
    UNION ALL
    SELECT (SELECT j.queue FROM hopper_job j
            WHERE j.state IN ('scheduled', 'retryable') AND j.queue > q.queue
            ORDER BY j.queue
            LIMIT 1)
    FROM queues q
    WHERE q.queue IS NOT NULL AND %(queue)s::text IS NULL
),
heads AS (
    SELECT q.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.queue = q.queue AND j.state IN ('scheduled', 'retryable')
            ORDER BY j.scheduled_at
            LIMIT 1) AS head
    FROM queues q
    WHERE q.queue IS NOT NULL
),
due AS (
    SELECT d.id
    FROM (SELECT h.queue FROM heads h
          WHERE h.head <= coalesce(%(now)s::timestamptz, now())
          ORDER BY h.head, h.queue) AS q
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM hopper_job j
        WHERE j.queue = q.queue
          AND j.state IN ('scheduled', 'retryable')
          AND j.scheduled_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY j.scheduled_at
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    ) d
    LIMIT %(limit)s
),
promoted AS (
    UPDATE hopper_job j
    SET state = 'available', snooze_reason = NULL
    WHERE j.id = ANY (ARRAY(SELECT d.id FROM due d))
    RETURNING j.queue
)
SELECT count(*), coalesce(array_agg(DISTINCT queue), '{}'::text[]) FROM promoted

-- name: job_finalize_many
-- variant: job_finalize_many.skip_locked SKIP_LOCKED
-- One statement for a batch of results. `locked` keeps the results whose job
-- is still running in the claim that produced them (client or lease, fence),
-- applying "cancel wins"; terminal ones move to history (or vanish, for
-- completed with archive false), the others stay live. Logs, log trimming
-- and the done notifications of awaited jobs happen in the same statement.
-- The %(has_*)s flags turn the unused parts off (one-time filters when the
-- statement is prepared). job_finalize_many.completed is the common case.
WITH input AS (
    SELECT *
    FROM unnest(%(id)s::uuid[], %(attempted_by)s::int8[], %(fence)s::int8[],
                %(lease_token)s::uuid[], %(state)s::text[], %(delay)s::interval[],
                %(snooze)s::bool[], %(snooze_reason)s::text[], %(error)s::text[],
                %(output)s::text[], %(log)s::text[], %(archive)s::bool[])
         WITH ORDINALITY AS t(id, attempted_by, fence, lease_token, state, delay, snooze,
                              snooze_reason, error, output, log, archive, ord)
),
clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
locked AS (
    SELECT j.id, j.fence, j.attempt, j.awaited, i.ord, i.delay, i.snooze, i.snooze_reason,
           i.error, i.output, i.log, i.archive,
           CASE WHEN i.state IN ('retryable', 'scheduled') AND j.cancel_requested_at IS NOT NULL
                THEN 'canceled' ELSE i.state END AS state,
           i.state = 'completed' AND NOT i.archive AS dropped
    FROM hopper_job j
    JOIN input i ON j.id = i.id
    -- A primary-key probe per result (`id = ANY`), never a walk of every running
    -- job of the cluster: `coalesce` keeps the state test off the index
    -- hopper_job_state, which the planner prefers when its statistics saw few
    -- running jobs (the state is never NULL).
    WHERE j.id = ANY (ARRAY(SELECT x.id FROM input x))
      AND coalesce(j.state, '') = 'running'
      AND j.fence = i.fence
      AND CASE WHEN i.lease_token IS NULL
               THEN j.lease_token IS NULL AND j.attempted_by = i.attempted_by
               ELSE j.lease_token = i.lease_token END
    ORDER BY j.id
    FOR UPDATE OF j/*IF SKIP_LOCKED*/ SKIP LOCKED/*END*/
),
gone AS (
    DELETE FROM hopper_job j
    USING locked m
    WHERE j.id = m.id AND m.state IN ('completed', 'canceled', 'discarded')
    RETURNING {job_columns:j}, m.state AS new_state, m.dropped,
       m.error AS new_error,
              m.output AS new_output
),
archived AS (
    INSERT INTO hopper_job_history ({job_columns_history})
    SELECT g.id, g.kind, g.queue, g.new_state, g.priority, g.attempt, g.max_attempts,
           g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, g.args,
           {history_metadata_g},
           CASE WHEN g.new_error IS NULL THEN g.errors
                ELSE g.errors || jsonb_build_array(jsonb_build_object('at', c.now)
                                                   || g.new_error::jsonb) END,
           g.unique_key, g.ordering_key, g.partition_key, g.tags, g.batch_id, g.expires_at,
           g.cancel_requested_at, g.awaited, g.created_at, NULL, g.progress, NULL, NULL, NULL,
           g.step, g.subject, g.erased_at,
           c.now, g.new_output::jsonb
    FROM gone g CROSS JOIN clock c
    WHERE NOT g.dropped
),
kept AS (
    UPDATE hopper_job j
    SET state = m.state,
        scheduled_at = c.now + m.delay,
        attempt = CASE WHEN m.snooze THEN j.attempt - 1 ELSE j.attempt END,
        snooze_reason = CASE WHEN m.snooze AND m.state = 'scheduled' THEN m.snooze_reason END,
        errors = CASE WHEN m.error IS NULL THEN j.errors
                      ELSE j.errors || jsonb_build_array(jsonb_build_object('at', c.now)
                                                         || m.error::jsonb) END,
        lease_token = NULL,
        lease_expires_at = NULL,
        lease_renewed_at = NULL,
        lease_began_at = NULL
    FROM locked m CROSS JOIN clock c
    WHERE j.id = m.id AND m.state IN ('retryable', 'scheduled')
),
logs_dropped AS (
    DELETE FROM hopper_job_log l
    USING locked m
    WHERE %(has_dropped)s AND l.job_id = m.id AND m.dropped
),
logs_unsnoozed AS (
    DELETE FROM hopper_job_log l
    USING locked m
    WHERE %(has_snooze)s AND l.job_id = m.id AND m.snooze AND NOT m.dropped
      AND l.attempt = m.attempt AND l.snoozed
),
logs_added AS (
    INSERT INTO hopper_job_log (job_id, attempt, snoozed, log, created_at)
    SELECT m.id, m.attempt, m.snooze, m.log, c.now
    FROM locked m CROSS JOIN clock c
    WHERE %(has_logs)s AND m.log IS NOT NULL AND NOT m.dropped
),
logs_trimmed AS (
    DELETE FROM hopper_job_log l
    WHERE %(trim_logs)s AND l.id IN (
        SELECT x.id
        FROM (
            SELECT l2.id,
                   row_number() OVER (PARTITION BY l2.job_id ORDER BY l2.id DESC) AS n
            FROM hopper_job_log l2
            JOIN locked m ON l2.job_id = m.id
            WHERE m.log IS NOT NULL AND NOT m.dropped
              AND NOT (m.snooze AND l2.attempt = m.attempt AND l2.snoozed)
        ) x
        WHERE x.n >= %(keep_logs)s
    )
),
done AS (
    SELECT count(pg_notify(%(done_channel)s, g.id::text)) AS n
    FROM gone g
    WHERE g.awaited
),
-- Batches and workflows, dropped by the planner when %(batches)s is
-- false (JobFinalizeParams.no_batches): the batch's progress is appended, never
-- written to the batch row; a job with dependents leaves its final state (and,
-- for a reading dependent, its output); pending dependents whose dependencies
-- have all left the live table, none failed on a failing edge, become
-- claimable. Dependents that fail are left to workflow_promote_ready.
batch_progress AS (
    INSERT INTO hopper_batch_progress (batch_id, done, failed)
    SELECT g.batch_id, count(*), count(*) FILTER (WHERE g.new_state <> 'completed')
    FROM gone g
    WHERE %(batches)s AND g.batch_id IS NOT NULL
    GROUP BY g.batch_id
),
dependency_results AS (
    INSERT INTO hopper_dependency_result (job_id, workflow_id, step, state, output,
                                          finalized_at)
    SELECT g.id, g.batch_id, g.step, g.new_state,
           CASE WHEN EXISTS (SELECT 1 FROM hopper_job_dependency d
                             WHERE d.depends_on = g.id AND d.reads)
                THEN g.new_output::jsonb END,
           c.now
    FROM gone g CROSS JOIN clock c
    WHERE %(batches)s AND g.batch_id IS NOT NULL
      AND EXISTS (SELECT 1 FROM hopper_job_dependency d WHERE d.depends_on = g.id)
    ON CONFLICT (job_id) DO UPDATE
    SET state = EXCLUDED.state, output = EXCLUDED.output, finalized_at = EXCLUDED.finalized_at
),
dependents_promoted AS (
    UPDATE hopper_job j
    SET state = CASE WHEN j.scheduled_at > c.now THEN 'scheduled' ELSE 'available' END
    FROM (SELECT DISTINCT d.job_id
          FROM gone g JOIN hopper_job_dependency d ON d.depends_on = g.id
          WHERE %(batches)s AND g.batch_id IS NOT NULL) x
    CROSS JOIN clock c
    WHERE j.id = x.job_id AND j.state = 'pending'
      AND NOT EXISTS (SELECT 1 FROM hopper_job_dependency d
                      JOIN hopper_job l ON l.id = d.depends_on
                      WHERE d.job_id = j.id AND l.id NOT IN (SELECT g.id FROM gone g))
      AND NOT EXISTS (SELECT 1 FROM hopper_job_dependency d
                      LEFT JOIN gone g ON g.id = d.depends_on
                      LEFT JOIN hopper_dependency_result r ON r.job_id = d.depends_on
                      WHERE d.job_id = j.id AND d.on_failure <> 'run'
                        AND coalesce(g.new_state, r.state, 'completed') <> 'completed')
    RETURNING j.queue
),
dependents_woken AS (
    SELECT count(pg_notify(%(insert_channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT p.queue FROM dependents_promoted p) q
)
SELECT m.id, m.fence
FROM locked m CROSS JOIN done CROSS JOIN dependents_woken
ORDER BY m.ord

-- name: job_finalize_many.completed
-- variant: job_finalize_many.completed.skip_locked SKIP_LOCKED
-- job_finalize_many for the common batch: every result completed and
-- archived, without log, error, snooze or job lease, and no job in a batch
-- (no_batches). Same fence and lock order; history gets the same row; the
-- awaited jobs' done notifications are sent.
WITH input AS (
    SELECT *
    FROM unnest(%(id)s::uuid[], %(attempted_by)s::int8[], %(fence)s::int8[], %(output)s::text[])
         WITH ORDINALITY AS t(id, attempted_by, fence, output, ord)
),
locked AS (
    SELECT j.id, j.fence, i.ord, i.output
    FROM hopper_job j
    JOIN input i ON j.id = i.id
    -- A primary-key probe per result, whatever the number running (see job_finalize_many).
    WHERE j.id = ANY (ARRAY(SELECT x.id FROM input x))
      AND coalesce(j.state, '') = 'running' AND j.fence = i.fence
      AND j.lease_token IS NULL AND j.attempted_by = i.attempted_by
    ORDER BY j.id
    FOR UPDATE OF j/*IF SKIP_LOCKED*/ SKIP LOCKED/*END*/
),
gone AS (
    DELETE FROM hopper_job j
    USING locked m
    WHERE j.id = m.id
    RETURNING j.id, j.kind, j.queue, j.priority, j.attempt, j.max_attempts, j.scheduled_at,
        j.attempted_at, j.attempted_by, j.fence, j.args, j.metadata, j.errors, j.unique_key,
        j.ordering_key, j.partition_key, j.tags, j.batch_id, j.expires_at,
        j.cancel_requested_at, j.awaited, j.created_at, j.progress, j.step, j.subject, m.output
),
archived AS (
    INSERT INTO hopper_job_history (id, kind, queue, state, priority, attempt, max_attempts,
        scheduled_at, attempted_at, attempted_by, fence, args, metadata, errors, unique_key,
        ordering_key, partition_key, tags, batch_id, expires_at, cancel_requested_at, awaited,
        created_at, progress, step, subject, finalized_at, output)
    SELECT g.id, g.kind, g.queue, 'completed', g.priority, g.attempt, g.max_attempts,
           g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, g.args,
           {history_metadata_g},
           g.errors, g.unique_key, g.ordering_key, g.partition_key, g.tags, g.batch_id,
           g.expires_at, g.cancel_requested_at, g.awaited, g.created_at, g.progress, g.step,
           g.subject, coalesce(%(now)s::timestamptz, now()), g.output::jsonb
    FROM gone g
),
done AS (
    SELECT count(pg_notify(%(done_channel)s, g.id::text)) AS n FROM gone g WHERE g.awaited
)
SELECT m.id, m.fence FROM locked m CROSS JOIN done ORDER BY m.ord

-- name: job_record_progress
-- variant: job_record_progress.no_wait NO_WAIT
-- Fenced like a finalize, and on the attempt number too; the no_wait variant
-- refuses to wait for the job's row lock.
WITH target AS (
    SELECT j.id
    FROM hopper_job j
    WHERE j.id = %(id)s::uuid
      AND j.attempt = %(attempt)s
      AND {held_by_claim}
    FOR UPDATE/*IF NO_WAIT*/ NOWAIT/*END*/
)
UPDATE hopper_job j
SET progress = jsonb_build_object(
        'step', CASE WHEN %(keep_step)s THEN coalesce(j.progress ->> 'step', '')
                     ELSE %(step)s::text END,
        'cursor', %(cursor)s::jsonb,
        'at', coalesce(%(now)s::timestamptz, now()))
FROM target t
WHERE j.id = t.id
RETURNING j.progress

-- name: job_get
-- Live first, then the newest history row.
(SELECT {job_columns:j} FROM hopper_job j WHERE j.id = %(id)s::uuid)
UNION ALL
(SELECT {job_columns_history:h} FROM hopper_job_history h WHERE h.id = %(id)s::uuid
 ORDER BY h.finalized_at DESC LIMIT 1)
LIMIT 1

-- name: job_logs
SELECT attempt, snoozed, log FROM hopper_job_log WHERE job_id = %(id)s::uuid ORDER BY id

-- fragment: job_list_where
-- job_list's filters, the same for both tables. A tag filter repeats the
-- predicate of the tags GIN indexes (tagged rows only), which it implies: the
-- planner uses a partial index only for a WHERE that implies its predicate.
-- An empty tag filter is NULL (it matches every job) and adds nothing.
       AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
       AND (%(kinds)s::text[] IS NULL OR kind = ANY (%(kinds)s::text[]))
       AND (%(states)s::text[] IS NULL OR state = ANY (%(states)s::text[]))
       AND (%(ordering_key)s::text IS NULL OR ordering_key = %(ordering_key)s::text)
       AND (%(after)s::uuid IS NULL OR id /*IF NEWEST_FIRST*/</*ELSE*/>/*END*/ %(after)s::uuid)
       AND (%(ids)s::uuid[] IS NULL OR id = ANY (%(ids)s::uuid[]))
       AND (%(priorities)s::int2[] IS NULL OR priority = ANY (%(priorities)s::int2[]))
       AND (%(tags_any)s::text[] IS NULL OR (tags <> '[]'::jsonb AND tags ?| %(tags_any)s::text[]))
       AND (%(tags_all)s::text[] IS NULL OR (tags <> '[]'::jsonb AND tags ?& %(tags_all)s::text[]))
       AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)

-- name: job_list
-- variant: job_list.newest_first NEWEST_FIRST
-- Live and history in one query, each side filtered, ordered and limited
-- before the merge. %(live)s / %(history)s say which tables the states need.
-- NEWEST_FIRST: the same in descending ID order.
SELECT * FROM (
    (SELECT {job_columns:j}
     FROM hopper_job j
     WHERE %(live)s
{job_list_where}
     ORDER BY j.id/*IF NEWEST_FIRST*/ DESC/*END*/
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {job_columns_history:h}
     FROM hopper_job_history h
     WHERE %(history)s
{job_list_where}
     ORDER BY h.id/*IF NEWEST_FIRST*/ DESC/*END*/
     LIMIT %(limit)s)
) u
ORDER BY u.id/*IF NEWEST_FIRST*/ DESC/*END*/
LIMIT %(limit)s

-- name: job_discard_expired
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
expired AS (
    SELECT j.id
    FROM hopper_job j
    WHERE j.expires_at <= (SELECT now FROM clock)
      AND j.state IN ('pending', 'available', 'scheduled', 'retryable')
    ORDER BY j.expires_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
gone AS (
    DELETE FROM hopper_job j
    USING expired e
    WHERE j.id = e.id
    RETURNING {job_columns:j}
)
INSERT INTO hopper_job_history ({job_columns_history})
SELECT g.id, g.kind, g.queue, 'discarded', g.priority, g.attempt, g.max_attempts,
       g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, g.args, {history_metadata_g},
       g.errors || jsonb_build_array(jsonb_build_object(
           'at', c.now, 'attempt', g.attempt, 'error', 'expired before it could run',
           'rescue', 'ttl_expired')),
       g.unique_key, g.ordering_key, g.partition_key, g.tags, g.batch_id, g.expires_at,
       g.cancel_requested_at, g.awaited, g.created_at, NULL, g.progress, NULL, NULL, NULL, g.step, g.subject, g.erased_at,
       c.now, NULL
FROM gone g CROSS JOIN clock c
RETURNING {job_columns_history:hopper_job_history}

-- name: job_rescue_candidates
-- Running jobs (without a job lease) whose client has no live lease, and,
-- with %(stuck_after)s, any running job without a job lease claimed before
-- now - stuck_after. A job under a job lease is never a candidate: its lease
-- says whether it is alive (job_expire_leases ends it), and a finalize fenced
-- to a client claim could never end it, so it would come back every pass and
-- take a place of the limit.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT {job_columns:j}, NOT x.orphan AS stuck, j.claimed_ahead_at IS NOT NULL AS ahead
FROM hopper_job j
CROSS JOIN clock c
CROSS JOIN LATERAL (
    SELECT j.lease_token IS NULL AND NOT EXISTS (
        SELECT 1 FROM hopper_client cl WHERE cl.id = j.attempted_by AND cl.expires_at > c.now
    ) AS orphan
) x
WHERE j.state = 'running'
  AND (x.orphan OR (%(stuck_after)s::interval IS NOT NULL
                    AND j.lease_token IS NULL
                    AND j.attempted_at <= c.now - %(stuck_after)s::interval))
ORDER BY j.attempted_at, j.id
LIMIT %(limit)s
