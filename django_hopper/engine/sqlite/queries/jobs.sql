-- The SQLite engine's job queries.
--
-- Conventions:
-- * Parameters are Django's %(name)s style (the sqlite cursor turns them into :name).
-- * Times are text 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC, so text order is time order;
--   "now" is always bound as %(now)s (SQLite's clock is the machine's).
-- * Batches come in as one JSON array of arrays, read with json_each, so that a batch
--   of any size is one statement with a fixed text (json_extract, not ->, keeps
--   SQLite 3.35 working). JSON-valued fields travel as JSON texts inside the batch.
-- * Every job query returns the same 31 columns in the same order as the PostgreSQL
--   engine, written {job_columns} (a live row) or {job_columns_history}
--   (queries.JOB_COLUMNS, expanded when the file is loaded: engine/queries.py): the
--   live table's 29, then finalized_at and output (NULL for live jobs).

-- fragment: no_history
-- finalized_at and output of a live row.
NULL AS finalized_at, NULL AS output

-- fragment: read_time
-- Written before each time column of a job select list (engine/queries.py):
-- SQLite's no-op operator, which drops the column's declared type, so Django's
-- driver-level datetime converter leaves the stored text to the decoder and a
-- text that is no time fails only its own row (JobRow.decode_error).
+

-- fragment: wake_marked
-- Whether a job's metadata holds the ordering-key wake marker; metadata that is
-- not valid JSON reads as unmarked instead of failing the statement.
CASE WHEN json_valid(metadata) THEN json_extract(metadata, '$._hopper_wake') END IS NOT NULL

-- fragment: wake_marked_j
CASE WHEN json_valid(j.metadata) THEN json_extract(j.metadata, '$._hopper_wake') END IS NOT NULL

-- fragment: history_metadata
-- A job's metadata as history keeps it: without the ordering-key wake marker,
-- which only a live job's next claim reads (metadata that is not a JSON object
-- is kept as it is). Most jobs carry none: '{}' is kept without being parsed.
CASE WHEN metadata = '{}' THEN metadata
     WHEN json_valid(metadata) AND json_type(metadata) = 'object'
     THEN json_remove(metadata, '$._hopper_wake') ELSE metadata END

-- fragment: history_metadata_j
CASE WHEN j.metadata = '{}' THEN j.metadata
     WHEN json_valid(j.metadata) AND json_type(j.metadata) = 'object'
     THEN json_remove(j.metadata, '$._hopper_wake') ELSE j.metadata END


-- name: job_insert_many
-- %(rows)s: [id, kind, queue, state, priority, max_attempts, scheduled_at, args,
-- metadata, unique_key, ordering_key, partition_key, tags, batch_id, expires_at,
-- awaited, subject]. An input whose unique key a live job holds is skipped (never an
-- IntegrityError); RETURNING says which were inserted.
INSERT INTO hopper_job (
    id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, fence,
    args, metadata, errors, unique_key, ordering_key, partition_key, tags, batch_id,
    expires_at, awaited, created_at, subject)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), 0,
       json_extract(value, '$[5]'), json_extract(value, '$[6]'), 0,
       json_extract(value, '$[7]'), json_extract(value, '$[8]'), '[]',
       json_extract(value, '$[9]'), json_extract(value, '$[10]'), json_extract(value, '$[11]'),
       json_extract(value, '$[12]'), json_extract(value, '$[13]'), json_extract(value, '$[14]'),
       json_extract(value, '$[15]'), %(now)s, json_extract(value, '$[16]')
FROM json_each(%(rows)s)
-- The WHERE resolves SQLite's parsing ambiguity of INSERT ... SELECT ... ON CONFLICT.
WHERE true
ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: job_insert_many.one
-- One job without a unique key (every enqueue()): the insert of job_insert_many
-- for one input, its values bound as parameters instead of read from a JSON
-- array (no json_each, no json_extract per column). It cannot conflict on a
-- unique key, so it needs no ON CONFLICT and returns nothing.
INSERT INTO hopper_job (
    id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, fence,
    args, metadata, errors, ordering_key, partition_key, tags, batch_id,
    expires_at, awaited, created_at, subject)
VALUES (%(id)s, %(kind)s, %(queue)s, %(state)s, %(priority)s, 0, %(max_attempts)s,
        %(scheduled_at)s, 0, %(args)s, %(metadata)s, '[]', %(ordering_key)s,
        %(partition_key)s, %(tags)s, %(batch_id)s, %(expires_at)s, %(awaited)s, %(now)s,
        %(subject)s);

-- name: job_insert_many.finished
-- Jobs in history that make inputs with unique_finished duplicates, newest first.
-- %(keys)s: [input index, kind, unique_key, states as a JSON text].
SELECT json_extract(k.value, '$[0]') AS i,
       {job_columns_history:h}
FROM json_each(%(keys)s) AS k
JOIN hopper_job_history AS h
  ON h.kind = json_extract(k.value, '$[1]') AND h.unique_key = json_extract(k.value, '$[2]')
WHERE h.state IN (SELECT value FROM json_each(json_extract(k.value, '$[3]')))
ORDER BY h.finalized_at DESC, h.id DESC;

-- name: job_insert_many.existing
-- The live jobs holding unique keys. %(keys)s: [kind, unique_key].
SELECT {job_columns:j}
FROM json_each(%(keys)s) AS k
JOIN hopper_job AS j
  ON j.kind = json_extract(k.value, '$[0]') AND j.unique_key = json_extract(k.value, '$[1]');

-- name: job_insert_many.replace
-- ConflictAction.REPLACE: the live holders of the keys, unless running, take the
-- inputs' fields. %(rows)s: [kind, unique_key, args, metadata, priority, max_attempts,
-- scheduled_at].
UPDATE hopper_job
SET args = r.args,
    metadata = r.metadata,
    priority = r.priority,
    max_attempts = r.max_attempts,
    scheduled_at = r.scheduled_at,
    state = CASE WHEN hopper_job.state = 'pending' THEN 'pending'
                 WHEN r.scheduled_at > %(now)s THEN 'scheduled'
                 ELSE 'available' END,
    snooze_reason = NULL
FROM (SELECT json_extract(value, '$[0]') AS kind, json_extract(value, '$[1]') AS unique_key,
             json_extract(value, '$[2]') AS args, json_extract(value, '$[3]') AS metadata,
             json_extract(value, '$[4]') AS priority, json_extract(value, '$[5]') AS max_attempts,
             json_extract(value, '$[6]') AS scheduled_at
      FROM json_each(%(rows)s)) AS r
WHERE hopper_job.kind = r.kind
  AND hopper_job.unique_key = r.unique_key
  AND hopper_job.state <> 'running';


-- name: job_claim.promote
-- The claim's first step: due scheduled and retryable jobs of the queue become available.
UPDATE hopper_job
SET state = 'available', snooze_reason = NULL
WHERE queue = %(queue)s
  AND state IN ('scheduled', 'retryable')
  AND scheduled_at <= %(now)s;

-- fragment: keyed_candidates
-- Whether the queue has keyed candidates: the rows `kwin` of job_claim reads.
EXISTS (SELECT 1 FROM hopper_job INDEXED BY hopper_job_keyed
        WHERE queue = %(queue)s AND ordering_key IS NOT NULL
          AND state IN ('available', 'scheduled', 'retryable'))

-- name: job_claim.keys
-- Asked after job_claim.keyless claimed nothing, in its transaction: whether
-- its gate was closed by keyed candidates.
SELECT {keyed_candidates};

-- name: job_claim
-- variant: job_claim.keyless KEYLESS
-- The claim itself: the best claimable jobs of the queue, unless it is paused (or,
-- on the unlimited path, limited) or the client's lease has expired (the rescue
-- may own what it would claim). One writer at a time, so no other claim can take
-- the same rows. RETURNING order is not claim order: the engine sorts.
-- Ordering keys (docs/queue-controls.md): only the head of a key (its oldest live
-- job that is not pending) is a candidate, and only while no job of the key runs.
-- A bounded window of keyed candidates in claim order (`kwin`, 4 * %(scan)s + 400
-- rows) yields the heads, so the cost depends on neither the number of keys nor
-- the jobs behind a head; only when the window is full of jobs that are not heads
-- does `kwalk` turn on the exact walk of every key (`okeys`/`heads`), whose cost
-- grows with the keys.
-- Partition limit (limited path): a candidate's rank in its partition plus the
-- partition's running jobs must not pass %(partition_limit)s (0: none).
-- job_claim.keyless (KEYLESS) leaves the ordering-key CTEs out, and its gate is
-- closed while the queue has keyed candidates; without any, it claims what
-- job_claim would (one writer: nothing commits between its reads).
WITH RECURSIVE
gate(open) AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM hopper_queue
        WHERE name = %(queue)s
          AND (paused_at IS NOT NULL
               OR (NOT %(limited)s AND (global_limit > 0 OR rate_per_sec > 0
                                        OR partition_limit > 0))))
        AND EXISTS (SELECT 1 FROM hopper_client
                    WHERE id = %(client_id)s AND expires_at > %(now)s)/*IF KEYLESS*/
        AND NOT {keyed_candidates}/*END*/),
-- Ordering keys, as in the PostgreSQL claim: `kwin` is the window (index
-- hopper_job_keyed, whose condition the WHERE repeats word for word). Every window
-- row is non-pending, so only the oldest window row of a key (lane_pos = 1) can be
-- a head; `kfast` probes those (hopper_job_ordering). `kwalk` turns on the key walk
-- only when the window is full and short of heads. INDEXED BY pins the plans on
-- tables never analysed (so the indexes must exist: migration 0006).
/*IF KEYLESS*//*ELSE*/
kwin AS (
    SELECT w.id, w.priority, w.scheduled_at, w.ordering_key, w.claimable,
           row_number() OVER (PARTITION BY w.ordering_key ORDER BY w.id) AS lane_pos
    FROM (SELECT id, priority, scheduled_at, ordering_key,
                 (state = 'available' OR scheduled_at <= %(now)s
                  OR {wake_marked})
                 AND (expires_at IS NULL OR expires_at > %(now)s) AS claimable
          FROM hopper_job INDEXED BY hopper_job_keyed
          WHERE queue = %(queue)s AND ordering_key IS NOT NULL
            AND state IN ('available', 'scheduled', 'retryable')
            AND (SELECT open FROM gate)
          ORDER BY priority DESC, scheduled_at, id
          LIMIT (4 * %(scan)s + 400)) AS w),
kfast(id) AS (
    SELECT k.id
    FROM kwin k
    WHERE k.lane_pos = 1 AND k.claimable
      AND k.ordering_key NOT IN (SELECT ordering_key FROM hopper_job INDEXED BY hopper_job_state
                                 WHERE state = 'running' AND queue = %(queue)s
                                   AND ordering_key IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM hopper_job AS o INDEXED BY hopper_job_ordering
                      WHERE o.queue = %(queue)s AND o.ordering_key = k.ordering_key
                        AND o.id < k.id AND o.state <> 'pending')
    ORDER BY k.priority DESC, k.scheduled_at, k.id
    LIMIT %(scan)s),
kwalk(needed) AS (
    SELECT (SELECT count(*) FROM kfast) < %(scan)s
       AND (SELECT count(*) FROM kwin) >= (4 * %(scan)s + 400)),
okeys(k) AS (
    SELECT (SELECT ordering_key FROM hopper_job
            WHERE queue = %(queue)s AND ordering_key IS NOT NULL
            ORDER BY ordering_key LIMIT 1)
    WHERE (SELECT needed FROM kwalk)
    UNION ALL
    SELECT (SELECT ordering_key FROM hopper_job
            WHERE queue = %(queue)s AND ordering_key > okeys.k
            ORDER BY ordering_key LIMIT 1)
    FROM okeys
    WHERE okeys.k IS NOT NULL),
heads(id) AS (
    SELECT (SELECT id FROM hopper_job
            WHERE queue = %(queue)s AND ordering_key = okeys.k AND state <> 'pending'
            ORDER BY id LIMIT 1)
    FROM okeys
    WHERE okeys.k IS NOT NULL
      AND okeys.k NOT IN (SELECT ordering_key FROM hopper_job
                          WHERE state = 'running' AND queue = %(queue)s
                            AND ordering_key IS NOT NULL)),
/*END*/
cand AS (
    SELECT * FROM (
        SELECT id, priority, scheduled_at, partition_key, 0 AS keyed
        FROM hopper_job
        WHERE queue = %(queue)s
          AND state = 'available'
          AND ordering_key IS NULL
          AND (expires_at IS NULL OR expires_at > %(now)s)
          AND (SELECT open FROM gate)
        ORDER BY priority DESC, scheduled_at, id
        LIMIT %(scan)s)
/*IF KEYLESS*//*ELSE*/
    UNION ALL
    SELECT * FROM (
        SELECT j.id, j.priority, j.scheduled_at, j.partition_key, 1 AS keyed
        FROM (SELECT id FROM kfast UNION SELECT id FROM heads) AS h
        CROSS JOIN hopper_job j ON j.id = h.id
        WHERE (j.state = 'available'
               OR (j.state IN ('scheduled', 'retryable')
                   AND (j.scheduled_at <= %(now)s
                        OR {wake_marked_j})))
          AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT %(scan)s)
/*END*/
    ),
/*IF KEYLESS*/
-- KEYLESS serves only the unlimited path, whose gate is closed on a queue with
-- any limit: no partition limit to rank by, no keyed candidate to hold back.
-- Its candidates are %(limit)s at most (%(scan)s is %(limit)s there).
picked AS MATERIALIZED (
    SELECT c.id,
           row_number() OVER (ORDER BY c.priority DESC, c.scheduled_at, c.id) > %(free)s AS ahead
    FROM cand c
    LIMIT %(limit)s)
/*ELSE*/
ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.partition_key
                                   ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rnk
    FROM cand c),
allowed AS (
    SELECT r.id, r.keyed,
           row_number() OVER (ORDER BY r.priority DESC, r.scheduled_at, r.id) AS n
    FROM ranked r
    WHERE %(partition_limit)s <= 0 OR r.partition_key IS NULL
       OR r.rnk + (SELECT count(*) FROM hopper_job x
                   WHERE x.state = 'running' AND x.queue = %(queue)s
                     AND x.partition_key = r.partition_key) <= %(partition_limit)s),
-- The first %(free)s candidates in claim order start at once; the rest of the
-- %(limit)s are claimed ahead of a free slot (the worker buffers them), and are
-- never keyed: a key's head waits for a free slot rather than in a buffer.
picked AS MATERIALIZED (
    SELECT a.id, a.n > %(free)s AS ahead
    FROM allowed a
    WHERE a.n <= %(free)s OR NOT a.keyed
    ORDER BY a.n
    LIMIT %(limit)s)
/*END*/
UPDATE hopper_job
SET state = 'running',
    attempt = attempt + 1,
    fence = fence + 1,
    attempted_at = %(now)s,
    attempted_by = %(client_id)s,
    snooze_reason = NULL,
    lease_token = NULL,
    lease_expires_at = NULL,
    lease_renewed_at = NULL,
    claimed_ahead_at = CASE WHEN id IN (SELECT id FROM picked WHERE ahead)
                            THEN %(now)s END,
    metadata = CASE WHEN ordering_key IS NOT NULL
                         AND {wake_marked}
                    THEN json_remove(metadata, '$._hopper_wake') ELSE metadata END
WHERE id IN (SELECT id FROM picked)
-- The mark itself, read in Python, through `+` (as `read_time` does): the column,
-- declared a datetime, would go through Django's driver-level converter for every job
-- claimed ahead. (A flag, `claimed_ahead_at IS NOT NULL`, read true for every returned
-- row on SQLite 3.40.)
RETURNING {job_columns}, +claimed_ahead_at AS claimed_ahead_at;


-- name: job_return_many
-- Give back jobs a worker claimed ahead of a free slot and never started: each
-- one still running in that claim (client and fence, no job lease) and marked
-- claimed ahead goes back to available (scheduled if its time is still to
-- come) with its attempt given back and its mark cleared. The fence stays
-- bumped, so any result of that claim is refused. A job with a cancel
-- requested is left running (the worker ends it as canceled, fenced).
-- %(jobs)s is a JSON array of [id hex, fence] pairs.
UPDATE hopper_job
SET state = CASE WHEN scheduled_at > %(now)s THEN 'scheduled' ELSE 'available' END,
    attempt = max(attempt - 1, 0),
    claimed_ahead_at = NULL
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(%(jobs)s))
  AND fence = (SELECT json_extract(i.value, '$[1]') FROM json_each(%(jobs)s) AS i
               WHERE json_extract(i.value, '$[0]') = hopper_job.id)
  AND state = 'running'
  AND attempted_by = %(client_id)s
  AND lease_token IS NULL
  AND claimed_ahead_at IS NOT NULL
  AND cancel_requested_at IS NULL
RETURNING id, queue;

-- name: job_schedule
-- The leader's promotion of due scheduled and retryable jobs, in any queue or one.
UPDATE hopper_job
SET state = 'available', snooze_reason = NULL
WHERE id IN (
    SELECT id
    FROM hopper_job
    WHERE state IN ('scheduled', 'retryable')
      AND scheduled_at <= %(now)s
      AND (%(queue)s IS NULL OR queue = %(queue)s)
    ORDER BY scheduled_at, id
    LIMIT %(limit)s)
RETURNING queue;


-- Finalize. %(results)s: [id, fence, client, lease_token, state, scheduled_at, snooze (0/1),
-- snooze_reason, error (JSON text), output (JSON text), archive (0/1)], at most one
-- result per (id, fence). A result applies only while its job is running at that fence,
-- held by that client (or lease). A retryable or scheduled result of a job with a cancel
-- request is applied as canceled. The statements run in one transaction; each finds
-- the results that apply with the same fence test, so they agree on the set. The batch
-- drives each join (CROSS JOIN fixes the order; the unary + keeps the state index out),
-- so the cost is one primary key lookup per result, whatever the number running.

-- fragment: finalize_results
-- The batch of a finalize, one row per result. With UNIFORM
-- (job_finalize_many.uniform) every result is a completed, canceled or
-- discarded one of the same client, state and archive flag, with no job lease,
-- error or output: %(results)s is a JSON array of one text per result, its job
-- ID's 32 hex digits then its fence, and %(client)s, %(state)s and %(archive)s
-- are the values they share, so no result is parsed as JSON of its own.
/*IF UNIFORM*/(SELECT substr(value, 1, 32) AS id, CAST(substr(value, 33) AS INTEGER) AS fence,
             %(client)s AS client, NULL AS lease, %(state)s AS state, NULL AS error,
             NULL AS output, %(archive)s AS archive
      FROM json_each(%(results)s))/*ELSE*/(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence,
             json_extract(value, '$[2]') AS client, json_extract(value, '$[3]') AS lease,
             json_extract(value, '$[4]') AS state, json_extract(value, '$[8]') AS error,
             json_extract(value, '$[9]') AS output, json_extract(value, '$[10]') AS archive
      FROM json_each(%(results)s))/*END*/

-- name: job_finalize_many
-- variant: job_finalize_many.uniform UNIFORM
-- Write to history the jobs that leave the live table, unless completed with archive
-- off.
INSERT INTO hopper_job_history ({job_columns_history})
SELECT j.id, j.kind, j.queue,
       CASE WHEN r.state IN ('completed', 'canceled', 'discarded') THEN r.state
            ELSE 'canceled' END,
       j.priority, j.attempt, j.max_attempts, j.scheduled_at, j.attempted_at,
       j.attempted_by, j.fence, j.args, {history_metadata_j},
       CASE WHEN r.error IS NULL THEN j.errors
            ELSE hopper_json_append(j.errors, r.error) END,
       j.unique_key, j.ordering_key, j.partition_key, j.tags, j.batch_id, j.expires_at,
       j.cancel_requested_at, j.awaited, j.created_at, NULL, j.progress, NULL, NULL, NULL,
       j.step, j.subject, j.erased_at, %(now)s, r.output
FROM {finalize_results} AS r
CROSS JOIN hopper_job AS j
WHERE j.id = r.id
  AND +j.state = 'running'
  AND j.fence = r.fence
  AND CASE WHEN r.lease IS NULL THEN j.lease_token IS NULL AND j.attempted_by = r.client
           ELSE j.lease_token = r.lease END
  AND (r.state IN ('completed', 'canceled', 'discarded') OR j.cancel_requested_at IS NOT NULL)
  AND NOT (r.state = 'completed' AND NOT r.archive);

-- name: job_finalize_many.delete
-- variant: job_finalize_many.delete.uniform UNIFORM
-- Remove from the live table every job whose result moves it out (history or nowhere).
DELETE FROM hopper_job
WHERE id IN (
    SELECT j.id
    FROM {finalize_results} AS r
    CROSS JOIN hopper_job AS j
    WHERE j.id = r.id
      AND +j.state = 'running'
      AND j.fence = r.fence
      AND CASE WHEN r.lease IS NULL THEN j.lease_token IS NULL AND j.attempted_by = r.client
               ELSE j.lease_token = r.lease END
      AND (r.state IN ('completed', 'canceled', 'discarded')
           OR j.cancel_requested_at IS NOT NULL))
RETURNING id, fence, attempt, awaited, batch_id, step;

-- name: job_finalize_many.live
-- Retryable and scheduled results: the job waits again, a snooze giving the attempt back.
UPDATE hopper_job
SET state = r.state,
    scheduled_at = r.scheduled_at,
    attempt = hopper_job.attempt - r.snooze,
    snooze_reason = CASE WHEN r.snooze AND r.state = 'scheduled' THEN r.snooze_reason END,
    errors = CASE WHEN r.error IS NULL THEN hopper_job.errors
                  ELSE hopper_json_append(hopper_job.errors, r.error) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    lease_renewed_at = NULL,
    lease_began_at = NULL
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence,
             json_extract(value, '$[2]') AS client, json_extract(value, '$[3]') AS lease,
             json_extract(value, '$[4]') AS state, json_extract(value, '$[5]') AS scheduled_at,
             json_extract(value, '$[6]') AS snooze, json_extract(value, '$[7]') AS snooze_reason,
             json_extract(value, '$[8]') AS error
      FROM json_each(%(results)s)) AS r
WHERE hopper_job.id = r.id
  AND +hopper_job.state = 'running'
  AND hopper_job.fence = r.fence
  AND CASE WHEN r.lease IS NULL THEN hopper_job.lease_token IS NULL AND hopper_job.attempted_by = r.client
           ELSE hopper_job.lease_token = r.lease END
  AND r.state IN ('retryable', 'scheduled')
  AND hopper_job.cancel_requested_at IS NULL
RETURNING id, fence, attempt;

-- name: job_finalize_many.log_unsnooze
-- A snooze (with a log or without) drops the earlier snooze log of the same attempt.
-- %(logs)s: [job_id, attempt, snoozed (0/1)], one per snoozing result.
DELETE FROM hopper_job_log
WHERE snoozed
  AND (job_id, attempt) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
      FROM json_each(%(logs)s)
      WHERE json_extract(value, '$[2]'));

-- name: job_finalize_many.log
INSERT INTO hopper_job_log (job_id, attempt, snoozed, log, created_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), %(now)s
FROM json_each(%(logs)s);

-- name: job_finalize_many.log_keep
-- Keep only the newest %(keep)s log rows of each job in %(ids)s.
DELETE FROM hopper_job_log
WHERE id IN (
    SELECT id
    FROM (SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY id DESC) AS n
          FROM hopper_job_log
          WHERE job_id IN (SELECT value FROM json_each(%(ids)s)))
    WHERE n > %(keep)s);

-- name: job_finalize_many.log_delete
-- Logs of jobs completed without archive go with them.
DELETE FROM hopper_job_log
WHERE job_id IN (SELECT value FROM json_each(%(ids)s));

-- name: job_finalize_many.checkpoint
-- Copy the WAL's committed frames into the database file without waiting for
-- anyone (support.SQLiteSupport._checkpoint_after): (busy, frames in the WAL,
-- frames copied); -1 frames when the database is not in WAL mode.
PRAGMA wal_checkpoint(PASSIVE);

-- name: job_finalize_many.busy_timeout
PRAGMA busy_timeout;

-- name: job_finalize_many.busy_timeout_set
PRAGMA busy_timeout = {ms};


-- name: job_record_progress
-- Fenced like a finalize, and on the attempt. %(progress)s is the JSON text to store;
-- with %(keep_step)s its step is replaced by the stored one.
UPDATE hopper_job
SET progress = CASE WHEN %(keep_step)s
                    THEN json_set(%(progress)s, '$.step',
                                  coalesce(CASE WHEN json_valid(progress)
                                           THEN json_extract(progress, '$.step') END, ''))
                    ELSE json(%(progress)s) END
WHERE id = %(id)s
  AND state = 'running'
  AND fence = %(fence)s
  AND attempt = %(attempt)s
  AND CASE WHEN %(lease)s IS NULL THEN lease_token IS NULL AND attempted_by = %(client)s
           ELSE lease_token = %(lease)s END
RETURNING progress;

-- name: job_record_progress.busy_timeout
PRAGMA busy_timeout;

-- name: job_record_progress.busy_timeout_set
PRAGMA busy_timeout = {ms};


-- name: job_get
-- Live first, then history (NULL sorts first).
SELECT {job_columns}
FROM hopper_job
WHERE id = %(id)s
UNION ALL
SELECT {job_columns_history}
FROM hopper_job_history
WHERE id = %(id)s
ORDER BY finalized_at
LIMIT 1;


-- name: job_logs
SELECT attempt, snoozed, log
FROM hopper_job_log
WHERE job_id = %(id)s
ORDER BY id;


-- fragment: job_list_where
-- job_list's filters, the same for both tables.
  AND id /*IF NEWEST_FIRST*/</*ELSE*/>/*END*/ %(after)s
  AND (%(queue)s IS NULL OR queue = %(queue)s)
  AND (%(ordering_key)s IS NULL OR ordering_key = %(ordering_key)s)
  AND (%(kinds)s IS NULL OR kind IN (SELECT value FROM json_each(%(kinds)s)))
  AND (%(states)s IS NULL OR state IN (SELECT value FROM json_each(%(states)s)))
  AND (%(ids)s IS NULL OR id IN (SELECT value FROM json_each(%(ids)s)))
  AND (%(priorities)s IS NULL OR priority IN (SELECT value FROM json_each(%(priorities)s)))
  AND (%(tags_any)s IS NULL OR EXISTS (
        SELECT 1 FROM json_each(CASE WHEN json_valid(tags) THEN tags ELSE '[]' END) AS t
        WHERE t.value IN (SELECT value FROM json_each(%(tags_any)s))))
  AND (%(tags_all)s IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(%(tags_all)s) AS w
        WHERE w.value NOT IN (SELECT value FROM json_each(
            CASE WHEN json_valid(tags) THEN tags ELSE '[]' END))))
  AND (%(metadata)s IS NULL OR hopper_json_contains(metadata, %(metadata)s))

-- name: job_list
-- variant: job_list.newest_first NEWEST_FIRST
-- Live and history together in ID order (NEWEST_FIRST: descending). Unset filters
-- are NULL; list filters are JSON arrays. %(after)s is '' when unset ('g' newest
-- first: every hex ID sorts between), which keeps the ID range usable by the primary
-- key index. %(live)s and %(history)s say which tables the states filter reads.
SELECT {job_columns}
FROM hopper_job
WHERE %(live)s
{job_list_where}
UNION ALL
SELECT {job_columns_history}
FROM hopper_job_history
WHERE %(history)s
{job_list_where}
ORDER BY id/*IF NEWEST_FIRST*/ DESC/*END*/
LIMIT %(limit)s;


-- name: job_discard_expired
-- Waiting jobs past their TTL go to history as discarded.
INSERT INTO hopper_job_history ({job_columns_history})
SELECT id, kind, queue, 'discarded', priority, attempt, max_attempts, scheduled_at,
       attempted_at, attempted_by, fence, args, {history_metadata},
       hopper_json_append(errors, json_object('at', %(at)s, 'attempt', attempt,
                                               'error', 'expired before it could run',
                                               'rescue', 'ttl_expired')),
       unique_key, ordering_key, partition_key, tags, batch_id, expires_at,
       cancel_requested_at, awaited, created_at, NULL, progress, NULL, NULL, NULL,
       step, subject, erased_at, %(now)s, NULL
FROM hopper_job
WHERE id IN (
    SELECT id
    FROM hopper_job
    WHERE +state IN ('pending', 'available', 'scheduled', 'retryable')
      AND expires_at <= %(now)s
    ORDER BY expires_at, id
    LIMIT %(limit)s)
RETURNING {job_columns_history};

-- name: job_discard_expired.delete
DELETE FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s));


-- name: job_rescue_candidates
-- Running jobs without a job lease whose client has no live lease (stuck = 0), and,
-- when %(stuck_before)s is set, running jobs without a job lease claimed at or
-- before it (stuck = 1). A job under a job lease is never a candidate: its lease
-- says whether it is alive (job_expire_leases ends it), and a finalize fenced to a
-- client claim could never end it, so it would come back every pass and take a
-- place of the limit.
SELECT CASE WHEN j.lease_token IS NULL
                 AND NOT EXISTS (SELECT 1 FROM hopper_client AS c
                                 WHERE c.id = j.attempted_by AND c.expires_at > %(now)s)
            THEN 0 ELSE 1 END AS stuck,
       {job_columns:j}, j.claimed_ahead_at IS NOT NULL AS ahead
FROM hopper_job AS j
WHERE j.state = 'running'
  AND ((j.lease_token IS NULL
        AND NOT EXISTS (SELECT 1 FROM hopper_client AS c
                        WHERE c.id = j.attempted_by AND c.expires_at > %(now)s))
       OR (%(stuck_before)s IS NOT NULL AND j.lease_token IS NULL
           AND j.attempted_at <= %(stuck_before)s))
ORDER BY j.attempted_at, j.id
LIMIT %(limit)s;
