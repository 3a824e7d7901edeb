-- 0016_job_schedules: the schedules of periodic jobs (lease_server/queue/schedules.py).
--
-- Creates table job_schedules (one row per name) and
--   function job_schedule_put(name, queue, cron, every_ms, timezone, payload, priority,
--                             max_attempts, resource, catch_up) -> the stored row
--
-- A schedule's jobs are ordinary jobs (0003) whose idempotency key names the schedule and
-- the period: 'periodic:<name>:<period start in Unix ms>'. The unique index
-- jobs_idempotency_key and job_enqueue's INSERT ... ON CONFLICT DO NOTHING make that one
-- job per period however many lease servers enqueue it at once: the second insert of a
-- key waits for the first transaction and then finds its row (no check-then-insert).
-- last_period_ms / last_job_id are bookkeeping, raised (never lowered) in the enqueue's
-- transaction by lease_server/queue/backends/postgres.py: where a scheduler resumes, and
-- what keeps a period whose job was pruned from being enqueued again. Times are Unix ms
-- on the database's clock.

CREATE TABLE job_schedules (
    name           text PRIMARY KEY,
    queue          text NOT NULL,
    cron           text NOT NULL DEFAULT '',
    every_ms       bigint NOT NULL DEFAULT 0 CHECK (every_ms >= 0),
    timezone       text NOT NULL DEFAULT '',
    payload        bytea NOT NULL,
    priority       integer NOT NULL DEFAULT 0,
    max_attempts   integer NOT NULL CHECK (max_attempts > 0),
    resource       text NOT NULL DEFAULT '',
    catch_up       integer NOT NULL DEFAULT 0 CHECK (catch_up >= 0),
    created_at_ms  bigint NOT NULL,
    last_period_ms bigint NOT NULL DEFAULT 0,
    last_job_id    bigint NOT NULL DEFAULT 0,
    CHECK ((cron <> '') <> (every_ms > 0))
);

-- Add a schedule or replace the template and timing of the one of that name, keeping
-- its creation time and last period (so a change never enqueues a period again).
CREATE FUNCTION job_schedule_put(
    p_name text, p_queue text, p_cron text, p_every_ms bigint, p_timezone text,
    p_payload bytea, p_priority integer, p_max_attempts integer, p_resource text,
    p_catch_up integer
)
RETURNS SETOF job_schedules
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO job_schedules AS s (name, queue, cron, every_ms, timezone, payload, priority,
                                    max_attempts, resource, catch_up, created_at_ms)
    VALUES (p_name, p_queue, p_cron, p_every_ms, p_timezone, p_payload, p_priority,
            p_max_attempts, p_resource, p_catch_up, job_ms(now()))
    ON CONFLICT (name) DO UPDATE SET
        queue = excluded.queue, cron = excluded.cron, every_ms = excluded.every_ms,
        timezone = excluded.timezone, payload = excluded.payload,
        priority = excluded.priority, max_attempts = excluded.max_attempts,
        resource = excluded.resource, catch_up = excluded.catch_up
    RETURNING s.*;
$$;
