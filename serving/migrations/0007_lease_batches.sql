-- 0007_lease_batches: many leases in one transaction (AcquireMany and sessions), logged.
--
-- Creates functions lease_acquire_many(resources, holder, ttl_ms, request_id)
--                     -> rows (resource, replayed, token, ttl_ms, revision), or FN003
--                   lease_renew_many(resources, tokens, holders, ttl_ms)
--                     -> rows (ord, holder, revision): the 1-based positions renewed
--                   lease_release_many(resources, tokens, holders)
--                     -> rows (ord, revision): the 1-based positions released
--
-- Each item follows the single-lease rule of 0001/0005 exactly (the contract suite holds
-- them to lease_server/leases.py) and appends the same events in the same transaction;
-- items of one call name distinct resources.
--
-- Lock order, as everywhere (0005): lease rows first, here all of them, in resource
-- COLLATE "C" order (Python's sorted(); the guard's batches lock fences in it too), and
-- only then the lease_event_log row. So two batches over overlapping resources, or a
-- batch and single calls, wait for each other instead of deadlocking. Resources new to
-- the table are first inserted free (counter 0, which reads exactly like no row), in the
-- same order, so that every row can be locked before the first event is appended.
-- Renewals and releases append their events together: one head bump, one INSERT and
-- one events NOTIFY per call (releases still NOTIFY each resource, for waiters).
--
-- FN003 (lease held): lease_acquire_many found a resource held by someone else (not a
-- replay of this request_id and holder); the whole call rolls back, nothing was granted
-- or appended. DETAIL is {"resource", "holder", "token", "remaining_ms"} of that lease,
-- the first held one in sorted order.

CREATE FUNCTION lease_acquire_many(
    p_resources text[], p_holder text, p_ttl_ms bigint, p_request_id text
)
RETURNS TABLE (resource text, replayed boolean, token bigint, ttl_ms bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_resource text;
    v_got record;
BEGIN
    INSERT INTO leases (resource, counter)
    SELECT u.r, 0 FROM unnest(p_resources) AS u(r) ORDER BY u.r COLLATE "C"
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM leases AS l WHERE l.resource = ANY (p_resources)
    ORDER BY l.resource COLLATE "C" FOR UPDATE;
    FOR v_resource IN SELECT u.r FROM unnest(p_resources) AS u(r) ORDER BY u.r COLLATE "C"
    LOOP
        SELECT * INTO v_got FROM lease_acquire_logged(v_resource, p_holder, p_ttl_ms, p_request_id);
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
        revision := v_got.revision;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION lease_renew_many(
    p_resources text[], p_tokens bigint[], p_holders text[], p_ttl_ms bigint[]
)
RETURNS TABLE (ord bigint, holder text, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_ord bigint[];
    v_res text[];
    v_tok bigint[];
    v_hol text[];
    v_ttl bigint[];
    v_n integer;
    v_head bigint;
BEGIN
    WITH picked AS (
        SELECT u.ord, l.resource, l.token, l.holder, u.ttl
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
        RETURNING p.ord, p.resource, p.token, p.holder, p.ttl
    )
    SELECT array_agg(r.ord ORDER BY r.resource COLLATE "C"),
           array_agg(r.resource ORDER BY r.resource COLLATE "C"),
           array_agg(r.token ORDER BY r.resource COLLATE "C"),
           array_agg(r.holder ORDER BY r.resource COLLATE "C"),
           array_agg(r.ttl ORDER BY r.resource COLLATE "C")
    INTO v_ord, v_res, v_tok, v_hol, v_ttl
    FROM renewed AS r;
    v_n := coalesce(array_length(v_ord, 1), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- After every lease row: the log row last (0005's lock order). One bump for all.
    UPDATE lease_event_log AS g SET head = g.head + v_n WHERE g.id = 1 RETURNING g.head INTO v_head;
    INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms)
    SELECT v_head - v_n + e.i, 'renewed', e.r, e.t, e.h, e.ttl
    FROM unnest(v_res, v_tok, v_hol, v_ttl) WITH ORDINALITY AS e(r, t, h, ttl, i);
    PERFORM pg_notify(lease_events_channel(), v_head::text);
    RETURN QUERY
    SELECT e.o, e.h, v_head - v_n + e.i
    FROM unnest(v_ord, v_hol) WITH ORDINALITY AS e(o, h, i);
END
$$;

CREATE FUNCTION lease_release_many(p_resources text[], p_tokens bigint[], p_holders text[])
RETURNS TABLE (ord bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_ord bigint[];
    v_res text[];
    v_tok bigint[];
    v_hol text[];
    v_n integer;
    v_head bigint;
BEGIN
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
    )
    SELECT array_agg(r.ord ORDER BY r.resource COLLATE "C"),
           array_agg(r.resource ORDER BY r.resource COLLATE "C"),
           array_agg(r.token ORDER BY r.resource COLLATE "C"),
           array_agg(r.holder ORDER BY r.resource COLLATE "C")
    INTO v_ord, v_res, v_tok, v_hol
    FROM released AS r;
    v_n := coalesce(array_length(v_ord, 1), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- Waiters in every server wake for each resource (delivered only on commit).
    PERFORM pg_notify(lease_channel(), e.r) FROM unnest(v_res) AS e(r);
    UPDATE lease_event_log AS g SET head = g.head + v_n WHERE g.id = 1 RETURNING g.head INTO v_head;
    INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms)
    SELECT v_head - v_n + e.i, 'released', e.r, e.t, e.h, 0
    FROM unnest(v_res, v_tok, v_hol) WITH ORDINALITY AS e(r, t, h, i);
    PERFORM pg_notify(lease_events_channel(), v_head::text);
    RETURN QUERY
    SELECT e.o, v_head - v_n + e.i FROM unnest(v_ord) WITH ORDINALITY AS e(o, i);
END
$$;
