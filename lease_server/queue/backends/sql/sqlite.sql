-- The SQLite queue backend's statements (lease_server/queue/backends/sqlite.py).
--
-- Every call runs inside one BEGIN IMMEDIATE transaction (the database-wide write
-- lock stands in for FOR UPDATE SKIP LOCKED: claims serialise, and nothing can
-- change a row between the SELECT that picks it and the UPDATE that writes it).
-- Times are integer milliseconds on the server's clock. Columns of a job, in the
-- order every SELECT returns them (JOB_COLUMNS in sqlite.py):
--   id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
--   attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
--   last_error, created_at_ms, finished_at_ms, claimed_at_ms (from schema v3)

-- name: migration_1
-- Schema v1. jobs: one row per job, ids never reused (AUTOINCREMENT), so a pruned
-- job's resource name is never handed to another job. counters: the token counter,
-- never reset, so every claim's token exceeds every earlier claim's. Partial
-- indexes keep claims off finished rows however large the table grows.
-- (No semicolons inside these comments: the migration runner splits on them.)
CREATE TABLE jobs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    queue           TEXT NOT NULL,
    payload         BLOB NOT NULL,
    state           TEXT NOT NULL
                    CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead')),
    resource        TEXT NOT NULL DEFAULT '',
    ordering_key    TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT,
    priority        INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts > 0),
    token           INTEGER NOT NULL DEFAULT 0,
    available_at_ms INTEGER NOT NULL,
    lease_owner     TEXT NOT NULL DEFAULT '',
    lease_until_ms  INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, available_at_ms, id)
    WHERE state = 'ready';
CREATE INDEX jobs_running ON jobs (queue, lease_until_ms)
    WHERE state = 'running';
CREATE INDEX jobs_live_by_key ON jobs (queue, ordering_key, id)
    WHERE ordering_key <> '' AND state IN ('waiting', 'ready', 'running');
CREATE UNIQUE INDEX jobs_one_running_per_key ON jobs (queue, ordering_key)
    WHERE ordering_key <> '' AND state = 'running';
CREATE INDEX jobs_finished ON jobs (state, finished_at_ms)
    WHERE state IN ('succeeded', 'dead');
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL CHECK (value >= 0)
) WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('token', 0)

-- name: migration_2
-- Schema v2: jobs by their own guard resource, for the lease service's Describe.
CREATE INDEX jobs_by_resource ON jobs (resource) WHERE resource <> ''

-- name: migration_3
-- Schema v3, for the operators' calls (list, cancel, retry). The state 'cancelled'
-- (SQLite cannot change a CHECK in place, so the table is rebuilt: copied into a new
-- table, which takes the old one's name and the AUTOINCREMENT high-water mark, so
-- ids stay never reused), claimed_at_ms (when the current or last claim was made),
-- and an index for listing a queue's jobs in id order (a state filter is applied
-- along it: an index with the state would draw claims away from jobs_ready).
CREATE TABLE jobs_v3 (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    queue           TEXT NOT NULL,
    payload         BLOB NOT NULL,
    state           TEXT NOT NULL
                    CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead',
                                     'cancelled')),
    resource        TEXT NOT NULL DEFAULT '',
    ordering_key    TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT,
    priority        INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts > 0),
    token           INTEGER NOT NULL DEFAULT 0,
    available_at_ms INTEGER NOT NULL,
    lease_owner     TEXT NOT NULL DEFAULT '',
    lease_until_ms  INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER NOT NULL DEFAULT 0,
    claimed_at_ms   INTEGER NOT NULL DEFAULT 0
);
INSERT INTO jobs_v3 (id, queue, payload, state, resource, ordering_key, idempotency_key,
                     priority, attempts, max_attempts, token, available_at_ms, lease_owner,
                     lease_until_ms, last_error, created_at_ms, finished_at_ms)
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms
FROM jobs;
DELETE FROM sqlite_sequence WHERE name = 'jobs_v3';
INSERT INTO sqlite_sequence (name, seq) SELECT 'jobs_v3', seq FROM sqlite_sequence
WHERE name = 'jobs';
DROP TABLE jobs;
ALTER TABLE jobs_v3 RENAME TO jobs;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, available_at_ms, id)
    WHERE state = 'ready';
CREATE INDEX jobs_running ON jobs (queue, lease_until_ms)
    WHERE state = 'running';
CREATE INDEX jobs_live_by_key ON jobs (queue, ordering_key, id)
    WHERE ordering_key <> '' AND state IN ('waiting', 'ready', 'running');
CREATE UNIQUE INDEX jobs_one_running_per_key ON jobs (queue, ordering_key)
    WHERE ordering_key <> '' AND state = 'running';
CREATE INDEX jobs_finished ON jobs (state, finished_at_ms)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX jobs_by_resource ON jobs (resource) WHERE resource <> '';
CREATE INDEX jobs_by_queue ON jobs (queue, id)

-- name: migration_4
-- Schema: the schedules of periodic jobs (lease_server/queue/schedules.py), one row per
-- schedule, keyed by its name: the job template, a cron expression (with its time zone) or an interval in ms,
-- the catch-up bound, when it was created and the latest period enqueued with that
-- period's job. The jobs themselves are ordinary jobs whose idempotency key names the
-- schedule and the period (jobs_idempotency_key makes it one job per period).
-- IF NOT EXISTS: safe whatever number this migration ends up with.
CREATE TABLE IF NOT EXISTS schedules (
    name           TEXT PRIMARY KEY,
    queue          TEXT NOT NULL,
    cron           TEXT NOT NULL DEFAULT '',
    every_ms       INTEGER NOT NULL DEFAULT 0 CHECK (every_ms >= 0),
    timezone       TEXT NOT NULL DEFAULT '',
    payload        BLOB NOT NULL,
    priority       INTEGER NOT NULL DEFAULT 0,
    max_attempts   INTEGER NOT NULL CHECK (max_attempts > 0),
    resource       TEXT NOT NULL DEFAULT '',
    catch_up       INTEGER NOT NULL DEFAULT 0 CHECK (catch_up >= 0),
    created_at_ms  INTEGER NOT NULL,
    last_period_ms INTEGER NOT NULL DEFAULT 0,
    last_job_id    INTEGER NOT NULL DEFAULT 0,
    CHECK ((cron <> '') <> (every_ms > 0))
) WITHOUT ROWID
-- name: migration_5
-- Schema v5: the request id of the Claim that made each job's current (or last) claim,
-- so a retried Claim (its reply was lost) gets those jobs back instead of new ones
-- (lease_server/queue/jobs.py, replay). Indexed only while running under a request id:
-- the replay's lookup never scans, and claims without one cost no index entry.
ALTER TABLE jobs ADD COLUMN claim_request_id TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_by_claim_request ON jobs (queue, claim_request_id)
    WHERE state = 'running' AND claim_request_id <> ''

-- name: migration_6
-- Schema v6: the paused queues (PauseQueue/ResumeQueue): one row each, resume deletes
-- it. A paused queue hands out no claims, everything else goes on.
CREATE TABLE queue_pauses (queue TEXT PRIMARY KEY, paused_at_ms INTEGER NOT NULL)

-- name: migration_7
-- Schema v7: the attempts' history of each job (lease_server/queue/jobs.py,
-- attempt_changes): one row per claim, in the order they were made (id), written in the
-- transaction that changes the claim. At most one row of a job is running, and only the
-- newest MAX_JOB_ATTEMPTS_KEPT (fencing/limits.py) of a job are kept (trim_attempts).
-- Jobs of earlier schemas start with none. Deleted with their job by prune (no trigger:
-- the migration runner splits statements on semicolons).
CREATE TABLE job_attempts (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    worker        TEXT NOT NULL,
    token         INTEGER NOT NULL,
    outcome       TEXT NOT NULL
                  CHECK (outcome IN ('running', 'succeeded', 'failed', 'expired', 'released',
                                     'cancelled')),
    ended_at_ms   INTEGER NOT NULL DEFAULT 0,
    error         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX job_attempts_by_job ON job_attempts (job_id, id);
CREATE UNIQUE INDEX job_attempts_running ON job_attempts (job_id) WHERE outcome = 'running'

-- name: pause_queue
-- Pause a queue. Takes queue, now.
INSERT OR IGNORE INTO queue_pauses (queue, paused_at_ms) VALUES (?, ?)

-- name: resume_queue
-- Resume a queue. Takes queue.
DELETE FROM queue_pauses WHERE queue = ?

-- name: select_paused
-- Whether one queue is paused. Takes queue.
SELECT 1 FROM queue_pauses WHERE queue = ?

-- name: select_paused_all
-- Every paused queue.
SELECT queue FROM queue_pauses ORDER BY queue

-- Columns of an attempt, in the order the attempt statements take and return them:
--   attempt, started_at_ms, worker, token, outcome, ended_at_ms, error

-- name: select_attempts
-- A job's attempts kept, oldest first. Takes job_id.
SELECT attempt, started_at_ms, worker, token, outcome, ended_at_ms, error
FROM job_attempts WHERE job_id = ? ORDER BY id

-- name: replace_running_attempt
-- The job's running attempt as it is now (ended, or with a new token). Takes the
-- attempt's columns, job_id. Row count = 0 when the job has no running attempt.
UPDATE job_attempts
SET attempt = ?, started_at_ms = ?, worker = ?, token = ?, outcome = ?, ended_at_ms = ?,
    error = ?
WHERE job_id = ? AND outcome = 'running'

-- name: insert_attempt
-- A new attempt, after the job's others. Takes job_id, then the attempt's columns.
INSERT INTO job_attempts (job_id, attempt, started_at_ms, worker, token, outcome,
                          ended_at_ms, error)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)

-- name: trim_attempts
-- Keep only a job's newest attempts. Takes job_id, job_id, how many to keep.
DELETE FROM job_attempts
WHERE job_id = ? AND id NOT IN (
    SELECT id FROM job_attempts WHERE job_id = ? ORDER BY id DESC LIMIT ?
)

-- name: delete_attempts
-- A deleted job's attempts. Takes job_id.
DELETE FROM job_attempts WHERE job_id = ?

-- name: select_job
-- One job by id. Takes id.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs WHERE id = ?

-- name: select_by_idempotency_key
-- The job of a queue with an idempotency key, if any. Takes queue, idempotency_key.
-- Returns id, state.
SELECT id, state FROM jobs WHERE queue = ? AND idempotency_key = ?

-- name: select_head_of_key
-- The earliest live job of an ordering key (its head), if any. Takes queue, key.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE queue = ? AND ordering_key = ? AND state IN ('waiting', 'ready', 'running')
ORDER BY id LIMIT 1

-- name: insert_job
-- A new job. Takes queue, payload, state, resource, ordering_key, idempotency_key
-- (NULL for none), priority, max_attempts, available_at_ms, created_at_ms.
-- Returns id.
INSERT INTO jobs (queue, payload, state, resource, ordering_key, idempotency_key,
                  priority, max_attempts, available_at_ms, created_at_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING id

-- name: take_tokens
-- Reserve n tokens. Takes n. Returns the last one reserved (the first is last - n + 1).
UPDATE counters SET value = value + ? WHERE name = 'token' RETURNING value

-- name: select_rescuable
-- Running jobs of a queue whose lease expired with attempts left, oldest expiry
-- first. Takes queue, now_ms, limit.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE queue = ? AND state = 'running' AND lease_until_ms <= ? AND attempts < max_attempts
ORDER BY lease_until_ms, id
LIMIT ?

-- name: select_ready
-- Ready, due jobs of a queue in claim order (jobs_ready index). Takes queue, now_ms, limit.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE queue = ? AND state = 'ready' AND available_at_ms <= ?
ORDER BY priority DESC, available_at_ms, id
LIMIT ?

-- name: select_claim_replay
-- The jobs of a queue running under a Claim's request id (its retry replays them), by
-- id. Takes queue, request_id.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE queue = ? AND state = 'running' AND claim_request_id = ? AND claim_request_id <> ''
ORDER BY id

-- name: set_claim_request
-- The request id of the Claim that just claimed a job. Takes request_id, id.
UPDATE jobs SET claim_request_id = ? WHERE id = ?

-- name: update_job
-- Write back the mutable columns of one job. Takes state, attempts, max_attempts,
-- token, available_at_ms, lease_owner, lease_until_ms, last_error, finished_at_ms,
-- claimed_at_ms, id.
UPDATE jobs
SET state = ?, attempts = ?, max_attempts = ?, token = ?, available_at_ms = ?,
    lease_owner = ?, lease_until_ms = ?, last_error = ?, finished_at_ms = ?,
    claimed_at_ms = ?
WHERE id = ?

-- name: select_reapable
-- Running jobs whose final attempt's lease expired (any queue). Takes now_ms, limit.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE state = 'running' AND lease_until_ms <= ? AND attempts >= max_attempts
ORDER BY id
LIMIT ?

-- name: prune
-- Delete up to limit jobs in a finished state that finished before a cutoff.
-- Takes state, before_ms, limit. Returns the ids deleted (their attempts go next).
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs WHERE state = ? AND finished_at_ms < ? LIMIT ?
)
RETURNING id

-- name: stats
-- Counts per queue. Takes :now, :since (now - window), :queue ('' for all).
-- Returns queue, ready, scheduled, waiting, running, expired, succeeded, dead,
-- cancelled, oldest ready available_at_ms (NULL if none), retrying, finished in window,
-- attempts of those.
SELECT queue,
       sum(state = 'ready' AND available_at_ms <= :now),
       sum(state = 'ready' AND available_at_ms > :now),
       sum(state = 'waiting'),
       sum(state = 'running'),
       sum(state = 'running' AND lease_until_ms <= :now),
       sum(state = 'succeeded'),
       sum(state = 'dead'),
       sum(state = 'cancelled'),
       min(CASE WHEN state = 'ready' AND available_at_ms <= :now THEN available_at_ms END),
       sum(state IN ('ready', 'waiting') AND attempts > 0),
       sum(state IN ('succeeded', 'dead') AND finished_at_ms >= :since),
       sum(CASE WHEN state IN ('succeeded', 'dead') AND finished_at_ms >= :since
                THEN attempts ELSE 0 END)
FROM jobs
WHERE :queue = '' OR queue = :queue
GROUP BY queue
ORDER BY queue

-- name: list_jobs
-- A page of a queue's jobs in id order (jobs_by_queue). Takes
-- :queue, :state ('' for every state; 'scheduled' and 'ready' are the stored ready jobs
-- not yet due and due at :now, as jobs.listed shows them), :after (the last id of the
-- previous page, 0 for the first), :limit, :now.
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, available_at_ms, lease_owner, lease_until_ms,
       last_error, created_at_ms, finished_at_ms, claimed_at_ms
FROM jobs
WHERE queue = :queue AND id > :after
  AND CASE :state WHEN '' THEN 1
                  WHEN 'scheduled' THEN state = 'ready' AND available_at_ms > :now
                  WHEN 'ready' THEN state = 'ready' AND available_at_ms <= :now
                  ELSE state = :state END
ORDER BY id
LIMIT :limit

-- name: log_head
-- The head of the attached lease database's event log (lease_server/backends/sqlite.py),
-- read inside the write transaction that appends after it. Returns head.
SELECT head FROM lease_log.event_log WHERE id = 1

-- name: log_append
-- One job event in the attached lease log. Takes revision, kind, resource, token, holder,
-- ttl_ms, job_id, queue.
INSERT INTO lease_log.events (revision, kind, resource, token, holder, ttl_ms, job_id, queue)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)

-- name: log_set_head
-- Move the attached lease log's head to the last revision appended. Takes head.
UPDATE lease_log.event_log SET head = ? WHERE id = 1

-- name: last_token_of_resource
-- The highest token of the jobs enqueued with a guard resource. Takes resource.
-- Returns max(token) (NULL if none).
SELECT max(token) FROM jobs WHERE resource = ? AND resource <> ''

-- name: token_of_default_resource
-- The token of a job whose guard resource is its default (job/<queue>/<id>).
-- Takes id, queue. Returns token.
SELECT token FROM jobs WHERE id = ? AND queue = ? AND resource = ''

-- Columns of a schedule, in the order every schedule statement returns them:
--   name, queue, cron, every_ms, timezone, payload, priority, max_attempts, resource,
--   catch_up, created_at_ms, last_period_ms, last_job_id

-- name: put_schedule
-- Add a schedule or replace the template and timing of the one of that name, keeping
-- its created_at_ms, last_period_ms and last_job_id. Takes name, queue, cron, every_ms,
-- timezone, payload, priority, max_attempts, resource, catch_up, created_at_ms.
-- Returns the stored row.
INSERT INTO schedules (name, queue, cron, every_ms, timezone, payload, priority,
                       max_attempts, resource, catch_up, created_at_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET
    queue = excluded.queue, cron = excluded.cron, every_ms = excluded.every_ms,
    timezone = excluded.timezone, payload = excluded.payload,
    priority = excluded.priority, max_attempts = excluded.max_attempts,
    resource = excluded.resource, catch_up = excluded.catch_up
RETURNING name, queue, cron, every_ms, timezone, payload, priority, max_attempts,
          resource, catch_up, created_at_ms, last_period_ms, last_job_id

-- name: delete_schedule
-- Remove a schedule, of any queue when queue is ''. Takes name, queue, queue.
-- Row count = 1 if it existed.
DELETE FROM schedules WHERE name = ? AND (? = '' OR queue = ?)

-- name: select_schedules
-- Every schedule, by name.
SELECT name, queue, cron, every_ms, timezone, payload, priority, max_attempts,
       resource, catch_up, created_at_ms, last_period_ms, last_job_id
FROM schedules ORDER BY name

-- name: select_schedule
-- One schedule. Takes name.
SELECT name, queue, cron, every_ms, timezone, payload, priority, max_attempts,
       resource, catch_up, created_at_ms, last_period_ms, last_job_id
FROM schedules WHERE name = ?

-- name: set_schedule_period
-- Raise a schedule's last period (never lower it) with that period's job. Takes
-- period_ms, job_id, name, period_ms.
UPDATE schedules SET last_period_ms = ?, last_job_id = ?
WHERE name = ? AND last_period_ms <= ?
