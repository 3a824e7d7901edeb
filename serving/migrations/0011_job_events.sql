-- 0011_job_events: every change of a job's claim is an event of the lease event log (0005).
--
-- Adds columns   lease_events.job_id, lease_events.queue (0 and '' for a lease's event)
--      index     jobs_by_resource (jobs by their own guard resource)
-- Creates        trigger jobs_log_claims on jobs (function job_log_claims)
-- and replaces   lease_events_after (0005): the same rows, with job_id and queue at the end.
--
-- The rule is lease_server/queue/jobs.py transitions() (the contract suite
-- tests/contract/test_job_events.py holds both to it):
-- - a claim that ended, the job ran with token t and now runs with another token or no
--   longer runs, is 'expired' when a rescue took it over or the reaper declared the job
--   dead, 'released' otherwise (Complete, Fail, Release);
-- - a new claim (running with a token it did not have) is 'acquired' with the ttl
--   granted, so a rescue appends expired(t) then acquired(t'), as a lease takeover does.
-- A trigger, not the job_* functions, so that every path that changes a claim logs it in
-- its own transaction: job_claim, job_complete, job_release, job_reap, the backend's Fail
-- (Python, in a transaction) and your own SQL alike. The resource is the job's guard
-- resource: its own, or job/<queue>/<id>.
--
-- Lock order: the job rows (the UPDATE holds them), then the lease_event_log row, then
-- the ordering-key advisory lock (job_promote runs after the UPDATE); leases never lock a
-- job row, and every job path takes these in this order, so nothing deadlocks. The log
-- row's lock, held to commit, makes claim changes commit one at a time, as lease
-- appends do; it is taken once per statement (a batch of claims appends together).

ALTER TABLE lease_events
    ADD COLUMN job_id bigint NOT NULL DEFAULT 0,
    ADD COLUMN queue  text   NOT NULL DEFAULT '';

-- Jobs by their own guard resource: the lease service's Describe reports the highest
-- claim token of a job resource in last_token (lease_server/queue/backends/postgres.py).
CREATE INDEX jobs_by_resource ON jobs (resource) WHERE resource <> '';

-- One statement's changes of claims, appended together: the log row is locked (and the
-- head bumped) once per statement, and only when the statement changed a claim, so
-- heartbeats and enqueues never wait for the log. Revisions follow job id, and within a
-- job the end of the old claim comes before the new one.
CREATE FUNCTION job_log_claims() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_appended bigint;
    v_head bigint;
BEGIN
    WITH changed AS (
        SELECT n.id, n.queue, n.state, n.token, n.lease_owner, n.lease_until, n.last_error,
               o.state AS old_state, o.token AS old_token, o.lease_owner AS old_owner,
               CASE WHEN n.resource <> '' THEN n.resource
                    ELSE 'job/' || n.queue || '/' || n.id END AS resource
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE o.state = 'running' OR n.state = 'running'
    ), events AS (
        SELECT c.id, 0 AS step,
               CASE WHEN c.token <> c.old_token
                         OR (c.state = 'dead'
                             AND c.last_error = 'lease expired after the final attempt')
                    THEN 'expired' ELSE 'released' END AS kind,
               c.resource, c.old_token AS token, c.old_owner AS holder, 0::bigint AS ttl_ms,
               c.queue
        FROM changed AS c
        WHERE c.old_state = 'running' AND (c.token <> c.old_token OR c.state <> 'running')
        UNION ALL
        SELECT c.id, 1, 'acquired', c.resource, c.token, c.lease_owner,
               greatest(0, job_ms(c.lease_until) - job_ms(now())), c.queue
        FROM changed AS c
        WHERE c.state = 'running' AND c.token <> c.old_token
    ), counted AS (
        SELECT count(*) AS n FROM events
    ), bumped AS (
        UPDATE lease_event_log AS g SET head = g.head + k.n
        FROM counted AS k
        WHERE g.id = 1 AND k.n > 0
        RETURNING g.head, k.n
    )
    INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms, job_id, queue)
    SELECT b.head - b.n + row_number() OVER (ORDER BY e.id, e.step),
           e.kind, e.resource, e.token, e.holder, e.ttl_ms, e.id, e.queue
    FROM events AS e CROSS JOIN bumped AS b;
    GET DIAGNOSTICS v_appended = ROW_COUNT;
    IF v_appended > 0 THEN
        SELECT g.head INTO v_head FROM lease_event_log AS g WHERE g.id = 1;
        -- Delivered to listeners only if this transaction commits.
        PERFORM pg_notify(lease_events_channel(), v_head::text);
    END IF;
    RETURN NULL;
END
$$;

-- Statement level with transition tables (which allow no column list): it runs after
-- every UPDATE of jobs, and appends only what changed a claim.
CREATE TRIGGER jobs_log_claims
AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT
EXECUTE FUNCTION job_log_claims();

DROP FUNCTION lease_events_after(bigint, text, text, integer);

-- As in 0005 (one statement, one snapshot), with each event's job at the end.
CREATE FUNCTION lease_events_after(
    p_after bigint, p_resource text, p_prefix text, p_limit integer
)
RETURNS TABLE (head bigint, compacted_through bigint, revision bigint, kind text,
               resource text, token bigint, holder text, ttl_ms bigint, job_id bigint,
               queue text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT g.head, g.compacted_through, e.revision, e.kind, e.resource, e.token, e.holder,
           e.ttl_ms, e.job_id, e.queue
    FROM lease_event_log AS g
    LEFT JOIN LATERAL (
        SELECT * FROM lease_events AS x
        WHERE x.revision > p_after AND x.revision <= g.head
          AND CASE WHEN p_resource <> '' THEN x.resource = p_resource
                   ELSE starts_with(x.resource, p_prefix) END
        ORDER BY x.revision
        LIMIT greatest(p_limit, 1)
    ) AS e ON true
    WHERE g.id = 1
    ORDER BY e.revision
$$;
