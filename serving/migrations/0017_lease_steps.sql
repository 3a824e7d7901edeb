-- 0017_lease_steps: independent lease calls of different callers in one round trip.
--
-- Creates function lease_steps(kinds, resources, holders, tokens, ttl_ms, request_ids)
--                    -> rows (ord, ok, replayed, holder, token, ttl_ms, revision),
--                       one per step, ord its 1-based position in the arrays
-- and replaces     lease_event_append (0013): inside lease_steps it only appends.
--
-- The lease server's group commit (lease_server/grouped.py) sends here what arrived
-- while its previous step was in flight: acquire attempts ('acquire': holder, ttl_ms,
-- request_id; never waiting), renewals ('renew': token, holder, ttl_ms) and releases
-- ('release': token, holder), each from its own caller. Each step is exactly the single
-- call (lease_acquire_logged of 0005, lease_renew_logged and lease_release_logged of
-- 0013), with the same events appended in the same transaction, and each is judged
-- alone: a refusal is its row (ok false), never an exception, so one caller's held
-- resource or lost lease fails no other step of the batch.
--   acquire: ok = granted (replayed, holder, token, ttl_ms granted); not ok = held
--            (holder, token and ttl_ms, the remaining time, of the lease that holds it)
--   renew:   ok = renewed (holder); not ok = the lease is lost
--   release: ok = released; not ok = the lease is lost
--   revision: as the single call returns it (0013: > 0 numbered through, < 0 pending,
--             0 nothing appended)
--
-- Numbering once: each single call numbers its events at once (lease_event_append runs
-- lease_events_sequence). Inside lease_steps, where that would be one sequencer run per
-- step, the steps only append (the transaction-local setting fencing.lease_steps tells
-- lease_event_append so), and one sequencer run at the end numbers them all, in seq
-- order, holding the log row to commit as before (0013's rules unchanged: the events
-- of the whole step become visible at once, in the order they were appended).
--
-- Lock order: steps run in resource COLLATE "C" order (Python's sorted(), as in 0007),
-- so each lease row is locked in that order, and then the log row, which is only ever
-- tried with SKIP LOCKED (0013): two batches over overlapping resources, of one server
-- or of two, a batch and AcquireMany, or a batch and single calls, wait for each other
-- instead of deadlocking. Steps of one resource run in the order given (ord), each
-- seeing the one before: a release and then another caller's acquire of the same
-- resource grants it.
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
    IF current_setting('fencing.lease_steps', true) = 'on' THEN
        RETURN -v_seq;  -- lease_steps numbers everything its steps appended, once
    END IF;
    SELECT * INTO v_numbered FROM lease_events_sequence();
    IF v_numbered.busy THEN
        RETURN -v_seq;
    END IF;
    RETURN v_numbered.head;
END
$$;

CREATE FUNCTION lease_steps(
    p_kinds text[], p_resources text[], p_holders text[], p_tokens bigint[],
    p_ttl_ms bigint[], p_request_ids text[]
)
RETURNS TABLE (ord bigint, ok boolean, replayed boolean, holder text, token bigint,
               ttl_ms bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v record;
    v_acquired record;
    v_renewed record;
    v_released record;
    v_head bigint := 0;
    v_numbered boolean := false;
    r_ord bigint[] := '{}';
    r_ok boolean[] := '{}';
    r_replayed boolean[] := '{}';
    r_holder text[] := '{}';
    r_token bigint[] := '{}';
    r_ttl bigint[] := '{}';
    r_rev bigint[] := '{}';
BEGIN
    PERFORM set_config('fencing.lease_steps', 'on', true);
    FOR v IN
        SELECT u.k, u.r, u.h, u.t, u.ttl, u.rid, u.o
        FROM unnest(p_kinds, p_resources, p_holders, p_tokens, p_ttl_ms, p_request_ids)
             WITH ORDINALITY AS u(k, r, h, t, ttl, rid, o)
        ORDER BY u.r COLLATE "C", u.o
    LOOP
        r_ord := r_ord || v.o;
        IF v.k = 'acquire' THEN
            SELECT * INTO v_acquired FROM lease_acquire_logged(v.r, v.h, v.ttl, v.rid);
            r_ok := r_ok || v_acquired.granted;
            r_replayed := r_replayed || v_acquired.replayed;
            r_holder := r_holder || v_acquired.holder;
            r_token := r_token || v_acquired.token;
            r_ttl := r_ttl || v_acquired.ttl_ms;
            r_rev := r_rev || v_acquired.revision;
        ELSIF v.k = 'renew' THEN
            SELECT * INTO v_renewed FROM lease_renew_logged(v.r, v.t, v.h, v.ttl);
            r_ok := r_ok || (v_renewed.holder IS NOT NULL);
            r_replayed := r_replayed || false;
            r_holder := r_holder || coalesce(v_renewed.holder, '');
            r_token := r_token || v.t;
            r_ttl := r_ttl || v.ttl;
            r_rev := r_rev || 0::bigint;
        ELSIF v.k = 'release' THEN
            SELECT * INTO v_released FROM lease_release_logged(v.r, v.t, v.h);
            r_ok := r_ok || v_released.released;
            r_replayed := r_replayed || false;
            r_holder := r_holder || v.h;
            r_token := r_token || v.t;
            r_ttl := r_ttl || 0::bigint;
            r_rev := r_rev || v_released.revision;
        ELSE
            RAISE EXCEPTION 'lease_steps: unknown step kind %', v.k;
        END IF;
    END LOOP;
    PERFORM set_config('fencing.lease_steps', '', true);
    IF EXISTS (SELECT 1 FROM unnest(r_rev) AS e(rev) WHERE e.rev < 0) THEN
        -- After every lease row: the log row last (SKIP LOCKED: never waits). Taken by
        -- another appender: the events stay pending (the caller runs the sequencer).
        SELECT s.head, NOT s.busy INTO v_head, v_numbered FROM lease_events_sequence() AS s;
    END IF;
    RETURN QUERY
    SELECT e.o, e.ok, e.rp, e.h, e.t, e.ttl,
           CASE WHEN e.rev < 0 AND v_numbered THEN v_head ELSE e.rev END
    FROM unnest(r_ord, r_ok, r_replayed, r_holder, r_token, r_ttl, r_rev)
         AS e(o, ok, rp, h, t, ttl, rev);
END
$$;
