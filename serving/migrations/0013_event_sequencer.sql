-- 0013_event_sequencer: the event log without a hot row; renewals are not events.
--
-- Creates table    lease_events_pending (seq -> kind, resource, token, holder, ttl_ms,
--                                        job_id, queue): appended, not yet numbered
-- and function     lease_events_sequence() -> (head, seqs, busy): numbers what is pending
-- and replaces     lease_event_append (0005), lease_renew_logged (0005),
--                  lease_release_logged (0005), lease_renew_many (0007),
--                  lease_release_many (0007), job_log_claims (0011).
--
-- Until 0012 every append bumped the one lease_event_log row and held its lock until
-- commit: all lease and claim changes of every server committed one at a time. Now:
-- - a change appends its events to lease_events_pending, unnumbered (seq, an identity,
--   keeps their order), then tries the log row with FOR UPDATE SKIP LOCKED. Free (no
--   other appender in flight): it numbers its own events and every committed pending
--   one at once, holding the row to commit as before: one round trip, one commit.
--   Taken: it goes on and commits without waiting; its events stay pending;
-- - lease_events_sequence() numbers what is pending, in a transaction of its own or in
--   the appender's: it takes the log row (SKIP LOCKED: busy if another holds it), and
--   in a snapshot taken after that lock moves every pending event it can see (committed
--   ones, and the transaction's own) into lease_events as head + 1, head + 2 ... in seq
--   order, raising head in the same commit. A server runs it after a write that left
--   events pending (again, with backoff, while busy) and before a read that could
--   come up short. Revisions stay dense and commit ordered: whoever numbers holds the
--   row to commit, so numbers become visible in turn, and an event that is still
--   uncommitted when a reader reads head N can only be numbered later, above N
--   (docs/design.md, "The event log and its ordering"). Seq order keeps the order of a
--   transaction's own events (EXPIRED before ACQUIRED) and of changes of one resource
--   (the later one waited for the earlier one's row lock: it drew its seq after it and
--   committed after it, so it cannot be numbered first).
-- - NOTIFY is sent by whoever numbers: the new head on fencing_events:<schema>, and each
--   lease it numbered a RELEASED or EXPIRED for on fencing_released:<schema> (waiters
--   in other servers). Appenders that leave their events pending do not NOTIFY (a
--   notifying transaction takes a database-wide lock at commit).
-- - renewals append nothing (a lease's revision and a watcher's fence do not move when
--   it is renewed); lease_renew_logged returns revision 0.
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

CREATE FUNCTION lease_events_sequence(OUT head bigint, OUT seqs bigint[], OUT busy boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_new bigint;
    v_released text[];
BEGIN
    seqs := '{}';
    busy := false;
    IF NOT EXISTS (SELECT 1 FROM lease_events_pending) THEN
        -- Nothing to number (or only what is not committed yet): no lock, no commit.
        SELECT g.head INTO head FROM lease_event_log AS g WHERE g.id = 1;
        RETURN;
    END IF;
    -- Numberers take turns here, and never wait for each other: a transaction that
    -- holds the row numbers what it sees, and what it cannot see yet (committed after
    -- its snapshot) is numbered by a later run. The next statement has a new snapshot,
    -- taken after the lock: it sees what the holder before this one moved; the pending
    -- rows it sees are committed, or this transaction's own.
    SELECT g.head INTO v_head FROM lease_event_log AS g WHERE g.id = 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        busy := true;
        SELECT g.head INTO head FROM lease_event_log AS g WHERE g.id = 1;
        RETURN;
    END IF;
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

-- Appends pending, then numbers at once if the log row is free (the transaction then
-- holds it to commit, as every append did before): one round trip and one commit when
-- appenders do not overlap. If another transaction holds it, the event stays pending
-- and this one goes on without waiting. Returns the head numbered through (> 0) or
-- minus the event's seq (still pending: "run lease_events_sequence after commit").
CREATE OR REPLACE FUNCTION lease_event_append(
    p_kind text, p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint
) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_seq bigint;
    v_numbered record;
BEGIN
    INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms)
    VALUES (p_kind, p_resource, p_token, p_holder, p_ttl_ms)
    RETURNING seq INTO v_seq;
    SELECT * INTO v_numbered FROM lease_events_sequence();
    IF v_numbered.busy THEN
        RETURN -v_seq;
    END IF;
    RETURN v_numbered.head;
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
    -- Pending (minus the seq): the caller runs lease_events_sequence after commit.
    SELECT r.ord, -g.seq FROM released AS r JOIN logged AS g ON g.resource = r.resource
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
