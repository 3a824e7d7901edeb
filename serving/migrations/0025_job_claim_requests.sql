-- 0025_job_claim_requests: a retried Claim (its reply was lost) gets its jobs back.
--
-- Adds column      jobs.claim_request_id (the request id of the Claim that made the
--                  job's current or last claim; '' for none)
--      index       jobs_by_claim_request (running jobs of a queue by that id: only while
--                  running under a non-empty id, so a claim without one adds no entry,
--                  and the rescue's scan of jobs_running cannot be drawn to it)
--      function    job_claim(queue, worker, limit, ttl_ms, request_id) -> setof job_rows:
--                  job_claim of 0015 storing request_id with each claim; a non-empty
--                  request_id that jobs of the queue still run under (claimed by the
--                  same worker, not ended nor rescued) returns those jobs instead, by
--                  id, their leases extended to now + ttl_ms (a heartbeat: the same
--                  token and attempt, so no event is logged and nothing new is claimed).
--
-- The rule is lease_server/queue/jobs.py's replays/replay, as memory and SQLite apply
-- it; the lease server's Acquire replays a request_id the same way. job_claim with four
-- arguments (0015) stays as it was, for servers of the previous release.

ALTER TABLE jobs ADD COLUMN claim_request_id text NOT NULL DEFAULT '';

CREATE INDEX jobs_by_claim_request ON jobs (queue, claim_request_id)
    WHERE state = 'running' AND claim_request_id <> '';

CREATE FUNCTION job_claim(p_queue text, p_worker text, p_limit integer, p_ttl_ms bigint,
                          p_request_id text)
RETURNS SETOF job_rows
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_rescued bigint[];
    v_ready bigint[] := '{}';
    v_left integer;
BEGIN
    IF p_request_id <> '' THEN
        RETURN QUERY
        WITH replayed AS (
            UPDATE jobs AS j
            SET lease_until = now() + p_ttl_ms * interval '1 millisecond'
            WHERE j.queue = p_queue AND j.state = 'running'
              AND j.claim_request_id = p_request_id AND j.lease_owner = p_worker
            RETURNING j.id, j.queue, j.payload, j.state, j.resource, j.ordering_key,
                      j.idempotency_key, j.priority, j.attempts, j.max_attempts, j.token,
                      job_ms(j.available_at) AS available_at_ms, j.lease_owner,
                      job_ms(j.lease_until) AS lease_until_ms, j.last_error,
                      job_ms(j.created_at) AS created_at_ms,
                      job_ms(j.finished_at) AS finished_at_ms,
                      job_ms(j.claimed_at) AS claimed_at_ms
        )
        SELECT * FROM replayed AS r ORDER BY r.id;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
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
            claim_request_id = p_request_id,
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
