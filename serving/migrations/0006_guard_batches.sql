-- 0006_guard_batches: multi-resource writes and batched (group-committed) writes.
--
-- Creates functions guard_write_many(resources, tokens, op_index, keys, values,
--                                      idempotency_key, mode) -> (fences, replayed)
--                   guard_write_batch(resources, tokens, idempotency_keys, op_index, keys,
--                                       values, mode) -> (outcomes, fences)
--
-- Ops travel as three parallel arrays: op_index[i] is the 1-based position of the write
-- (in resources/tokens) that op i belongs to, keys[i] its key, values[i] its value (NULL:
-- a delete). Ops apply in array order.
--
-- Both lock every fence row they touch, in one order everywhere (resource COLLATE "C",
-- i.e. UTF-8 byte order, the order Python's sorted() gives), creating missing rows
-- first in that same order: two multi-resource writes or batches over overlapping
-- resources wait for each other instead of deadlocking. Lease rows, if strict mode
-- needs them, are share-locked after every fence row, in the same order.

-- All or nothing over several resources (guard.fence.admit_all): every token is judged
-- first, and one stale token raises FN001 naming the first stale resource in sorted
-- order, so nothing lands. Then every op applies in order, every fence advances, and the
-- idempotency key is recorded under every resource with that resource's fence. A repeat
-- of a key recorded under resources[1] applies nothing and returns, per resource, the
-- recorded fence (or the current one where the key was already pruned). Strict mode
-- (FN002) checks every lease last, as close to COMMIT as a statement can.
CREATE FUNCTION guard_write_many(
    p_resources text[], p_tokens bigint[], p_op_index integer[], p_keys text[],
    p_values bytea[], p_idempotency_key text, p_mode text,
    OUT fences bigint[], OUT replayed boolean
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_resource text;
    v_stale record;
    v_fences bigint[];
BEGIN
    FOR v_resource IN
        SELECT r FROM unnest(p_resources) AS u(r) ORDER BY r COLLATE "C"
    LOOP
        PERFORM fence_lock(v_resource);
    END LOOP;
    IF p_idempotency_key <> '' AND EXISTS (
        SELECT 1 FROM idempotency AS i
        WHERE i.resource = p_resources[1] AND i.key = p_idempotency_key
    ) THEN
        SELECT array_agg(coalesce(i.fence, f.fence) ORDER BY u.ord) INTO fences
        FROM unnest(p_resources) WITH ORDINALITY AS u(r, ord)
        JOIN fences AS f ON f.resource = u.r
        LEFT JOIN idempotency AS i ON i.resource = u.r AND i.key = p_idempotency_key;
        replayed := true;
        RETURN;
    END IF;
    SELECT array_agg(f.fence ORDER BY u.ord) INTO v_fences
    FROM unnest(p_resources) WITH ORDINALITY AS u(r, ord)
    JOIN fences AS f ON f.resource = u.r;
    IF p_mode <> 'off' THEN
        SELECT u.r, u.t, f.fence INTO v_stale
        FROM unnest(p_resources, p_tokens) AS u(r, t)
        JOIN fences AS f ON f.resource = u.r
        WHERE u.t < f.fence
        ORDER BY u.r COLLATE "C"
        LIMIT 1;
        IF FOUND THEN
            PERFORM raise_stale_token(v_stale.r, v_stale.t, v_stale.fence);
        END IF;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF p_values[i] IS NULL THEN
            DELETE FROM data AS d
            WHERE d.resource = p_resources[p_op_index[i]] AND d.key = p_keys[i];
        ELSE
            INSERT INTO data AS d (resource, key, value, token)
            VALUES (p_resources[p_op_index[i]], p_keys[i], p_values[i], p_tokens[p_op_index[i]])
            ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value, token = excluded.token;
        END IF;
    END LOOP;
    UPDATE fences AS f SET fence = u.t
    FROM unnest(p_resources, p_tokens) AS u(r, t)
    WHERE f.resource = u.r AND u.t > f.fence;
    SELECT array_agg(greatest(u.t, u.fence) ORDER BY u.ord) INTO fences
    FROM unnest(p_tokens, v_fences) WITH ORDINALITY AS u(t, fence, ord);
    IF p_idempotency_key <> '' THEN
        INSERT INTO idempotency (resource, key, fence)
        SELECT u.r, p_idempotency_key, u.fence
        FROM unnest(p_resources, fences) AS u(r, fence);
    END IF;
    IF p_mode = 'strict' THEN
        FOR v_stale IN
            SELECT u.r, u.t, u.fence FROM unnest(p_resources, p_tokens, fences) AS u(r, t, fence)
            ORDER BY u.r COLLATE "C"
        LOOP
            PERFORM require_live_lease(v_stale.r, v_stale.t, v_stale.fence);
        END LOOP;
    END IF;
    replayed := false;
END
$$;

-- Independent writes in one transaction (group commit), judged in order exactly as
-- guard_write would judge each at its place: a replayed idempotency key, a stale token
-- ('stale', with the fence at that point), or accepted ('ok'). A refused write changes
-- nothing; the others land. Modes 'monotonic' (and any other than 'off') and 'off' only:
-- strict writes are never batched (each checks its lease right before its own commit).
-- Ops of the accepted writes apply set-based at the end; the last op on a (resource,
-- key) wins, which is what applying them one by one in order leaves.
CREATE FUNCTION guard_write_batch(
    p_resources text[], p_tokens bigint[], p_idempotency_keys text[], p_op_index integer[],
    p_keys text[], p_values bytea[], p_mode text,
    OUT outcomes text[], OUT fences bigint[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_res text[];
    v_fen bigint[];
    v_slot integer[];
    v_ok boolean[];
    v_recorded bigint;
    j integer;
    n integer := coalesce(array_length(p_resources, 1), 0);
BEGIN
    IF p_mode = 'strict' THEN
        RAISE EXCEPTION 'guard_write_batch does not take strict writes' USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        outcomes := '{}';
        fences := '{}';
        RETURN;
    END IF;
    INSERT INTO fences (resource, fence)
    SELECT r, 0 FROM (SELECT DISTINCT u.r FROM unnest(p_resources) AS u(r)) AS d
    ORDER BY r COLLATE "C"
    ON CONFLICT DO NOTHING;
    SELECT array_agg(l.resource ORDER BY l.resource COLLATE "C"),
           array_agg(l.fence ORDER BY l.resource COLLATE "C")
    INTO v_res, v_fen
    FROM (
        SELECT f.resource, f.fence FROM fences AS f
        WHERE f.resource = ANY (p_resources)
        ORDER BY f.resource COLLATE "C"
        FOR UPDATE
    ) AS l;
    SELECT array_agg(s.pos ORDER BY u.ord) INTO v_slot
    FROM unnest(p_resources) WITH ORDINALITY AS u(r, ord)
    JOIN unnest(v_res) WITH ORDINALITY AS s(r, pos) ON s.r = u.r;
    v_ok := array_fill(false, ARRAY[n]);
    outcomes := array_fill(NULL::text, ARRAY[n]);
    fences := array_fill(NULL::bigint, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        j := v_slot[i];
        IF p_idempotency_keys[i] <> '' THEN
            SELECT k.fence INTO v_recorded FROM idempotency AS k
            WHERE k.resource = p_resources[i] AND k.key = p_idempotency_keys[i];
            IF FOUND THEN
                outcomes[i] := 'replayed';
                fences[i] := v_recorded;
                CONTINUE;
            END IF;
        END IF;
        IF p_mode <> 'off' AND p_tokens[i] < v_fen[j] THEN
            outcomes[i] := 'stale';
            fences[i] := v_fen[j];
            CONTINUE;
        END IF;
        v_ok[i] := true;
        v_fen[j] := greatest(v_fen[j], p_tokens[i]);
        outcomes[i] := 'ok';
        fences[i] := v_fen[j];
        IF p_idempotency_keys[i] <> '' THEN
            INSERT INTO idempotency (resource, key, fence)
            VALUES (p_resources[i], p_idempotency_keys[i], v_fen[j]);
        END IF;
    END LOOP;
    WITH o AS (
        SELECT p_resources[x.w] AS r, x.k, x.v, p_tokens[x.w] AS t, x.ord
        FROM unnest(p_op_index, p_keys, p_values) WITH ORDINALITY AS x(w, k, v, ord)
        WHERE v_ok[x.w]
    ), winner AS (
        SELECT DISTINCT ON (o.r, o.k) o.r, o.k, o.v, o.t FROM o ORDER BY o.r, o.k, o.ord DESC
    ), gone AS (
        DELETE FROM data AS d USING winner
        WHERE winner.v IS NULL AND d.resource = winner.r AND d.key = winner.k
    )
    INSERT INTO data AS d (resource, key, value, token)
    SELECT winner.r, winner.k, winner.v, winner.t FROM winner WHERE winner.v IS NOT NULL
    ORDER BY winner.r COLLATE "C", winner.k
    ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value, token = excluded.token;
    UPDATE fences AS f SET fence = nf.fence
    FROM unnest(v_res, v_fen) AS nf(r, fence)
    WHERE f.resource = nf.r AND f.fence < nf.fence;
END
$$;
