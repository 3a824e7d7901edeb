-- 0026_job_attempts: the attempts' history of each job (GetJob's JobInfo.history).
--
-- Adds table       job_attempts (one row per claim of a job, in the order they were
--                  made: seq; deleted with their job, ON DELETE CASCADE, so job_prune
--                  and your own DELETEs take them along)
--      function    job_attempts_kept() -> the attempts kept per job (the newest 20:
--                  fencing/limits.py MAX_JOB_ATTEMPTS_KEPT, which the contract suite
--                  holds this to)
--      view        job_attempt_rows (an attempt as the backend reads it, times in ms)
--      trigger     jobs_record_attempts on jobs (function job_record_attempts)
--
-- The rule is lease_server/queue/jobs.py attempt_changes/apply_attempts (the contract
-- suite tests/contract/test_queue_history.py holds memory, SQLite and this to it):
-- - a claim or a rescue (the job runs with more attempts than it had) adds a running
--   attempt: its number, the claim's time, worker and token;
-- - the running claim ends when the job no longer runs or a rescue took it over:
--   'expired' (a rescue, or the reaper's 'lease expired after the final attempt'),
--   'succeeded', 'cancelled', 'released' (ready with one attempt fewer: it did not
--   count), 'failed' otherwise; failed, expired and cancelled attempts keep the job's
--   last_error (already cut to 4,096 bytes by whoever wrote it: the backend's Fail and
--   cancel truncate, the SQL functions write short constants);
-- - a running job whose token alone changed (a job naming its own resource took its
--   lease's token) keeps its attempt, with that token.
-- The ended attempt replaces the job's running one, or is added when there is none (a
-- claim made before this migration), so jobs of earlier releases start with an empty
-- history and no path fails on them.
-- A trigger, not the job_* functions, so that every path that changes a claim records
-- it in its own transaction: job_claim, job_complete(_batch), job_release, job_reap, the
-- backend's Fail, cancel and retoken (Python, in a transaction) and your own SQL alike,
-- as jobs_log_claims (0011) logs their events. Heartbeats, replays and enqueues touch no
-- attempt row. Lock order: the job rows (the UPDATE holds them), then their attempts;
-- nothing locks an attempt row first.

CREATE TABLE job_attempts (
    job_id     bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    attempt    integer NOT NULL,
    started_at timestamptz,
    worker     text NOT NULL,
    token      bigint NOT NULL,
    outcome    text NOT NULL
               CHECK (outcome IN ('running', 'succeeded', 'failed', 'expired', 'released',
                                  'cancelled')),
    ended_at   timestamptz,
    error      text NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, seq),
    CHECK ((outcome = 'running') = (ended_at IS NULL))
);

-- At most one running attempt per job: the one an end replaces.
CREATE UNIQUE INDEX job_attempts_running ON job_attempts (job_id) WHERE outcome = 'running';

CREATE FUNCTION job_attempts_kept() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 20 $$;

CREATE VIEW job_attempt_rows AS
SELECT job_id, seq, attempt, job_ms(started_at) AS started_at_ms, worker, token, outcome,
       job_ms(ended_at) AS ended_at_ms, error
FROM job_attempts;

CREATE FUNCTION job_record_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c record;
    v_outcome text;
    v_token bigint;
    v_ended timestamptz;
BEGIN
    FOR c IN
        SELECT n.id, n.state, n.attempts, n.token, n.lease_owner, n.claimed_at,
               n.last_error, o.state AS old_state, o.attempts AS old_attempts,
               o.token AS old_token, o.lease_owner AS old_owner,
               o.claimed_at AS old_claimed_at,
               (n.state = 'running' AND n.attempts > o.attempts) AS rescued
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE (o.state = 'running'
               AND (n.state <> 'running' OR n.token <> o.token OR n.attempts > o.attempts))
           OR (n.state = 'running' AND o.state <> 'running')
        ORDER BY n.id
    LOOP
        IF c.old_state = 'running' THEN
            IF c.rescued OR c.state <> 'running' THEN
                v_outcome := CASE
                    WHEN c.rescued OR (c.state = 'dead'
                                       AND c.last_error = 'lease expired after the final attempt')
                        THEN 'expired'
                    WHEN c.state = 'succeeded' THEN 'succeeded'
                    WHEN c.state = 'cancelled' THEN 'cancelled'
                    WHEN c.state = 'ready' AND c.attempts < c.old_attempts THEN 'released'
                    ELSE 'failed' END;
                v_token := c.old_token;
                v_ended := now();
            ELSE
                v_outcome := 'running';
                v_token := c.token;
                v_ended := NULL;
            END IF;
            UPDATE job_attempts AS a
            SET attempt = c.old_attempts, started_at = c.old_claimed_at, worker = c.old_owner,
                token = v_token, outcome = v_outcome, ended_at = v_ended,
                error = CASE WHEN v_outcome IN ('failed', 'expired', 'cancelled')
                             THEN c.last_error ELSE '' END
            WHERE a.job_id = c.id AND a.outcome = 'running';
            IF NOT FOUND THEN
                INSERT INTO job_attempts (job_id, attempt, started_at, worker, token, outcome,
                                          ended_at, error)
                VALUES (c.id, c.old_attempts, c.old_claimed_at, c.old_owner, v_token,
                        v_outcome, v_ended,
                        CASE WHEN v_outcome IN ('failed', 'expired', 'cancelled')
                             THEN c.last_error ELSE '' END);
            END IF;
        END IF;
        IF c.state = 'running' AND (c.rescued OR c.old_state <> 'running') THEN
            INSERT INTO job_attempts (job_id, attempt, started_at, worker, token, outcome)
            VALUES (c.id, c.attempts, c.claimed_at, c.lease_owner, c.token, 'running');
        END IF;
        DELETE FROM job_attempts AS a
        WHERE a.job_id = c.id AND a.seq <= (
            SELECT k.seq FROM job_attempts AS k WHERE k.job_id = c.id
            ORDER BY k.seq DESC OFFSET job_attempts_kept() LIMIT 1
        );
    END LOOP;
    RETURN NULL;
END
$$;

-- Statement level with transition tables, as jobs_log_claims (0011): it runs after every
-- UPDATE of jobs, and writes only for the rows whose claim changed.
CREATE TRIGGER jobs_record_attempts
AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT
EXECUTE FUNCTION job_record_attempts();
