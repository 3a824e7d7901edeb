-- 0011_job_events: every change of a job's claim is an event of the lease event log (0005).
--
-- Adds columns   lease_events.job_id, lease_events.queue (0 and '' for a lease's event)
-- Creates        job_event_append(kind, resource, token, holder, ttl_ms, job_id, queue)
--                  -> revision                                                  [internal]
--                trigger jobs_log_claims on jobs (function job_log_claims)
-- and replaces   lease_events_after (0005): the same rows, with job_id and queue at the end.
--
-- The rule is lease_server/jobs.py transitions() (the contract suite
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
-- row's lock, held to commit, makes claims commit one at a time, as lease appends do.

ALTER TABLE lease_events
    ADD COLUMN job_id bigint NOT NULL DEFAULT 0,
    ADD COLUMN queue  text   NOT NULL DEFAULT '';

CREATE FUNCTION job_event_append(
    p_kind text, p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint,
    p_job_id bigint, p_queue text
) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_revision bigint;
BEGIN
    UPDATE lease_event_log SET head = head + 1 WHERE id = 1 RETURNING head INTO v_revision;
    INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms, job_id, queue)
    VALUES (v_revision, p_kind, p_resource, p_token, p_holder, p_ttl_ms, p_job_id, p_queue);
    -- Delivered to listeners only if this transaction commits.
    PERFORM pg_notify(lease_events_channel(), v_revision::text);
    RETURN v_revision;
END
$$;

CREATE FUNCTION job_log_claims() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_resource text := CASE WHEN NEW.resource <> '' THEN NEW.resource
                            ELSE 'job/' || NEW.queue || '/' || NEW.id END;
BEGIN
    IF OLD.state = 'running' AND (NEW.token <> OLD.token OR NEW.state <> 'running') THEN
        PERFORM job_event_append(
            CASE WHEN NEW.token <> OLD.token
                      OR (NEW.state = 'dead'
                          AND NEW.last_error = 'lease expired after the final attempt')
                 THEN 'expired' ELSE 'released' END,
            v_resource, OLD.token, OLD.lease_owner, 0, NEW.id, NEW.queue);
    END IF;
    IF NEW.state = 'running' AND NEW.token <> OLD.token THEN
        PERFORM job_event_append(
            'acquired', v_resource, NEW.token, NEW.lease_owner,
            greatest(0, job_ms(NEW.lease_until) - job_ms(now())), NEW.id, NEW.queue);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_log_claims
AFTER UPDATE OF state, token ON jobs
FOR EACH ROW WHEN (OLD.state = 'running' OR NEW.state = 'running')
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
