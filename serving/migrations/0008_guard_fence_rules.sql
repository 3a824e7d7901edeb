-- 0008_guard_fence_rules: the token is judged before the idempotency key, strict mode
-- refuses a token that is not live as "lease lost" and knows job claims, and operators
-- can reset a wedged fence.
--
-- Changes   idempotency gets a token column: the token that applied the key (NULL for
--           keys recorded before; every mode but off leaves fence = token, so the fence
--           stands in)
--           jobs gets an index of running claims by token (the strict check's lookup)
-- Creates   fencing_refused(code, resource, token, fence, idempotency_key, applied_by)
--                                                                          [internal]
--           require_live_claim(resource, token, fence, idempotency_key, applied_by)
--                                                                          [internal]
--           guard_fence(resource, token, mode) -> fence                    [internal]
--           guard_reset_fence(resource, to_token) -> the fence it replaced [internal]
-- Replaces  require_live_lease(resource, token, fence): the live lease OR the live,
--             unexpired claim of the job owning the resource (check_live_lease, the
--             public strict helper, gets this through it)
--           guard_write -> (fence, replayed, replayed_by_token)
--           guard_write_many -> (fences, replayed, replayed_by_tokens)
--           guard_write_batch -> (outcomes, fences, applied_by)
--
-- The order of judgement is guard/fence.py's judge(): (1) token < fence (not in mode off):
-- FN001, whether or not the idempotency key is known; (2) strict mode, the token is not
-- the live lease or job claim: FN002; (3) only then a recorded key is a replay, answered
-- with the token that applied it; (4) else apply. So a replay is told only to a token
-- that may write now, and a paused former holder re-sending a key a newer holder used is
-- refused, never told "success" for someone else's write.
--
-- FN001 and FN002 DETAIL is a JSON object {"resource", "token", "current_token"} and, for
-- a write that carried an idempotency key, "key_applied" (boolean) and "applied_by_token"
-- (the token that applied it, 0 if none). fencing.pg.fencing_error turns FN001 into
-- StaleTokenError and FN002 into LeaseLost.

ALTER TABLE idempotency ADD COLUMN token bigint;

CREATE INDEX jobs_running_token ON jobs (token) WHERE state = 'running';

CREATE FUNCTION fencing_refused(
    p_code text, p_resource text, p_token bigint, p_fence bigint, p_idempotency_key text,
    p_applied_by bigint
)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_detail jsonb := jsonb_build_object('resource', p_resource, 'token', p_token,
                                         'current_token', p_fence);
BEGIN
    IF coalesce(p_idempotency_key, '') <> '' THEN
        v_detail := v_detail || jsonb_build_object(
            'key_applied', p_applied_by IS NOT NULL,
            'applied_by_token', coalesce(p_applied_by, 0));
    END IF;
    IF p_code = 'FN001' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FN001',
            MESSAGE = format('stale fencing token %s for %L: the fence is %s',
                             p_token, p_resource, p_fence),
            DETAIL = v_detail::text,
            HINT = 'A newer holder has written or fenced this resource: stop acting on it.';
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'FN002',
        MESSAGE = format('fencing token %s for %L is not the live lease or job claim',
                         p_token, p_resource),
        DETAIL = v_detail::text,
        HINT = 'The lease or claim expired, was released, was taken over or was never '
               'granted: stop acting on it.';
END
$$;

-- The live lease of the resource, or the live claim of the job owning it (its resource,
-- or 'job/<queue>/<id>' for a job without one, as lease_server/queue/jobs.py names it), by this
-- database's clock; FN002 otherwise. Share-locks the lease row, and the job row when the
-- claim is what makes the token live, until the calling transaction ends: no acquire,
-- renew, release, rescue, heartbeat or completion of them commits before it.
CREATE FUNCTION require_live_claim(
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
      AND (j.resource = p_resource
           OR (j.resource = '' AND p_resource = 'job/' || j.queue || '/' || j.id))
    FOR SHARE OF j;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM fencing_refused('FN002', p_resource, p_token, p_fence, p_idempotency_key,
                            p_applied_by);
END
$$;

CREATE OR REPLACE FUNCTION require_live_lease(p_resource text, p_token bigint, p_fence bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM require_live_claim(p_resource, p_token, p_fence, '', NULL);
END
$$;

-- Fence(resource, token): check_and_advance, and in strict mode the token must be the
-- live lease or job claim, so a token nobody holds cannot raise the fence.
CREATE FUNCTION guard_fence(p_resource text, p_token bigint, p_mode text) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_mode = 'strict' THEN
        RETURN check_live_lease(p_resource, p_token);
    END IF;
    RETURN check_and_advance(p_resource, p_token);
END
$$;

-- An operator's reset: the fence becomes exactly p_to_token, lower or higher. Never below
-- a token this database granted for the resource (the lease counter, the job's claim):
-- 22023 (invalid parameter value) otherwise. Returns the fence it replaced.
CREATE FUNCTION guard_reset_fence(p_resource text, p_to_token bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_before bigint := fence_lock(p_resource);
    v_granted bigint;
BEGIN
    SELECT greatest(
        (SELECT l.counter FROM leases AS l WHERE l.resource = p_resource FOR SHARE),
        (SELECT max(j.token) FROM jobs AS j
         WHERE j.resource = p_resource
            OR (j.resource = '' AND p_resource = 'job/' || j.queue || '/' || j.id)))
    INTO v_granted;
    IF p_to_token < coalesce(v_granted, 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('to_token %s is below token %s already granted for %L',
                             p_to_token, v_granted, p_resource);
    END IF;
    UPDATE fences AS f SET fence = p_to_token WHERE f.resource = p_resource;
    RETURN v_before;
END
$$;

DROP FUNCTION guard_write(text, bigint, text[], bytea[], text, text);

-- The guard's Write, in one round trip. p_keys[i] with p_values[i] is a put, with a
-- NULL value a delete; ops apply in order. p_mode is 'monotonic', 'strict' or 'off'.
-- Judged in the order above; the key is read after the fence row is locked (keys are
-- recorded only under that lock, so two concurrent retries cannot both apply).
CREATE FUNCTION guard_write(
    p_resource text, p_token bigint, p_keys text[], p_values bytea[],
    p_idempotency_key text, p_mode text,
    OUT fence bigint, OUT replayed boolean, OUT replayed_by_token bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_fence bigint := fence_lock(p_resource);
    v_rec_fence bigint;
    v_rec_token bigint;
BEGIN
    IF p_idempotency_key <> '' THEN
        SELECT i.fence, coalesce(i.token, i.fence) INTO v_rec_fence, v_rec_token
        FROM idempotency AS i
        WHERE i.resource = p_resource AND i.key = p_idempotency_key;
    END IF;
    IF p_mode <> 'off' AND p_token < v_fence THEN
        PERFORM fencing_refused('FN001', p_resource, p_token, v_fence, p_idempotency_key,
                                v_rec_token);
    END IF;
    IF v_rec_fence IS NOT NULL THEN
        IF p_mode = 'strict' THEN
            PERFORM require_live_claim(p_resource, p_token, v_fence, p_idempotency_key,
                                       v_rec_token);
        END IF;
        fence := v_rec_fence;
        replayed := true;
        replayed_by_token := v_rec_token;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF p_values[i] IS NULL THEN
            DELETE FROM data AS d WHERE d.resource = p_resource AND d.key = p_keys[i];
        ELSE
            INSERT INTO data AS d (resource, key, value, token)
            VALUES (p_resource, p_keys[i], p_values[i], p_token)
            ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value, token = excluded.token;
        END IF;
    END LOOP;
    IF p_token > v_fence THEN
        UPDATE fences AS f SET fence = p_token WHERE f.resource = p_resource;
        v_fence := p_token;
    END IF;
    IF p_idempotency_key <> '' THEN
        INSERT INTO idempotency (resource, key, fence, token)
        VALUES (p_resource, p_idempotency_key, v_fence, p_token);
    END IF;
    -- Last, so the lease is checked as close to COMMIT as a statement can be.
    IF p_mode = 'strict' THEN
        PERFORM require_live_claim(p_resource, p_token, v_fence, p_idempotency_key, NULL);
    END IF;
    fence := v_fence;
    replayed := false;
    replayed_by_token := 0;
END
$$;

DROP FUNCTION guard_write_many(text[], bigint[], integer[], text[], bytea[], text, text);

-- All or nothing over several resources (guard.fence.judge_all): every token is judged
-- first, and one stale token raises FN001 naming the first stale resource in sorted
-- order, whether or not the key is known; strict mode then requires every token live
-- (FN002, the first not live in sorted order). Then a key recorded under resources[1]
-- is a replay: nothing applies, and per resource the recorded fence and token come back
-- (the current fence and 0 where the key was pruned). Else every op applies in order,
-- every fence advances, and the key is recorded under every resource.
CREATE FUNCTION guard_write_many(
    p_resources text[], p_tokens bigint[], p_op_index integer[], p_keys text[],
    p_values bytea[], p_idempotency_key text, p_mode text,
    OUT fences bigint[], OUT replayed boolean, OUT replayed_by_tokens bigint[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_resource text;
    v_row record;
    v_fences bigint[];
    v_replay boolean;
BEGIN
    FOR v_resource IN
        SELECT r FROM unnest(p_resources) AS u(r) ORDER BY r COLLATE "C"
    LOOP
        PERFORM fence_lock(v_resource);
    END LOOP;
    IF p_mode <> 'off' THEN
        SELECT u.r, u.t, f.fence, coalesce(i.token, i.fence) AS applied_by INTO v_row
        FROM unnest(p_resources, p_tokens) AS u(r, t)
        JOIN fences AS f ON f.resource = u.r
        LEFT JOIN idempotency AS i
          ON p_idempotency_key <> '' AND i.resource = u.r AND i.key = p_idempotency_key
        WHERE u.t < f.fence
        ORDER BY u.r COLLATE "C"
        LIMIT 1;
        IF FOUND THEN
            PERFORM fencing_refused('FN001', v_row.r, v_row.t, v_row.fence,
                                    p_idempotency_key, v_row.applied_by);
        END IF;
    END IF;
    v_replay := p_idempotency_key <> '' AND EXISTS (
        SELECT 1 FROM idempotency AS i
        WHERE i.resource = p_resources[1] AND i.key = p_idempotency_key
    );
    IF p_mode = 'strict' AND v_replay THEN
        FOR v_row IN
            SELECT u.r, u.t, f.fence, coalesce(i.token, i.fence) AS applied_by
            FROM unnest(p_resources, p_tokens) AS u(r, t)
            JOIN fences AS f ON f.resource = u.r
            LEFT JOIN idempotency AS i ON i.resource = u.r AND i.key = p_idempotency_key
            ORDER BY u.r COLLATE "C"
        LOOP
            PERFORM require_live_claim(v_row.r, v_row.t, v_row.fence, p_idempotency_key,
                                       v_row.applied_by);
        END LOOP;
    END IF;
    IF v_replay THEN
        SELECT array_agg(coalesce(i.fence, f.fence) ORDER BY u.ord),
               array_agg(coalesce(i.token, i.fence, 0) ORDER BY u.ord)
        INTO fences, replayed_by_tokens
        FROM unnest(p_resources) WITH ORDINALITY AS u(r, ord)
        JOIN fences AS f ON f.resource = u.r
        LEFT JOIN idempotency AS i ON i.resource = u.r AND i.key = p_idempotency_key;
        replayed := true;
        RETURN;
    END IF;
    SELECT array_agg(f.fence ORDER BY u.ord) INTO v_fences
    FROM unnest(p_resources) WITH ORDINALITY AS u(r, ord)
    JOIN fences AS f ON f.resource = u.r;
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
        INSERT INTO idempotency (resource, key, fence, token)
        SELECT u.r, p_idempotency_key, u.fence, u.t
        FROM unnest(p_resources, fences, p_tokens) AS u(r, fence, t);
    END IF;
    -- Last, so every lease is checked as close to COMMIT as a statement can be.
    IF p_mode = 'strict' THEN
        FOR v_row IN
            SELECT u.r, u.t, u.fence FROM unnest(p_resources, p_tokens, fences) AS u(r, t, fence)
            ORDER BY u.r COLLATE "C"
        LOOP
            PERFORM require_live_claim(v_row.r, v_row.t, v_row.fence, p_idempotency_key, NULL);
        END LOOP;
    END IF;
    replayed := false;
    replayed_by_tokens := '{}';
END
$$;

DROP FUNCTION guard_write_batch(text[], bigint[], text[], integer[], text[], bytea[], text);

-- Independent writes in one transaction (group commit), judged in order exactly as
-- guard_write would judge each at its place: a stale token ('stale', with the fence at
-- that point, key known or not), a replayed idempotency key ('replayed', the recorded
-- fence), or accepted ('ok'). applied_by[i]: the token that applied write i's key, NULL
-- if none did (or it has none). A refused write changes nothing; the others land. Not
-- for strict mode (each strict write checks its lease right before its own commit).
-- Ops of the accepted writes apply set-based at the end; the last op on a (resource,
-- key) wins, which is what applying them one by one in order leaves.
CREATE FUNCTION guard_write_batch(
    p_resources text[], p_tokens bigint[], p_idempotency_keys text[], p_op_index integer[],
    p_keys text[], p_values bytea[], p_mode text,
    OUT outcomes text[], OUT fences bigint[], OUT applied_by bigint[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_res text[];
    v_fen bigint[];
    v_slot integer[];
    v_ok boolean[];
    v_rec_fence bigint;
    v_rec_token bigint;
    j integer;
    n integer := coalesce(array_length(p_resources, 1), 0);
BEGIN
    IF p_mode = 'strict' THEN
        RAISE EXCEPTION 'guard_write_batch does not take strict writes' USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        outcomes := '{}';
        fences := '{}';
        applied_by := '{}';
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
    applied_by := array_fill(NULL::bigint, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        j := v_slot[i];
        v_rec_fence := NULL;
        v_rec_token := NULL;
        IF p_idempotency_keys[i] <> '' THEN
            SELECT k.fence, coalesce(k.token, k.fence) INTO v_rec_fence, v_rec_token
            FROM idempotency AS k
            WHERE k.resource = p_resources[i] AND k.key = p_idempotency_keys[i];
        END IF;
        applied_by[i] := v_rec_token;
        IF p_mode <> 'off' AND p_tokens[i] < v_fen[j] THEN
            outcomes[i] := 'stale';
            fences[i] := v_fen[j];
            CONTINUE;
        END IF;
        IF v_rec_fence IS NOT NULL THEN
            outcomes[i] := 'replayed';
            fences[i] := v_rec_fence;
            CONTINUE;
        END IF;
        v_ok[i] := true;
        v_fen[j] := greatest(v_fen[j], p_tokens[i]);
        outcomes[i] := 'ok';
        fences[i] := v_fen[j];
        IF p_idempotency_keys[i] <> '' THEN
            INSERT INTO idempotency (resource, key, fence, token)
            VALUES (p_resources[i], p_idempotency_keys[i], v_fen[j], p_tokens[i]);
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
