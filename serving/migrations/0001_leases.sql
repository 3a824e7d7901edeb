-- 0001_leases: lease state and the four lease operations of the PostgreSQL lease backend.
--
-- Creates table  leases (one row per resource, never deleted)
-- and functions  lease_acquire(resource, holder, ttl_ms, request_id)
--                  -> (granted, replayed, holder, token, ttl_ms)
--                lease_renew(resource, token, holder, ttl_ms) -> holder, or NULL if lost
--                lease_release(resource, token, holder) -> true, or false if lost
--                lease_describe(resource) -> (held, holder, token, remaining_ms, last_token)
--                lease_channel() -> the NOTIFY channel that carries released resources
--
-- They implement lease_server/leases.py exactly (the contract suite holds both to it):
-- a grant takes counter + 1 only when the resource is free or expired; a retry with
-- the live lease's non-empty request_id and holder replays it; renew and release need
-- the current unexpired token (an empty holder skips the holder check); release keeps
-- the counter. Tokens come from the per-resource counter, never from a sequence: a
-- token is handed out only after the transaction that raised the counter committed.
--
-- Time is the database's: every decision reads clock_timestamp() while the row lock
-- is held, never now(), which is the start of the transaction and, for a statement
-- that waited for a row lock, can be long past.

CREATE TABLE leases (
    resource   text PRIMARY KEY,
    counter    bigint NOT NULL CHECK (counter >= 0),  -- the last token ever issued
    holder     text NOT NULL DEFAULT '',
    token      bigint NOT NULL DEFAULT 0,              -- the current lease's token; 0 when free
    expires_at timestamptz,                            -- NULL when free
    request_id text NOT NULL DEFAULT '',
    CHECK ((token = 0) = (expires_at IS NULL)),
    CHECK (token <= counter)
);

CREATE FUNCTION lease_channel() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT 'fencing_released:' || current_schema()
$$;

CREATE FUNCTION lease_acquire(
    p_resource text, p_holder text, p_ttl_ms bigint, p_request_id text,
    OUT granted boolean, OUT replayed boolean, OUT holder text, OUT token bigint,
    OUT ttl_ms bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cur leases%ROWTYPE;
    v_now timestamptz;
BEGIN
    LOOP
        -- Free, expired or new: take the next token in one statement. ON CONFLICT makes
        -- the first acquire of a resource race-free across servers.
        INSERT INTO leases AS l (resource, counter, holder, token, expires_at, request_id)
        VALUES (p_resource, 1, p_holder, 1,
                clock_timestamp() + p_ttl_ms * interval '1 millisecond', p_request_id)
        ON CONFLICT (resource) DO UPDATE
            SET counter = l.counter + 1,
                token = l.counter + 1,
                holder = excluded.holder,
                expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
                request_id = excluded.request_id
            WHERE l.token = 0 OR l.expires_at <= clock_timestamp()
        RETURNING l.token INTO token;
        IF FOUND THEN
            granted := true;
            replayed := false;
            holder := p_holder;
            ttl_ms := p_ttl_ms;
            RETURN;
        END IF;
        -- Live when the upsert looked. ON CONFLICT DO UPDATE locked the row even though
        -- its WHERE refused, so the row cannot change until we commit.
        SELECT * INTO cur FROM leases AS l WHERE l.resource = p_resource;
        v_now := clock_timestamp();
        IF cur.expires_at > v_now THEN
            granted := p_request_id <> '' AND cur.request_id = p_request_id
                       AND cur.holder = p_holder;
            replayed := granted;
            holder := cur.holder;
            token := cur.token;
            ttl_ms := ceil(extract(epoch FROM cur.expires_at - v_now) * 1000)::bigint;
            RETURN;
        END IF;
        -- It expired between the two clock readings. The row is locked by us, so the
        -- next round's upsert grants: the loop runs at most twice.
    END LOOP;
END
$$;

CREATE FUNCTION lease_renew(p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint)
RETURNS text
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE leases AS l
    SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
    WHERE l.resource = p_resource AND l.token = p_token AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (p_holder = '' OR l.holder = p_holder)
    RETURNING l.holder
$$;

CREATE FUNCTION lease_release(p_resource text, p_token bigint, p_holder text)
RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE leases AS l
    SET holder = '', token = 0, expires_at = NULL, request_id = ''
    WHERE l.resource = p_resource AND l.token = p_token AND l.token <> 0
      AND l.expires_at > clock_timestamp() AND (p_holder = '' OR l.holder = p_holder);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Delivered to listeners only if this transaction commits.
    PERFORM pg_notify(lease_channel(), p_resource);
    RETURN true;
END
$$;

CREATE FUNCTION lease_describe(
    p_resource text,
    OUT held boolean, OUT holder text, OUT token bigint, OUT remaining_ms bigint,
    OUT last_token bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    cur leases%ROWTYPE;
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO cur FROM leases AS l WHERE l.resource = p_resource;
    held := coalesce(cur.expires_at > v_now, false);
    holder := CASE WHEN held THEN cur.holder ELSE '' END;
    token := CASE WHEN held THEN cur.token ELSE 0 END;
    remaining_ms := CASE WHEN held
                    THEN ceil(extract(epoch FROM cur.expires_at - v_now) * 1000)::bigint
                    ELSE 0 END;
    last_token := coalesce(cur.counter, 0);
END
$$;
