-- 0021_job_resources: jobs that name their own resource: their claims hold the lease on it.
--
-- A job enqueued with a resource (one that leases may name too, 'orders/1') is claimed
-- by taking the lease on that resource (lease_server/queue/resources.py): its token is
-- that lease's token, from the resource's one counter, and the claim holds the lease,
-- so no lease is granted beside it. The queue's claim gives such a job a provisional
-- token first, never handed out, then stores the lease's token in its place, which may
-- be lower. So, for these jobs only:
--   jobs_token_floor     no longer raises the stored token (the lease took the floor);
--   job_log_claims       logs no event (the lease's acquire, release and expiry are its
--                        events, appended by the lease functions);
--   require_live_claim   finds a strict write's claim in the lease alone (the lease is
--                        the claim; a job row's lease_until is not the lease's expiry).

DROP TRIGGER jobs_token_floor ON jobs;
CREATE TRIGGER jobs_token_floor
BEFORE UPDATE OF token ON jobs
FOR EACH ROW
WHEN (NEW.resource = '' AND NEW.token <> OLD.token AND NEW.token <> 0
      AND (NEW.token <= OLD.token OR current_setting('fencing.token_floor', true) = 'clock'))
EXECUTE FUNCTION job_token_floor();

CREATE OR REPLACE FUNCTION job_log_claims() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    WITH changed AS (
        SELECT n.id, n.queue, n.state, n.token, n.lease_owner, n.lease_until, n.last_error,
               o.state AS old_state, o.token AS old_token, o.lease_owner AS old_owner,
               'job/' || n.queue || '/' || n.id AS resource
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE (o.state = 'running' OR n.state = 'running') AND n.resource = ''
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
    )
    INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms, job_id, queue)
    SELECT o.kind, o.resource, o.token, o.holder, o.ttl_ms, o.id, o.queue
    FROM (SELECT * FROM events ORDER BY id, step) AS o;
    RETURN NULL;
END
$$;

-- The live lease of the resource, or the live claim of the job it names by default
-- ('job/<queue>/<id>'), by this database's clock; FN002 otherwise. Locks as in 0008.
CREATE OR REPLACE FUNCTION require_live_claim(
    p_resource text, p_token bigint, p_fence bigint, p_idempotency_key text,
    p_applied_by bigint
)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_token bigint;
    v_expires_at timestamptz;
BEGIN
    SELECT l.token, l.expires_at INTO v_token, v_expires_at
    FROM leases AS l WHERE l.resource = p_resource FOR SHARE;
    IF v_token = p_token AND coalesce(v_expires_at > clock_timestamp(), false) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM jobs AS j
    WHERE j.state = 'running' AND j.token = p_token AND j.lease_until > clock_timestamp()
      AND j.resource = '' AND p_resource = 'job/' || j.queue || '/' || j.id
    FOR SHARE OF j;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM fencing_refused('FN002', p_resource, p_token, p_fence, p_idempotency_key,
                            p_applied_by);
END
$$;
