-- 0015_queue_admin: what the operators' calls (ListJobs, GetJob, RetryJob, CancelJob,
-- RequeueDead) need of the jobs table.
--
-- Adds state       'cancelled' (an operator cancelled the job: finished, never run again
--                  unless retried; kept and pruned as dead jobs are)
--      column      jobs.claimed_at (when the current or last claim was made)
--      index       jobs_by_queue (a queue's jobs in id order: the pages of ListJobs; a
--                  state filter is applied along it. An index with the state would draw
--                  the claim's plan away from the partial jobs_ready)
-- and replaces     job_rows (0003): claimed_at_ms appended, so earlier readers' columns
--                  keep their places; job_claim (0003): sets claimed_at; job_prune (0003):
--                  cancelled jobs go with the dead retention; job_stats (0012): a
--                  cancelled count at the end; jobs_finished (0003): covers cancelled.
--
-- Cancel and retry run the pure rules of lease_server/queue/jobs.py in a transaction of
-- the backend (lease_server/queue/backends/postgres.py), as Fail does: the row locked,
-- the rule applied, the row written back. A cancel of a running job sets a fresh token
-- (nextval(job_tokens), raised by the floor trigger of 0010 where it applies), so the
-- claim's end is logged by the trigger of 0011/0013 as 'expired' of the old token, as a
-- rescue's is, and a strict guard (0008) finds no live claim.

ALTER TABLE jobs
    DROP CONSTRAINT jobs_state_check,
    DROP CONSTRAINT jobs_check1,
    ADD COLUMN claimed_at timestamptz,
    ADD CONSTRAINT jobs_state_check
        CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead', 'cancelled')),
    ADD CONSTRAINT jobs_finished_check
        CHECK ((state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL));

CREATE INDEX jobs_by_queue ON jobs (queue, id);
DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (state, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

CREATE OR REPLACE VIEW job_rows AS
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, job_ms(available_at) AS available_at_ms, lease_owner,
       job_ms(lease_until) AS lease_until_ms, last_error, job_ms(created_at) AS created_at_ms,
       job_ms(finished_at) AS finished_at_ms, job_ms(claimed_at) AS claimed_at_ms
FROM jobs;

-- As in 0003, and the claim's time is kept (claimed_at).
CREATE OR REPLACE FUNCTION job_claim(p_queue text, p_worker text, p_limit integer,
                                     p_ttl_ms bigint)
RETURNS SETOF job_rows
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_rescued bigint[];
    v_ready bigint[] := '{}';
    v_left integer;
BEGIN
    SELECT coalesce(array_agg(c.id), '{}') INTO v_rescued FROM (
        SELECT j.id FROM jobs AS j
        WHERE j.queue = p_queue AND j.state = 'running' AND j.lease_until <= now()
          AND j.attempts < j.max_attempts
        ORDER BY j.lease_until, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ) AS c;
    v_left := p_limit - coalesce(array_length(v_rescued, 1), 0);
    IF v_left > 0 THEN
        SELECT coalesce(array_agg(c.id), '{}') INTO v_ready FROM (
            SELECT j.id FROM jobs AS j
            WHERE j.queue = p_queue AND j.state = 'ready' AND j.available_at <= now()
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT v_left
            FOR UPDATE SKIP LOCKED
        ) AS c;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE jobs AS j
        SET state = 'running',
            attempts = j.attempts + 1,
            token = nextval('job_tokens'),
            lease_owner = p_worker,
            lease_until = now() + p_ttl_ms * interval '1 millisecond',
            claimed_at = now(),
            last_error = CASE WHEN j.state = 'running'
                              THEN format('lease expired: attempt %s by %s did not finish',
                                          j.attempts, j.lease_owner)
                              ELSE j.last_error END
        WHERE j.id = ANY (v_rescued || v_ready)
        RETURNING j.id, j.queue, j.payload, j.state, j.resource, j.ordering_key,
                  j.idempotency_key, j.priority, j.attempts, j.max_attempts, j.token,
                  job_ms(j.available_at) AS available_at_ms, j.lease_owner,
                  job_ms(j.lease_until) AS lease_until_ms, j.last_error,
                  job_ms(j.created_at) AS created_at_ms,
                  job_ms(j.finished_at) AS finished_at_ms,
                  job_ms(j.claimed_at) AS claimed_at_ms,
                  j.id = ANY (v_rescued) AS rescued
    )
    SELECT c.id, c.queue, c.payload, c.state, c.resource, c.ordering_key, c.idempotency_key,
           c.priority, c.attempts, c.max_attempts, c.token, c.available_at_ms, c.lease_owner,
           c.lease_until_ms, c.last_error, c.created_at_ms, c.finished_at_ms, c.claimed_at_ms
    FROM claimed AS c
    ORDER BY c.rescued DESC, CASE WHEN c.rescued THEN 0 ELSE -c.priority END,
             c.available_at_ms, c.id;
END
$$;

-- As in 0003; cancelled jobs are kept as long as dead ones.
CREATE OR REPLACE FUNCTION job_prune(p_succeeded_ms bigint, p_dead_ms bigint, p_limit integer)
RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_done integer := 0;
    v_n integer;
BEGIN
    IF p_succeeded_ms IS NOT NULL THEN
        DELETE FROM jobs WHERE id IN (
            SELECT j.id FROM jobs AS j
            WHERE j.state = 'succeeded'
              AND j.finished_at < now() - p_succeeded_ms * interval '1 millisecond'
            LIMIT p_limit);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_done := v_done + v_n;
    END IF;
    IF p_dead_ms IS NOT NULL AND v_done < p_limit THEN
        DELETE FROM jobs WHERE id IN (
            SELECT j.id FROM jobs AS j
            WHERE j.state IN ('dead', 'cancelled')
              AND j.finished_at < now() - p_dead_ms * interval '1 millisecond'
            LIMIT p_limit - v_done);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_done := v_done + v_n;
    END IF;
    RETURN v_done;
END
$$;

-- As in 0012, with the cancelled count last (the result type changes: dropped first).
DROP FUNCTION job_stats(text, bigint);
CREATE FUNCTION job_stats(p_queue text, p_window_ms bigint)
RETURNS TABLE (
    queue text, ready bigint, scheduled bigint, waiting bigint, running bigint,
    expired bigint, succeeded bigint, dead bigint, oldest_ready_age_ms bigint,
    retrying bigint, finished_in_window bigint, attempts_in_window bigint, cancelled bigint
)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'ready' AND j.available_at <= now()),
           count(*) FILTER (WHERE j.state = 'ready' AND j.available_at > now()),
           count(*) FILTER (WHERE j.state = 'waiting'),
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'running' AND j.lease_until <= now()),
           count(*) FILTER (WHERE j.state = 'succeeded'),
           count(*) FILTER (WHERE j.state = 'dead'),
           coalesce(floor(extract(epoch FROM now() - min(j.available_at)
               FILTER (WHERE j.state = 'ready' AND j.available_at <= now())) * 1000)::bigint,
               0),
           count(*) FILTER (WHERE j.state IN ('ready', 'waiting') AND j.attempts > 0),
           count(*) FILTER (WHERE j.state IN ('succeeded', 'dead')
                            AND j.finished_at >= now() - p_window_ms * interval '1 millisecond'),
           coalesce(sum(j.attempts) FILTER (WHERE j.state IN ('succeeded', 'dead')
                            AND j.finished_at >= now() - p_window_ms * interval '1 millisecond'),
                    0)::bigint,
           count(*) FILTER (WHERE j.state = 'cancelled')
    FROM jobs AS j
    WHERE p_queue = '' OR j.queue = p_queue
    GROUP BY j.queue
    ORDER BY j.queue
$$;
