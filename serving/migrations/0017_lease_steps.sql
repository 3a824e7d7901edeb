-- 0017_lease_steps: independent lease calls of different callers in one round trip.
--
-- Creates function lease_steps(kinds, resources, holders, tokens, ttl_ms, request_ids)
--                    -> rows (ord, ok, replayed, holder, token, ttl_ms, revision),
--                       one per step, ord its 1-based position in the arrays.
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
--   revision: as the single call returns it (0013: > 0 numbered through, < 0 pending)
--
-- Lock order: steps run in resource COLLATE "C" order (Python's sorted(), as in 0007),
-- so each lease row is locked in that order, and then the log row, which is only ever
-- tried with SKIP LOCKED (0013): two batches over overlapping resources, of one server
-- or of two, a batch and AcquireMany, or a batch and single calls, wait for each other
-- instead of deadlocking. Steps of one resource run in the order given (ord), each
-- seeing the one before: a release and then another caller's acquire of the same
-- resource grants it.
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
BEGIN
    FOR v IN
        SELECT u.k, u.r, u.h, u.t, u.ttl, u.rid, u.o
        FROM unnest(p_kinds, p_resources, p_holders, p_tokens, p_ttl_ms, p_request_ids)
             WITH ORDINALITY AS u(k, r, h, t, ttl, rid, o)
        ORDER BY u.r COLLATE "C", u.o
    LOOP
        ord := v.o;
        IF v.k = 'acquire' THEN
            SELECT * INTO v_acquired FROM lease_acquire_logged(v.r, v.h, v.ttl, v.rid);
            ok := v_acquired.granted;
            replayed := v_acquired.replayed;
            holder := v_acquired.holder;
            token := v_acquired.token;
            ttl_ms := v_acquired.ttl_ms;
            revision := v_acquired.revision;
        ELSIF v.k = 'renew' THEN
            SELECT * INTO v_renewed FROM lease_renew_logged(v.r, v.t, v.h, v.ttl);
            ok := v_renewed.holder IS NOT NULL;
            replayed := false;
            holder := coalesce(v_renewed.holder, '');
            token := v.t;
            ttl_ms := v.ttl;
            revision := 0;
        ELSIF v.k = 'release' THEN
            SELECT * INTO v_released FROM lease_release_logged(v.r, v.t, v.h);
            ok := v_released.released;
            replayed := false;
            holder := v.h;
            token := v.t;
            ttl_ms := 0;
            revision := v_released.revision;
        ELSE
            RAISE EXCEPTION 'lease_steps: unknown step kind %', v.k;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
