-- 0002_guard: the fenced store of the guard, and fencing for your own transactions.
--
-- Creates tables fences (resource -> highest token applied or promised),
--                data (resource, key -> value and the token that wrote it),
--                idempotency (resource, key -> the fence its write left, and when)
-- and functions  check_and_advance(resource, token) -> fence            [public]
--                check_live_lease(resource, token) -> fence             [public]
--                guard_write(resource, token, keys, values, idempotency_key, mode)
--                  -> (fence, replayed)
--                fence_lock, raise_stale_token, require_live_lease      [internal]
--
-- Errors, catchable by SQLSTATE in your own code (class FN, "fencing"):
--   FN001  stale token: a token >= this one already wrote or fenced the resource.
--   FN002  lease not live: strict mode, and the token is not the resource's current
--          unexpired lease by this database's clock (expired, released or taken over).
-- DETAIL is a JSON object {"resource", "token", "current_token"} (fencing.pg.fencing_error
-- turns either into StaleTokenError carrying the fence, as the guard answers).
--
-- The fence rule is guard/fence.py's admit(): reject token < fence (modes monotonic and
-- strict), accept anything in mode off; the fence becomes greatest(token, fence).
-- Locks are taken in one order everywhere, fence row first, then the lease row, so
-- guard writes and user transactions on the same resource cannot deadlock each other.

CREATE TABLE fences (
    resource text PRIMARY KEY,
    fence    bigint NOT NULL CHECK (fence >= 0)
);

CREATE TABLE data (
    resource text NOT NULL,
    key      text NOT NULL,
    value    bytea NOT NULL,
    token    bigint NOT NULL,
    PRIMARY KEY (resource, key)
);

-- Kept for the guard's retention (default 24 h, pruned by age in batches); recorded_at
-- is the database's clock.
CREATE TABLE idempotency (
    resource    text NOT NULL,
    key         text NOT NULL,
    fence       bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (resource, key)
);
CREATE INDEX idempotency_recorded_at ON idempotency (recorded_at);

-- The resource's fence, its row created if missing (race-free) and locked FOR UPDATE
-- until the calling transaction ends.
CREATE FUNCTION fence_lock(p_resource text) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_fence bigint;
BEGIN
    SELECT f.fence INTO v_fence FROM fences AS f WHERE f.resource = p_resource FOR UPDATE;
    IF FOUND THEN
        RETURN v_fence;
    END IF;
    INSERT INTO fences (resource, fence) VALUES (p_resource, 0) ON CONFLICT DO NOTHING;
    SELECT f.fence INTO v_fence FROM fences AS f WHERE f.resource = p_resource FOR UPDATE;
    RETURN v_fence;
END
$$;

CREATE FUNCTION raise_stale_token(p_resource text, p_token bigint, p_fence bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'FN001',
        MESSAGE = format('stale fencing token %s for %L: the fence is %s',
                         p_token, p_resource, p_fence),
        DETAIL = json_build_object('resource', p_resource, 'token', p_token,
                                   'current_token', p_fence)::text,
        HINT = 'A newer holder has written or fenced this resource: stop acting on it.';
END
$$;

-- Share-locks the lease row until the calling transaction ends, so no acquire, renew or
-- release of the resource commits before it: no other holder can be granted the
-- resource before this transaction commits.
CREATE FUNCTION require_live_lease(p_resource text, p_token bigint, p_fence bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_token bigint;
    v_expires_at timestamptz;
BEGIN
    SELECT l.token, l.expires_at INTO v_token, v_expires_at
    FROM leases AS l WHERE l.resource = p_resource FOR SHARE;
    IF v_token IS DISTINCT FROM p_token OR NOT coalesce(v_expires_at > clock_timestamp(), false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FN002',
            MESSAGE = format('fencing token %s for %L is not the live lease', p_token,
                             p_resource),
            DETAIL = json_build_object('resource', p_resource, 'token', p_token,
                                       'current_token', p_fence)::text,
            HINT = 'The lease expired, was released or was taken over: stop acting on it.';
    END IF;
END
$$;

-- Public. Call it inside your own transaction before (or after) your writes: raises FN001
-- if token < the resource's fence, else advances the fence to token and returns it.
-- The fence row stays locked until your transaction ends; keep the transaction short.
CREATE FUNCTION check_and_advance(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_fence bigint := fence_lock(p_resource);
BEGIN
    IF p_token < v_fence THEN
        PERFORM raise_stale_token(p_resource, p_token, v_fence);
    END IF;
    IF p_token > v_fence THEN
        UPDATE fences AS f SET fence = p_token WHERE f.resource = p_resource;
    END IF;
    RETURN p_token;
END
$$;

-- Public, strict variant: check_and_advance, then also require token to be the
-- resource's current unexpired lease (FN002 otherwise). Needs the lease server on
-- this database and schema. The lease row stays share-locked until your transaction
-- ends, which holds back renewals and takeovers of the resource meanwhile.
CREATE FUNCTION check_live_lease(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_fence bigint := check_and_advance(p_resource, p_token);
BEGIN
    PERFORM require_live_lease(p_resource, p_token, v_fence);
    RETURN v_fence;
END
$$;

-- The guard's Write, in one round trip. p_keys[i] with p_values[i] is a put, with a
-- NULL value a delete; ops apply in order. p_mode is 'monotonic', 'strict' or 'off'.
-- A repeated non-empty idempotency key returns the recorded fence with replayed = true
-- and applies nothing. Checked after the fence row is locked: keys are recorded only
-- under that lock, so two concurrent retries cannot both apply.
CREATE FUNCTION guard_write(
    p_resource text, p_token bigint, p_keys text[], p_values bytea[],
    p_idempotency_key text, p_mode text,
    OUT fence bigint, OUT replayed boolean
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_fence bigint := fence_lock(p_resource);
    v_recorded bigint;
BEGIN
    IF p_idempotency_key <> '' THEN
        SELECT i.fence INTO v_recorded FROM idempotency AS i
        WHERE i.resource = p_resource AND i.key = p_idempotency_key;
        IF FOUND THEN
            fence := v_recorded;
            replayed := true;
            RETURN;
        END IF;
    END IF;
    IF p_mode <> 'off' AND p_token < v_fence THEN
        PERFORM raise_stale_token(p_resource, p_token, v_fence);
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
        INSERT INTO idempotency (resource, key, fence)
        VALUES (p_resource, p_idempotency_key, v_fence);
    END IF;
    -- Last, so the lease is checked as close to COMMIT as a statement can be.
    IF p_mode = 'strict' THEN
        PERFORM require_live_lease(p_resource, p_token, v_fence);
    END IF;
    fence := v_fence;
    replayed := false;
END
$$;
