-- Periodic slots and registrations.

-- name: periodic_insert
-- Record the slot only if it is later than the recorded one. Of two leaders,
-- the second waits on the row (or the speculative insert) and then finds the
-- WHERE false: a slot is recorded, and so inserted, at most once. The job
-- itself is inserted by job_insert_many in the same transaction. A disabled
-- job records (and inserts) nothing: a disable and a slot serialize on the row.
INSERT INTO hopper_periodic_slot (name, last_slot, job_id, inserted_at)
VALUES (%(name)s, %(slot)s, %(job_id)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
   SET last_slot = EXCLUDED.last_slot,
       job_id = EXCLUDED.job_id,
       inserted_at = EXCLUDED.inserted_at
 WHERE (hopper_periodic_slot.last_slot IS NULL
        OR hopper_periodic_slot.last_slot < EXCLUDED.last_slot)
   AND hopper_periodic_slot.disabled_at IS NULL
RETURNING name;

-- name: periodic_insert.job_id
-- The job was a unique-key duplicate: the slot points at the existing job.
UPDATE hopper_periodic_slot SET job_id = %(job_id)s WHERE name = %(name)s;

-- name: periodic_last_slots
SELECT name, last_slot FROM hopper_periodic_slot WHERE last_slot IS NOT NULL ORDER BY name;

-- name: periodic_list
SELECT name, last_slot, job_id, inserted_at, disabled_at, enabled_at
  FROM hopper_periodic_slot
 ORDER BY name;

-- name: periodic_disable
-- Creates the state row of a job that has no slot yet; keeps the first disable.
INSERT INTO hopper_periodic_slot (name, disabled_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
   SET disabled_at = coalesce(hopper_periodic_slot.disabled_at, EXCLUDED.disabled_at)
RETURNING name, last_slot, job_id, inserted_at, disabled_at, enabled_at;

-- name: periodic_enable
-- enabled_at settles the slots that fell while disabled: none of them is caught
-- up. Enabling an enabled job changes nothing.
INSERT INTO hopper_periodic_slot (name)
VALUES (%(name)s)
ON CONFLICT (name) DO UPDATE
   SET disabled_at = NULL,
       enabled_at = CASE WHEN hopper_periodic_slot.disabled_at IS NULL
                         THEN hopper_periodic_slot.enabled_at
                         ELSE coalesce(%(now)s::timestamptz, now()) END
RETURNING name, last_slot, job_id, inserted_at, disabled_at, enabled_at;

-- name: periodic_register
-- Lock the client's row so that a concurrent prune or delete waits for this
-- transaction; no row (expired or deleted) means nothing is recorded.
SELECT id FROM hopper_client
 WHERE id = %(client_id)s AND expires_at > coalesce(%(now)s::timestamptz, now())
   FOR SHARE;

-- name: periodic_register.delete
DELETE FROM hopper_periodic_registration r
 WHERE r.client_id = %(client_id)s
    OR NOT EXISTS (SELECT 1 FROM hopper_client c WHERE c.id = r.client_id);

-- name: periodic_register.insert
INSERT INTO hopper_periodic_registration (client_id, name, definition, digest, registered_at)
SELECT %(client_id)s, r.name, r.definition, r.digest, coalesce(%(now)s::timestamptz, now())
  FROM jsonb_to_recordset(%(registrations)s::jsonb)
       AS r(name text, definition jsonb, digest text);

-- name: periodic_registrations
SELECT r.name, r.definition, r.digest, r.client_id, c.started_at, r.registered_at
  FROM hopper_periodic_registration r
  JOIN hopper_client c ON c.id = r.client_id
 WHERE c.expires_at > coalesce(%(now)s::timestamptz, now())
 ORDER BY r.name, c.started_at DESC, r.client_id DESC;
