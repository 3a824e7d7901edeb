-- 0004_lease_batches: many leases in one transaction (AcquireMany and sessions).
--
-- Creates functions lease_acquire_many(resources, holder, ttl_ms, request_id)
--                     -> rows (resource, replayed, token, ttl_ms), or raises FN003
--                   lease_renew_many(resources, tokens, holders, ttl_ms)
--                     -> rows (ord, holder): the 1-based positions renewed
--                   lease_release_many(resources, tokens, holders)
--                     -> rows (ord): the 1-based positions released
--
-- Every one locks the lease rows it touches in one order, resource COLLATE "C" (the
-- order the guard's batches lock fences in, and Python's sorted()), so two batches
-- over overlapping resources, or a batch and single calls, wait instead of
-- deadlocking. Each item follows 0001's single-lease rule exactly (the contract suite
-- holds them to lease_server/leases.py); items of one call name distinct resources.
--
-- FN003 (lease held): lease_acquire_many found a resource held by someone else (not a
-- replay of this request_id and holder); the whole call rolls back, nothing was
-- granted. DETAIL is {"resource", "holder", "token", "remaining_ms"} of that lease, the
-- first held one in sorted order.

-- All or nothing: lease_acquire for each resource in sorted order; the first refusal
-- raises FN003, which undoes every grant made before it in this call.
CREATE FUNCTION lease_acquire_many(
    p_resources text[], p_holder text, p_ttl_ms bigint, p_request_id text
)
RETURNS TABLE (resource text, replayed boolean, token bigint, ttl_ms bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_resource text;
    v_got record;
BEGIN
    FOR v_resource IN SELECT u.r FROM unnest(p_resources) AS u(r) ORDER BY u.r COLLATE "C"
    LOOP
        SELECT * INTO v_got FROM lease_acquire(v_resource, p_holder, p_ttl_ms, p_request_id);
        IF NOT v_got.granted THEN
            RAISE EXCEPTION USING
                ERRCODE = 'FN003',
                MESSAGE = format('%L is held by %L', v_resource, v_got.holder),
                DETAIL = json_build_object('resource', v_resource, 'holder', v_got.holder,
                                           'token', v_got.token,
                                           'remaining_ms', v_got.ttl_ms)::text;
        END IF;
        resource := v_resource;
        replayed := v_got.replayed;
        token := v_got.token;
        ttl_ms := v_got.ttl_ms;
        RETURN NEXT;
    END LOOP;
END
$$;

-- lease_renew for each item, set-based: the rows are locked in sorted order first.
CREATE FUNCTION lease_renew_many(
    p_resources text[], p_tokens bigint[], p_holders text[], p_ttl_ms bigint[]
)
RETURNS TABLE (ord bigint, holder text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM leases AS l WHERE l.resource = ANY (p_resources)
    ORDER BY l.resource COLLATE "C" FOR UPDATE;
    RETURN QUERY
    UPDATE leases AS l
    SET expires_at = clock_timestamp() + u.ttl * interval '1 millisecond'
    FROM unnest(p_resources, p_tokens, p_holders, p_ttl_ms) WITH ORDINALITY
         AS u(r, t, h, ttl, ord)
    WHERE l.resource = u.r AND l.token = u.t AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (u.h = '' OR l.holder = u.h)
    RETURNING u.ord, l.holder;
END
$$;

-- lease_release for each item (with its NOTIFY), rows locked in sorted order first.
CREATE FUNCTION lease_release_many(p_resources text[], p_tokens bigint[], p_holders text[])
RETURNS TABLE (ord bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_done record;
BEGIN
    PERFORM 1 FROM leases AS l WHERE l.resource = ANY (p_resources)
    ORDER BY l.resource COLLATE "C" FOR UPDATE;
    FOR v_done IN
        UPDATE leases AS l
        SET holder = '', token = 0, expires_at = NULL, request_id = ''
        FROM unnest(p_resources, p_tokens, p_holders) WITH ORDINALITY AS u(r, t, h, ord)
        WHERE l.resource = u.r AND l.token = u.t AND l.token <> 0
          AND l.expires_at > clock_timestamp() AND (u.h = '' OR l.holder = u.h)
        RETURNING u.ord AS o, u.r AS r
    LOOP
        -- Delivered to listeners only if this transaction commits.
        PERFORM pg_notify(lease_channel(), v_done.r);
        ord := v_done.o;
        RETURN NEXT;
    END LOOP;
END
$$;
