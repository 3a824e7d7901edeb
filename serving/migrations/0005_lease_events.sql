-- 0005_lease_events: the event log of the PostgreSQL lease backend (Watch, watch-mode guards).
--
-- Creates tables lease_event_log (one row: head, compacted_through)
--                lease_events (revision -> kind, resource, token, holder, ttl_ms)
-- and functions  lease_acquire_logged(resource, holder, ttl_ms, request_id)
--                  -> (granted, replayed, holder, token, ttl_ms, revision)
--                lease_renew_logged(resource, token, holder, ttl_ms) -> (holder, revision)
--                lease_release_logged(resource, token, holder) -> (released, revision)
--                lease_expire_due(limit) -> setof (revision, resource, token, holder)
--                lease_events_after(after, resource, prefix, limit)
--                  -> setof (head, compacted_through, revision, kind, resource, token,
--                            holder, ttl_ms)
--                lease_prune_events(keep) -> number of events dropped
--                lease_events_channel() -> the NOTIFY channel that carries new heads
--                lease_event_append(kind, resource, token, holder, ttl_ms)  [internal]
-- and replaces   lease_acquire, lease_renew, lease_release (0001) by wrappers of the
--                *_logged functions, same signatures: every caller, an older lease
--                server or your own SQL included, appends its events.
--
-- The rules are lease_server/backends/base.py's (the contract suite checks them):
-- - the events of a change are appended in the transaction that makes it ("revision" is
--   the last revision the call appended, 0 when it appended nothing: a refused or
--   replayed acquire, a lost renew or release);
-- - revisions come from the one lease_event_log row, bumped with UPDATE ... RETURNING in
--   the appending transaction. Its row lock, held until commit, serializes appenders, so
--   revisions commit in order: whoever sees head N sees every event <= N. (A sequence
--   would not: its values commit out of order.) Revisions are dense and never reused;
--   pruning only raises compacted_through;
-- - a lease that expires gets exactly one EXPIRED: from lease_expire_due, which clears
--   the lease in the same step, or from the acquire that takes it over first, just
--   before its ACQUIRED. Both hold the lease row's lock and re-check it, so any number
--   of servers sweeping one schema append it once.
-- Lock order everywhere: lease row, then the lease_event_log row (no deadlocks).
-- Leases granted before this migration have no ACQUIRED; their end is still logged.

CREATE TABLE lease_event_log (
    id                integer PRIMARY KEY CHECK (id = 1),
    head              bigint NOT NULL CHECK (head >= 0),               -- newest revision
    compacted_through bigint NOT NULL CHECK (compacted_through >= 0),  -- highest pruned
    CHECK (compacted_through <= head)
);
INSERT INTO lease_event_log (id, head, compacted_through) VALUES (1, 0, 0);

CREATE TABLE lease_events (
    revision bigint PRIMARY KEY,
    kind     text NOT NULL CHECK (kind IN ('acquired', 'renewed', 'released', 'expired')),
    resource text NOT NULL,
    token    bigint NOT NULL,
    holder   text NOT NULL,
    ttl_ms   bigint NOT NULL  -- the validity granted (acquired, renewed); 0 otherwise
);

-- The sweeper's index: held leases by expiry.
CREATE INDEX leases_due ON leases (expires_at) WHERE token <> 0;

CREATE FUNCTION lease_events_channel() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT 'fencing_events:' || current_schema()
$$;

CREATE FUNCTION lease_event_append(
    p_kind text, p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint
) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_revision bigint;
BEGIN
    UPDATE lease_event_log SET head = head + 1 WHERE id = 1 RETURNING head INTO v_revision;
    INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms)
    VALUES (v_revision, p_kind, p_resource, p_token, p_holder, p_ttl_ms);
    -- Delivered to listeners only if this transaction commits.
    PERFORM pg_notify(lease_events_channel(), v_revision::text);
    RETURN v_revision;
END
$$;

CREATE FUNCTION lease_acquire_logged(
    p_resource text, p_holder text, p_ttl_ms bigint, p_request_id text,
    OUT granted boolean, OUT replayed boolean, OUT holder text, OUT token bigint,
    OUT ttl_ms bigint, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cur leases%ROWTYPE;
    v_now timestamptz;
BEGIN
    revision := 0;
    LOOP
        -- Lock the row first: the old lease must be known to log its expiry.
        SELECT * INTO cur FROM leases AS l WHERE l.resource = p_resource FOR UPDATE;
        IF NOT FOUND THEN
            -- A new resource. ON CONFLICT: another server may create it at the same time.
            INSERT INTO leases AS l (resource, counter, holder, token, expires_at, request_id)
            VALUES (p_resource, 1, p_holder, 1,
                    clock_timestamp() + p_ttl_ms * interval '1 millisecond', p_request_id)
            ON CONFLICT (resource) DO NOTHING
            RETURNING l.token INTO token;
            IF FOUND THEN
                granted := true;
                replayed := false;
                holder := p_holder;
                ttl_ms := p_ttl_ms;
                revision := lease_event_append('acquired', p_resource, token, p_holder, p_ttl_ms);
                RETURN;
            END IF;
            CONTINUE;  -- the other server won: lock its row and decide again
        END IF;
        -- Decided on the database's clock, read while the row lock is held.
        v_now := clock_timestamp();
        IF cur.token <> 0 AND cur.expires_at > v_now THEN
            granted := p_request_id <> '' AND cur.request_id = p_request_id
                       AND cur.holder = p_holder;
            replayed := granted;
            holder := cur.holder;
            token := cur.token;
            ttl_ms := ceil(extract(epoch FROM cur.expires_at - v_now) * 1000)::bigint;
            RETURN;
        END IF;
        IF cur.token <> 0 THEN
            -- A takeover of an expired lease the sweeper has not cleared: its EXPIRED first.
            PERFORM lease_event_append('expired', p_resource, cur.token, cur.holder, 0);
        END IF;
        UPDATE leases AS l
        SET counter = l.counter + 1,
            token = l.counter + 1,
            holder = p_holder,
            expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
            request_id = p_request_id
        WHERE l.resource = p_resource
        RETURNING l.token INTO token;
        granted := true;
        replayed := false;
        holder := p_holder;
        ttl_ms := p_ttl_ms;
        revision := lease_event_append('acquired', p_resource, token, p_holder, p_ttl_ms);
        RETURN;
    END LOOP;
END
$$;

CREATE FUNCTION lease_renew_logged(
    p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint,
    OUT holder text, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    revision := 0;
    UPDATE leases AS l
    SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
    WHERE l.resource = p_resource AND l.token = p_token AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (p_holder = '' OR l.holder = p_holder)
    RETURNING l.holder INTO holder;
    IF FOUND THEN
        revision := lease_event_append('renewed', p_resource, p_token, holder, p_ttl_ms);
    END IF;
END
$$;

CREATE FUNCTION lease_release_logged(
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
    PERFORM pg_notify(lease_channel(), p_resource);
    revision := lease_event_append('released', p_resource, p_token, v_holder, 0);
END
$$;

CREATE FUNCTION lease_expire_due(p_limit integer)
RETURNS TABLE (revision bigint, resource text, token bigint, holder text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cur record;
    -- A value, not clock_timestamp() in the WHERE, so the scan is an index range scan.
    v_now timestamptz := clock_timestamp();
BEGIN
    -- SKIP LOCKED: a lease another sweeper or an acquire holds is theirs to log. A row
    -- changed meanwhile is re-checked after the lock, so a cleared one is skipped.
    FOR cur IN
        SELECT l.resource, l.token, l.holder FROM leases AS l
        WHERE l.token <> 0 AND l.expires_at <= v_now
        ORDER BY l.expires_at, l.resource
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE leases AS l
        SET holder = '', token = 0, expires_at = NULL, request_id = ''
        WHERE l.resource = cur.resource;
        revision := lease_event_append('expired', cur.resource, cur.token, cur.holder, 0);
        resource := cur.resource;
        token := cur.token;
        holder := cur.holder;
        RETURN NEXT;
    END LOOP;
END
$$;

-- One statement, so one snapshot: head, the events up to it and compacted_through are
-- read together (a prune is wholly visible or not at all). One row per event, and one
-- row with NULL event columns when there is none.
CREATE FUNCTION lease_events_after(
    p_after bigint, p_resource text, p_prefix text, p_limit integer
)
RETURNS TABLE (head bigint, compacted_through bigint, revision bigint, kind text,
               resource text, token bigint, holder text, ttl_ms bigint)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT g.head, g.compacted_through, e.revision, e.kind, e.resource, e.token, e.holder,
           e.ttl_ms
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

CREATE FUNCTION lease_prune_events(p_keep bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_cut bigint;
    v_dropped bigint;
BEGIN
    -- Every event up to a committed head is committed: nothing above v_cut is touched.
    SELECT g.head - greatest(p_keep, 0) INTO v_cut FROM lease_event_log AS g WHERE g.id = 1;
    DELETE FROM lease_events WHERE revision <= v_cut;
    GET DIAGNOSTICS v_dropped = ROW_COUNT;
    IF v_dropped > 0 THEN
        -- In the same transaction as the delete: readers see both or neither.
        UPDATE lease_event_log
        SET compacted_through = greatest(compacted_through, v_cut)
        WHERE id = 1;
    END IF;
    RETURN v_dropped;
END
$$;

-- The 0001 entry points, kept for older servers and your own SQL: now they log too.
CREATE OR REPLACE FUNCTION lease_acquire(
    p_resource text, p_holder text, p_ttl_ms bigint, p_request_id text,
    OUT granted boolean, OUT replayed boolean, OUT holder text, OUT token bigint,
    OUT ttl_ms bigint
)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT a.granted, a.replayed, a.holder, a.token, a.ttl_ms
    FROM lease_acquire_logged(p_resource, p_holder, p_ttl_ms, p_request_id) AS a
$$;

CREATE OR REPLACE FUNCTION lease_renew(
    p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint
)
RETURNS text
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT r.holder FROM lease_renew_logged(p_resource, p_token, p_holder, p_ttl_ms) AS r
$$;

CREATE OR REPLACE FUNCTION lease_release(p_resource text, p_token bigint, p_holder text)
RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT r.released FROM lease_release_logged(p_resource, p_token, p_holder) AS r
$$;
