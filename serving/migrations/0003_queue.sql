-- 0003_queue: the jobs of the queue service, and the functions of its PostgreSQL backend.
--
-- Creates sequence job_tokens (every claim's token: only grows, never reset)
--         table    jobs (one row per job; ids never reused)
--         view     job_rows (jobs with times as Unix milliseconds, as the backend reads them)
-- and functions    job_enqueue(queue, payload, idempotency_key, ordering_key, priority,
--                    max_attempts, delay_ms, run_at, resource) -> (id, created, state)  [public]
--                  job_enqueue_many(queue, arrays of the same) -> setof (id, created, state)
--                  job_claim(queue, worker, limit, ttl_ms) -> setof job_rows
--                  job_heartbeat(ids, tokens, ttl_ms, queue) -> the first stale (id, token, resource)
--                  job_complete(ids, tokens, queue) -> the first stale (...), queues woken
--                  job_release(ids, tokens, queue) -> the first stale (...), queues woken
--                  job_reap(limit) -> jobs declared dead
--                  job_prune(succeeded_ms, dead_ms, limit) -> jobs deleted
--                  job_stats(queue, window_ms) -> setof counts per queue
--                  job_lock_key, job_promote, job_ms                              [internal]
--
-- They implement lease_server/queue/jobs.py (the contract suite holds both to it); Fail runs
-- that module's rule itself inside a transaction of the backend (lease_server/queue/backends/
-- postgres.py). States: waiting -> ready -> running -> succeeded | ready | dead.
--
-- Claim is one statement: running jobs whose lease expired (attempts left) and ready,
-- due jobs are picked with FOR UPDATE SKIP LOCKED, so concurrent claimers never wait
-- for each other nor take the same row; each claimed row takes nextval(job_tokens),
-- and a row is only ever claimed after the claim before it committed, so a job's
-- tokens grow. Calls naming claimed jobs lock their rows in id order (no deadlocks
-- between batches), judge every token first, and change nothing when one is stale.
--
-- Ordering keys: at most one job per (queue, ordering_key) is ready or running (the
-- earliest live one); later ones are 'waiting'. Every change to a key's set of live
-- jobs (enqueue, and a job finishing: succeeded or dead) holds a transaction-level
-- advisory lock on the key, so an enqueue never misses a promotion and ids follow
-- commit order within a key. A unique partial index refuses a second running job of
-- a key outright, whatever happens above it.
--
-- Time is the database's now(): the claim's statement start. Expiry judged at the
-- statement start is conservative (a lease looks live a little longer), and a lease
-- granted until now() + ttl ends after the worker's own deadline (its send time + ttl
-- - margin), because the worker sent its request before the statement started.

CREATE SEQUENCE job_tokens AS bigint;

CREATE TABLE jobs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue           text NOT NULL,
    payload         bytea NOT NULL,
    state           text NOT NULL
                    CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead')),
    resource        text NOT NULL DEFAULT '',
    ordering_key    text NOT NULL DEFAULT '',
    idempotency_key text,
    priority        integer NOT NULL DEFAULT 0,
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL CHECK (max_attempts > 0),
    token           bigint NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),
    lease_owner     text NOT NULL DEFAULT '',
    lease_until     timestamptz,
    last_error      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK ((state = 'running') = (lease_until IS NOT NULL)),
    CHECK ((state IN ('succeeded', 'dead')) = (finished_at IS NOT NULL))
);

-- Partial indexes: a claim reads only live rows however many finished ones pile up.
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready';
CREATE INDEX jobs_running ON jobs (queue, lease_until)
    WHERE state = 'running';
CREATE INDEX jobs_live_by_key ON jobs (queue, ordering_key, id)
    WHERE ordering_key <> '' AND state IN ('waiting', 'ready', 'running');
CREATE UNIQUE INDEX jobs_one_running_per_key ON jobs (queue, ordering_key)
    WHERE ordering_key <> '' AND state = 'running';
CREATE INDEX jobs_finished ON jobs (state, finished_at)
    WHERE state IN ('succeeded', 'dead');

-- A time as Unix milliseconds (0 for NULL).
CREATE FUNCTION job_ms(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce(floor(extract(epoch FROM t) * 1000)::bigint, 0)
$$;

CREATE VIEW job_rows AS
SELECT id, queue, payload, state, resource, ordering_key, idempotency_key, priority,
       attempts, max_attempts, token, job_ms(available_at) AS available_at_ms, lease_owner,
       job_ms(lease_until) AS lease_until_ms, last_error, job_ms(created_at) AS created_at_ms,
       job_ms(finished_at) AS finished_at_ms
FROM jobs;

-- Hold the (queue, ordering key) lock until the transaction ends. Queue names hold no
-- control characters, so the newline separator is unambiguous.
CREATE FUNCTION job_lock_key(p_queue text, p_key text) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_advisory_xact_lock(1785684595, hashtext(p_queue || E'\n' || p_key))
$$;

-- After a job of (queue, key) finished: make the key's earliest waiting job ready,
-- unless a job of the key is still ready or running. True if one became ready.
CREATE FUNCTION job_promote(p_queue text, p_key text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_key = '' THEN
        RETURN false;
    END IF;
    PERFORM job_lock_key(p_queue, p_key);
    IF EXISTS (SELECT 1 FROM jobs AS j
               WHERE j.queue = p_queue AND j.ordering_key = p_key AND j.ordering_key <> ''
                 AND j.state IN ('ready', 'running')) THEN
        RETURN false;
    END IF;
    UPDATE jobs AS j SET state = 'ready'
    WHERE j.id = (SELECT w.id FROM jobs AS w
                  WHERE w.queue = p_queue AND w.ordering_key = p_key AND w.ordering_key <> ''
                    AND w.state = 'waiting'
                  ORDER BY w.id LIMIT 1);
    RETURN FOUND;
END
$$;

-- Add one job; public, so your own transaction can enqueue atomically with its writes.
-- An idempotency key already used in the queue returns that job (created = false).
-- A job whose ordering key has a live job starts 'waiting'. Due at run_at if given,
-- else now() + delay_ms. Empty idempotency_key means none.
CREATE FUNCTION job_enqueue(
    p_queue text, p_payload bytea, p_idempotency_key text DEFAULT NULL,
    p_ordering_key text DEFAULT '', p_priority integer DEFAULT 0,
    p_max_attempts integer DEFAULT 5, p_delay_ms bigint DEFAULT 0,
    p_run_at timestamptz DEFAULT NULL, p_resource text DEFAULT '',
    OUT id bigint, OUT created boolean, OUT state text
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    v_key text := nullif(p_idempotency_key, '');
    v_order text := coalesce(p_ordering_key, '');
BEGIN
    IF v_order <> '' THEN
        PERFORM job_lock_key(p_queue, v_order);
    END IF;
    IF v_key IS NOT NULL THEN
        SELECT j.id, j.state INTO id, state
        FROM jobs AS j WHERE j.queue = p_queue AND j.idempotency_key = v_key;
        IF FOUND THEN
            created := false;
            RETURN;
        END IF;
    END IF;
    state := CASE WHEN v_order <> '' AND EXISTS (
                      SELECT 1 FROM jobs AS j
                      WHERE j.queue = p_queue AND j.ordering_key = v_order
                        AND j.ordering_key <> '' AND j.state IN ('waiting', 'ready', 'running'))
                  THEN 'waiting' ELSE 'ready' END;
    INSERT INTO jobs AS j (queue, payload, state, resource, ordering_key, idempotency_key,
                           priority, max_attempts, available_at)
    VALUES (p_queue, p_payload, state, coalesce(p_resource, ''), v_order, v_key,
            coalesce(p_priority, 0), coalesce(p_max_attempts, 5),
            coalesce(p_run_at, now() + coalesce(p_delay_ms, 0) * interval '1 millisecond'))
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO id;
    IF FOUND THEN
        created := true;
        RETURN;
    END IF;
    -- A concurrent enqueue with the same key committed first: return its job.
    SELECT j.id, j.state INTO id, state
    FROM jobs AS j WHERE j.queue = p_queue AND j.idempotency_key = v_key;
    created := false;
END
$$;

-- Enqueue a batch in order, in the caller's transaction. A batch with neither ordering
-- nor idempotency keys is one INSERT (ids follow the batch order). Otherwise every
-- ordering key of the batch is locked first, in one order, so concurrent batches
-- cannot deadlock, and the jobs go through job_enqueue one by one.
CREATE FUNCTION job_enqueue_many(
    p_queue text, p_payloads bytea[], p_idempotency_keys text[], p_ordering_keys text[],
    p_priorities integer[], p_max_attempts integer[], p_delays_ms bigint[],
    p_run_ats timestamptz[], p_resources text[]
)
RETURNS TABLE (id bigint, created boolean, state text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_key text;
    v_row record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unnest(p_ordering_keys) AS k WHERE k <> '')
       AND NOT EXISTS (SELECT 1 FROM unnest(p_idempotency_keys) AS k WHERE k <> '') THEN
        RETURN QUERY
        WITH added AS (
            INSERT INTO jobs (queue, payload, state, resource, priority, max_attempts,
                              available_at)
            SELECT p_queue, u.payload, 'ready', coalesce(u.resource, ''), coalesce(u.priority, 0),
                   coalesce(u.max_attempts, 5),
                   coalesce(u.run_at, now() + coalesce(u.delay_ms, 0) * interval '1 millisecond')
            FROM unnest(p_payloads, p_priorities, p_max_attempts, p_delays_ms, p_run_ats,
                        p_resources)
                 WITH ORDINALITY AS u (payload, priority, max_attempts, delay_ms, run_at,
                                       resource, n)
            ORDER BY u.n
            RETURNING jobs.id, jobs.state
        )
        SELECT a.id, true, a.state FROM added AS a ORDER BY a.id;
        RETURN;
    END IF;
    FOR v_key IN SELECT DISTINCT k FROM unnest(p_ordering_keys) AS k WHERE k <> '' ORDER BY k
    LOOP
        PERFORM job_lock_key(p_queue, v_key);
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(p_payloads, 1), 0) LOOP
        SELECT * INTO v_row FROM job_enqueue(
            p_queue, p_payloads[i], p_idempotency_keys[i], p_ordering_keys[i],
            p_priorities[i], p_max_attempts[i], p_delays_ms[i], p_run_ats[i], p_resources[i]);
        id := v_row.id;
        created := v_row.created;
        state := v_row.state;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Claim up to p_limit jobs of a queue: expired running ones with attempts left first
-- (a rescue: the old worker's token goes stale), then ready, due ones by priority, due
-- time and id. Each gets a fresh token, attempts + 1, and a lease until now() + ttl.
-- The candidates are picked (and locked) into arrays first, so the UPDATE reaches them
-- through the primary key whatever the table's size; rows come back in claim order.
CREATE FUNCTION job_claim(p_queue text, p_worker text, p_limit integer, p_ttl_ms bigint)
RETURNS SETOF job_rows
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_rescued bigint[];
    v_ready bigint[] := '{}';
    v_left integer;
BEGIN
    SELECT coalesce(array_agg(c.id), '{}') INTO v_rescued FROM (
        SELECT j.id FROM jobs AS j
        WHERE j.queue = p_queue AND j.state = 'running' AND j.lease_until <= now()
          AND j.attempts < j.max_attempts
        ORDER BY j.lease_until, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ) AS c;
    v_left := p_limit - coalesce(array_length(v_rescued, 1), 0);
    IF v_left > 0 THEN
        SELECT coalesce(array_agg(c.id), '{}') INTO v_ready FROM (
            SELECT j.id FROM jobs AS j
            WHERE j.queue = p_queue AND j.state = 'ready' AND j.available_at <= now()
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT v_left
            FOR UPDATE SKIP LOCKED
        ) AS c;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE jobs AS j
        SET state = 'running',
            attempts = j.attempts + 1,
            token = nextval('job_tokens'),
            lease_owner = p_worker,
            lease_until = now() + p_ttl_ms * interval '1 millisecond',
            last_error = CASE WHEN j.state = 'running'
                              THEN format('lease expired: attempt %s by %s did not finish',
                                          j.attempts, j.lease_owner)
                              ELSE j.last_error END
        WHERE j.id = ANY (v_rescued || v_ready)
        RETURNING j.id, j.queue, j.payload, j.state, j.resource, j.ordering_key,
                  j.idempotency_key, j.priority, j.attempts, j.max_attempts, j.token,
                  job_ms(j.available_at) AS available_at_ms, j.lease_owner,
                  job_ms(j.lease_until) AS lease_until_ms, j.last_error,
                  job_ms(j.created_at) AS created_at_ms,
                  job_ms(j.finished_at) AS finished_at_ms,
                  j.id = ANY (v_rescued) AS rescued
    )
    -- In claim order, as lease_server/queue/jobs.py claim_order() sorts: rescues first.
    SELECT c.id, c.queue, c.payload, c.state, c.resource, c.ordering_key, c.idempotency_key,
           c.priority, c.attempts, c.max_attempts, c.token, c.available_at_ms, c.lease_owner,
           c.lease_until_ms, c.last_error, c.created_at_ms, c.finished_at_ms
    FROM claimed AS c
    ORDER BY c.rescued DESC, CASE WHEN c.rescued THEN 0 ELSE -c.priority END,
             c.available_at_ms, c.id;
END
$$;

-- The first of the named claims (in the order given) that is stale for an action, or
-- no row. p_replay_state: the state in which the same token means "already done".
-- p_queue: when not '', a job of another queue is stale (and named as not existing).
CREATE FUNCTION job_first_stale(
    p_ids bigint[], p_tokens bigint[], p_replay_state text, p_queue text
)
RETURNS TABLE (stale_id bigint, stale_token bigint, stale_resource text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT r.id, r.token,
           CASE WHEN j.id IS NULL OR (p_queue <> '' AND j.queue <> p_queue) THEN ''
                WHEN j.resource <> '' THEN j.resource
                ELSE 'job/' || j.queue || '/' || j.id END
    FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS r (id, token, n)
    LEFT JOIN jobs AS j ON j.id = r.id
    WHERE j.id IS NULL OR j.token <> r.token OR (p_queue <> '' AND j.queue <> p_queue)
       OR NOT (j.state = 'running' OR j.state = p_replay_state)
    ORDER BY r.n
    LIMIT 1
$$;

-- Lock the named rows in id order (so batches cannot deadlock each other).
CREATE FUNCTION job_lock_rows(p_ids bigint[]) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT NULL::void FROM (SELECT j.id FROM jobs AS j WHERE j.id = ANY(p_ids)
                            ORDER BY j.id FOR UPDATE) AS locked
$$;

-- Extend the named claims to now() + ttl, or return the first stale one and change nothing.
CREATE FUNCTION job_heartbeat(
    p_ids bigint[], p_tokens bigint[], p_ttl_ms bigint, p_queue text DEFAULT ''
)
RETURNS TABLE (stale_id bigint, stale_token bigint, stale_resource text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM job_lock_rows(p_ids);
    RETURN QUERY SELECT * FROM job_first_stale(p_ids, p_tokens, 'running', p_queue);
    IF FOUND THEN
        RETURN;
    END IF;
    UPDATE jobs AS j SET lease_until = now() + p_ttl_ms * interval '1 millisecond'
    WHERE j.id = ANY(p_ids);
END
$$;

-- Mark the named claims succeeded (a repeat is a no-op), or return the first stale one
-- and change nothing. woken: the queues where the next job of an ordering key became ready.
CREATE FUNCTION job_complete(
    p_ids bigint[], p_tokens bigint[], p_queue text,
    OUT stale_id bigint, OUT stale_token bigint, OUT stale_resource text, OUT woken text[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_queues text[];
    v_keys text[];
BEGIN
    woken := '{}';
    PERFORM job_lock_rows(p_ids);
    SELECT s.stale_id, s.stale_token, s.stale_resource INTO stale_id, stale_token, stale_resource
    FROM job_first_stale(p_ids, p_tokens, 'succeeded', p_queue) AS s;
    IF FOUND THEN
        RETURN;
    END IF;
    WITH done AS (
        UPDATE jobs AS j
        SET state = 'succeeded', finished_at = now(), lease_owner = '', lease_until = NULL,
            last_error = ''
        WHERE j.id = ANY(p_ids) AND j.state = 'running'
        RETURNING j.queue, j.ordering_key
    )
    SELECT array_agg(k.queue ORDER BY k.queue, k.ordering_key),
           array_agg(k.ordering_key ORDER BY k.queue, k.ordering_key)
    INTO v_queues, v_keys
    FROM (SELECT DISTINCT d.queue, d.ordering_key FROM done AS d WHERE d.ordering_key <> '') AS k;
    FOR i IN 1 .. coalesce(array_length(v_queues, 1), 0) LOOP
        IF job_promote(v_queues[i], v_keys[i]) THEN
            woken := woken || v_queues[i];
        END IF;
    END LOOP;
END
$$;

-- Give the named claims back, due now, the attempt not counted (a repeat is a no-op),
-- or return the first stale one and change nothing. woken: the queues released into.
CREATE FUNCTION job_release(
    p_ids bigint[], p_tokens bigint[], p_queue text,
    OUT stale_id bigint, OUT stale_token bigint, OUT stale_resource text, OUT woken text[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    woken := '{}';
    PERFORM job_lock_rows(p_ids);
    SELECT s.stale_id, s.stale_token, s.stale_resource INTO stale_id, stale_token, stale_resource
    FROM job_first_stale(p_ids, p_tokens, 'ready', p_queue) AS s;
    IF FOUND THEN
        RETURN;
    END IF;
    WITH back AS (
        UPDATE jobs AS j
        SET state = 'ready', attempts = greatest(j.attempts - 1, 0), available_at = now(),
            lease_owner = '', lease_until = NULL
        WHERE j.id = ANY(p_ids) AND j.state = 'running'
        RETURNING j.queue
    )
    SELECT coalesce(array_agg(DISTINCT b.queue), '{}') INTO woken FROM back AS b;
END
$$;

-- Declare dead up to p_limit running jobs whose final attempt's lease expired; let their
-- ordering keys move on. Returns how many.
CREATE FUNCTION job_reap(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_queues text[];
    v_keys text[];
BEGIN
    WITH victims AS (
        SELECT j.id FROM jobs AS j
        WHERE j.state = 'running' AND j.lease_until <= now() AND j.attempts >= j.max_attempts
        ORDER BY j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), dead AS (
        UPDATE jobs AS j
        SET state = 'dead', finished_at = now(), lease_owner = '', lease_until = NULL,
            last_error = 'lease expired after the final attempt'
        FROM victims WHERE j.id = victims.id
        RETURNING j.queue, j.ordering_key
    )
    SELECT coalesce(array_agg(d.queue ORDER BY d.queue, d.ordering_key), '{}'),
           coalesce(array_agg(d.ordering_key ORDER BY d.queue, d.ordering_key), '{}')
    INTO v_queues, v_keys
    FROM dead AS d;
    FOR i IN 1 .. coalesce(array_length(v_queues, 1), 0) LOOP
        PERFORM job_promote(v_queues[i], v_keys[i]);
    END LOOP;
    RETURN coalesce(array_length(v_queues, 1), 0);
END
$$;

-- Delete up to p_limit finished jobs older than their state's retention (NULL: keep).
CREATE FUNCTION job_prune(p_succeeded_ms bigint, p_dead_ms bigint, p_limit integer)
RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_done integer := 0;
    v_n integer;
BEGIN
    IF p_succeeded_ms IS NOT NULL THEN
        DELETE FROM jobs WHERE id IN (
            SELECT j.id FROM jobs AS j
            WHERE j.state = 'succeeded'
              AND j.finished_at < now() - p_succeeded_ms * interval '1 millisecond'
            LIMIT p_limit);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_done := v_done + v_n;
    END IF;
    IF p_dead_ms IS NOT NULL AND v_done < p_limit THEN
        DELETE FROM jobs WHERE id IN (
            SELECT j.id FROM jobs AS j
            WHERE j.state = 'dead'
              AND j.finished_at < now() - p_dead_ms * interval '1 millisecond'
            LIMIT p_limit - v_done);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_done := v_done + v_n;
    END IF;
    RETURN v_done;
END
$$;

-- Counts per queue ('' for all), as lease_server/queue/jobs.py count() defines them.
CREATE FUNCTION job_stats(p_queue text, p_window_ms bigint)
RETURNS TABLE (
    queue text, ready bigint, scheduled bigint, waiting bigint, running bigint,
    expired bigint, succeeded bigint, dead bigint, oldest_ready_age_ms bigint,
    retrying bigint, finished_in_window bigint, attempts_in_window bigint
)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'ready' AND j.available_at <= now()),
           count(*) FILTER (WHERE j.state = 'ready' AND j.available_at > now()),
           count(*) FILTER (WHERE j.state = 'waiting'),
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'running' AND j.lease_until <= now()),
           count(*) FILTER (WHERE j.state = 'succeeded'),
           count(*) FILTER (WHERE j.state = 'dead'),
           coalesce(job_ms(now()) - job_ms(min(j.available_at)
               FILTER (WHERE j.state = 'ready' AND j.available_at <= now())), 0),
           count(*) FILTER (WHERE j.state IN ('ready', 'waiting') AND j.attempts > 0),
           count(*) FILTER (WHERE j.state IN ('succeeded', 'dead')
                            AND j.finished_at >= now() - p_window_ms * interval '1 millisecond'),
           coalesce(sum(j.attempts) FILTER (WHERE j.state IN ('succeeded', 'dead')
                            AND j.finished_at >= now() - p_window_ms * interval '1 millisecond'),
                    0)::bigint
    FROM jobs AS j
    WHERE p_queue = '' OR j.queue = p_queue
    GROUP BY j.queue
    ORDER BY j.queue
$$;
