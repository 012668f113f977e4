-- Periodic slots and registrations on SQLite. Same conventions as
-- jobs.sql: %(name)s parameters, times as fixed-width UTC text.

-- name: periodic_insert
-- Record the slot only if it is later than the recorded one; the job is then
-- inserted by job_insert_many in the same (single-writer) transaction. A
-- disabled job records (and inserts) nothing.
INSERT INTO hopper_periodic_slot (name, last_slot, job_id, inserted_at)
VALUES (%(name)s, %(slot)s, %(job_id)s, %(now)s)
ON CONFLICT (name) DO UPDATE
   SET last_slot = excluded.last_slot,
       job_id = excluded.job_id,
       inserted_at = excluded.inserted_at
 WHERE (hopper_periodic_slot.last_slot IS NULL
        OR hopper_periodic_slot.last_slot < excluded.last_slot)
   AND hopper_periodic_slot.disabled_at IS NULL
RETURNING name;

-- name: periodic_insert.job_id
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
VALUES (%(name)s, %(now)s)
ON CONFLICT (name) DO UPDATE
   SET disabled_at = coalesce(hopper_periodic_slot.disabled_at, excluded.disabled_at)
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
                         ELSE %(now)s END
RETURNING name, last_slot, job_id, inserted_at, disabled_at, enabled_at;

-- name: periodic_register
SELECT id FROM hopper_client WHERE id = %(client_id)s AND expires_at > %(now)s;

-- name: periodic_register.delete
DELETE FROM hopper_periodic_registration
 WHERE client_id = %(client_id)s
    OR client_id NOT IN (SELECT id FROM hopper_client);

-- name: periodic_register.insert
INSERT INTO hopper_periodic_registration (client_id, name, definition, digest, registered_at)
SELECT %(client_id)s,
       json_extract(r.value, '$.name'),
       json(json_extract(r.value, '$.definition')),
       json_extract(r.value, '$.digest'),
       %(now)s
  FROM json_each(%(registrations)s) AS r;

-- name: periodic_registrations
SELECT r.name, r.definition, r.digest, r.client_id, c.started_at, r.registered_at
  FROM hopper_periodic_registration r
  JOIN hopper_client c ON c.id = r.client_id
 WHERE c.expires_at > %(now)s
 ORDER BY r.name, c.started_at DESC, r.client_id DESC;
