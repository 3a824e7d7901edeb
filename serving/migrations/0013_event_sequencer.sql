-- 0013_event_sequencer: the event log without a hot row; renewals are not events.
--
-- Creates table    lease_events_pending (seq -> kind, resource, token, holder, ttl_ms,
--                                        job_id, queue): appended, not yet numbered
-- and function     lease_events_sequence() -> (head, seqs): numbers what is committed
-- and replaces     lease_event_append (0005), lease_renew_logged (0005),
--                  lease_release_logged (0005), lease_renew_many (0007),
--                  lease_release_many (0007), job_log_claims (0011).
--
-- Until 0012 every append bumped the one lease_event_log row and held its lock until
-- commit: all lease and claim changes of every server committed one at a time. Now:
-- - a change appends its events to lease_events_pending, in its own transaction, with
--   no revision: each gets seq from an identity (no row lock; drawing one never
--   waits for other transactions), so writers do not wait for each other;
-- - lease_events_sequence(), run after a write commits (and before a read), locks the
--   log row, and in a fresh snapshot moves every *committed* pending event into
--   lease_events with the next revisions (head + 1, head + 2 ... in seq order), in one
--   short transaction. Revisions are still dense and commit ordered: they are given to
--   events that already committed, by transactions that hold the log row in turn, so a
--   reader that saw head N sees every event <= N, and an event that commits later can
--   only get a number above every head read before (docs/design.md, "The event log and
--   its ordering"). Seq order keeps the order of a transaction's own events (EXPIRED
--   before ACQUIRED) and of changes of one resource (the later one waited for the
--   earlier one's row lock, so it drew its seq after it and committed after it: both
--   are numbered together, or the earlier one first).
-- - NOTIFY moved to the sequencer too: a transaction that NOTIFYs takes a database-wide
--   lock at commit, which made releases commit one at a time as well. The sequencer
--   sends the new head on fencing_events:<schema> and each lease it numbered a
--   RELEASED or EXPIRED for on fencing_released:<schema> (waiters in other servers).
-- - renewals append nothing (a lease's revision and a watcher's fence do not move when
--   it is renewed); lease_renew_logged returns revision 0.
-- The *_logged functions keep their signatures: the "revision" they return is now the
-- seq of the last event they appended pending (0 if none): "run the sequencer".
-- Lock order: lease rows, then (in the sequencer only) the lease_event_log row.

CREATE TABLE lease_events_pending (
    -- An identity, not a sequence of its own: a role granted INSERT on the tables (as
    -- servers without DDL rights are) draws from it without a grant on the sequence.
    seq      bigint GENERATED ALWAYS AS IDENTITY,
    kind     text NOT NULL CHECK (kind IN ('acquired', 'released', 'expired')),
    resource text NOT NULL,
    token    bigint NOT NULL,
    holder   text NOT NULL,
    ttl_ms   bigint NOT NULL,
    job_id   bigint NOT NULL DEFAULT 0,
    queue    text NOT NULL DEFAULT ''
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
-- No index: the sequencer takes every row it can see, and the table stays small.

CREATE OR REPLACE FUNCTION lease_event_append(
    p_kind text, p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint
) RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms)
    VALUES (p_kind, p_resource, p_token, p_holder, p_ttl_ms)
    RETURNING seq
$$;

CREATE FUNCTION lease_events_sequence(OUT head bigint, OUT seqs bigint[])
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_new bigint;
    v_released text[];
BEGIN
    seqs := '{}';
    IF NOT EXISTS (SELECT 1 FROM lease_events_pending) THEN
        -- Nothing to number (or only what is not committed yet): no lock, no commit.
        SELECT g.head INTO head FROM lease_event_log AS g WHERE g.id = 1;
        RETURN;
    END IF;
    -- Sequencers take turns here. The next statement has a new snapshot, taken after
    -- the lock: it sees what the sequencer before this one moved, and every pending
    -- row it sees is committed (a writer's own uncommitted rows are invisible to it).
    SELECT g.head INTO v_head FROM lease_event_log AS g WHERE g.id = 1 FOR UPDATE;
    WITH moved AS (
        DELETE FROM lease_events_pending RETURNING *
    ), numbered AS (
        INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms, job_id,
                                  queue)
        SELECT v_head + row_number() OVER (ORDER BY m.seq), m.kind, m.resource, m.token,
               m.holder, m.ttl_ms, m.job_id, m.queue
        FROM moved AS m
        RETURNING revision, kind, resource, job_id
    )
    SELECT coalesce((SELECT array_agg(m.seq ORDER BY m.seq) FROM moved AS m), '{}'),
           (SELECT array_agg(DISTINCT n.resource) FROM numbered AS n
            WHERE n.job_id = 0 AND n.kind IN ('released', 'expired'))
    INTO seqs, v_released;
    v_new := v_head + coalesce(array_length(seqs, 1), 0);
    head := v_new;
    IF v_new > v_head THEN
        UPDATE lease_event_log AS g SET head = v_new WHERE g.id = 1;
        -- Delivered only if this transaction commits, i.e. once the numbers are visible.
        PERFORM pg_notify(lease_channel(), u.r) FROM unnest(v_released) AS u(r);
        PERFORM pg_notify(lease_events_channel(), v_new::text);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_logged(
    p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint,
    OUT holder text, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    revision := 0;  -- a renewal is not an event
    UPDATE leases AS l
    SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
    WHERE l.resource = p_resource AND l.token = p_token AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (p_holder = '' OR l.holder = p_holder)
    RETURNING l.holder INTO holder;
END
$$;

CREATE OR REPLACE FUNCTION lease_release_logged(
    p_resource text, p_token bigint, p_holder text,
    OUT released boolean, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_holder text;
BEGIN
    revision := 0;
    -- Locked, then re-checked against the newest row version if it changed meanwhile.
    SELECT l.holder INTO v_holder FROM leases AS l
    WHERE l.resource = p_resource AND l.token = p_token AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (p_holder = '' OR l.holder = p_holder)
    FOR UPDATE;
    released := FOUND;
    IF NOT released THEN
        RETURN;
    END IF;
    UPDATE leases AS l
    SET holder = '', token = 0, expires_at = NULL, request_id = ''
    WHERE l.resource = p_resource;
    -- Other servers' waiters hear of it from the sequencer (no NOTIFY here).
    revision := lease_event_append('released', p_resource, p_token, v_holder, 0);
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_many(
    p_resources text[], p_tokens bigint[], p_holders text[], p_ttl_ms bigint[]
)
RETURNS TABLE (ord bigint, holder text, revision bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH picked AS (
        SELECT u.ord, l.resource, l.holder, u.ttl
        FROM leases AS l
        JOIN unnest(p_resources, p_tokens, p_holders, p_ttl_ms) WITH ORDINALITY
             AS u(r, t, h, ttl, ord) ON l.resource = u.r
        WHERE l.token = u.t AND l.token <> 0 AND l.expires_at > clock_timestamp()
          AND (u.h = '' OR l.holder = u.h)
        ORDER BY l.resource COLLATE "C"
        FOR UPDATE OF l
    ), renewed AS (
        UPDATE leases AS l
        SET expires_at = clock_timestamp() + p.ttl * interval '1 millisecond'
        FROM picked AS p
        WHERE l.resource = p.resource
        RETURNING p.ord, p.holder
    )
    SELECT r.ord, r.holder, 0::bigint FROM renewed AS r  -- renewals are not events
$$;

CREATE OR REPLACE FUNCTION lease_release_many(
    p_resources text[], p_tokens bigint[], p_holders text[]
)
RETURNS TABLE (ord bigint, revision bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH picked AS (
        SELECT u.ord, l.resource, l.token, l.holder
        FROM leases AS l
        JOIN unnest(p_resources, p_tokens, p_holders) WITH ORDINALITY AS u(r, t, h, ord)
             ON l.resource = u.r
        WHERE l.token = u.t AND l.token <> 0 AND l.expires_at > clock_timestamp()
          AND (u.h = '' OR l.holder = u.h)
        ORDER BY l.resource COLLATE "C"
        FOR UPDATE OF l
    ), released AS (
        UPDATE leases AS l
        SET holder = '', token = 0, expires_at = NULL, request_id = ''
        FROM picked AS p
        WHERE l.resource = p.resource
        RETURNING p.ord, p.resource, p.token, p.holder
    ), logged AS (
        INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms)
        SELECT 'released', s.resource, s.token, s.holder, 0
        FROM (SELECT * FROM released ORDER BY resource COLLATE "C") AS s
        RETURNING seq, resource
    )
    SELECT r.ord, g.seq FROM released AS r JOIN logged AS g ON g.resource = r.resource
$$;

-- As in 0011, appended pending: no head to bump, so claims no longer wait for the log.
CREATE OR REPLACE FUNCTION job_log_claims() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
    )
    INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms, job_id, queue)
    SELECT o.kind, o.resource, o.token, o.holder, o.ttl_ms, o.id, o.queue
    FROM (SELECT * FROM events ORDER BY id, step) AS o;
    RETURN NULL;
END
$$;
