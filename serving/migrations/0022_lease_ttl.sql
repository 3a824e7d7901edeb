-- 0022_lease_ttl: each lease keeps its own ttl, and a renewal naming none (ttl_ms 0) renews by it.
--
-- Adds     leases.ttl_ms: the ttl of the lease's grant or last renewal (0 when free; a lease
--          held across this migration gets 10000, the SDK's default, which its renewals sent).
-- Replaces lease_steps (0019): the same arguments and rows; a renew step with ttl 0 extends
--          the lease by its own ttl (leases.renew_ttl in lease_server/leases.py), and its
--          row's ttl_ms is the ttl granted;
--          lease_renew_many (0018): its rows gain ttl_ms, the ttl granted;
--          lease_describe (0001): gains ttl_ms, the held lease's own (0 when free);
--          job_complete, job_reap (0003): a job that succeeded or died keeps its
--          lease_owner, the worker that ran it (jobs.py's complete and reap), as a failed
--          or cancelled one does (decided in Python since 0003/0015).
--
-- Why. `fencing lease renew NAME TOKEN` sent the CLI's default ttl, 10 s, so renewing a
-- lease taken for a minute shortened it: a keep-alive (etcd's) keeps the lease's own ttl.

ALTER TABLE leases ADD COLUMN ttl_ms bigint NOT NULL DEFAULT 0 CHECK (ttl_ms >= 0);
UPDATE leases SET ttl_ms = 10000 WHERE token <> 0;

CREATE OR REPLACE FUNCTION lease_steps(
    p_kinds text[], p_resources text[], p_holders text[], p_tokens bigint[],
    p_ttl_ms bigint[], p_request_ids text[]
)
RETURNS TABLE (ord bigint, ok boolean, replayed boolean, holder text, token bigint,
               ttl_ms bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_missing boolean;
    v_distinct bigint;
    -- The round of each step (its resource's k-th step: round k), NULL when all are 1.
    v_occ bigint[];
    v_rounds bigint := 1;
    v_round bigint := 1;
    v_head bigint := 0;
    v_busy boolean := false;
    v_revisions bigint[] := '{}';
    -- One entry per step, in the order judged; ev: it appended events.
    r_ord bigint[] := '{}';
    r_ok boolean[] := '{}';
    r_replayed boolean[] := '{}';
    r_holder text[] := '{}';
    r_token bigint[] := '{}';
    r_ttl bigint[] := '{}';
    r_ev boolean[] := '{}';
    -- One entry per event, in the order appended.
    e_kind text[] := '{}';
    e_resource text[] := '{}';
    e_token bigint[] := '{}';
    e_holder text[] := '{}';
    e_ttl bigint[] := '{}';
BEGIN
    IF NOT p_kinds <@ ARRAY['acquire', 'renew', 'release'] THEN
        RAISE EXCEPTION 'lease_steps: unknown step kind in %', p_kinds;
    END IF;
    -- 1. Every row, in the lock order; a free row for a new resource to acquire. Rows
    -- are never deleted, so when every resource to acquire has one now, it still has
    -- one when it is locked: a plain FOR UPDATE in that order locks them all.
    SELECT coalesce(bool_or(u.k = 'acquire'
                            AND NOT EXISTS (SELECT 1 FROM leases AS x WHERE x.resource = u.r)),
                    false),
           count(DISTINCT u.r)
    INTO v_missing, v_distinct
    FROM unnest(p_resources, p_kinds) AS u(r, k);
    IF v_missing THEN
        INSERT INTO leases AS l (resource, counter)
        SELECT s.r, 0
        FROM (SELECT u.r, bool_or(u.k = 'acquire') AS acquired
              FROM unnest(p_resources, p_kinds) AS u(r, k) GROUP BY u.r) AS s
        WHERE s.acquired OR EXISTS (SELECT 1 FROM leases AS x WHERE x.resource = s.r)
        ORDER BY s.r COLLATE "C"
        ON CONFLICT (resource) DO UPDATE SET counter = l.counter WHERE false;
    ELSE
        PERFORM 1 FROM leases AS l WHERE l.resource = ANY (p_resources)
        ORDER BY l.resource COLLATE "C" FOR UPDATE;
    END IF;
    -- 2. The instant of every decision, read with every lock held.
    v_now := clock_timestamp();
    IF v_distinct < cardinality(p_resources) THEN
        SELECT array_agg(x.n ORDER BY x.o), max(x.n) INTO v_occ, v_rounds
        FROM (SELECT u.o, row_number() OVER (PARTITION BY u.r ORDER BY u.o) AS n
              FROM unnest(p_resources) WITH ORDINALITY AS u(r, o)) AS x;
    END IF;
    -- 3. One statement per round: decide, apply, and collect verdicts and events.
    WHILE v_round <= v_rounds LOOP
        WITH s AS (
            SELECT u.k, u.r, u.h, u.t, u.ttl, u.rid, u.o
            FROM unnest(p_kinds, p_resources, p_holders, p_tokens, p_ttl_ms, p_request_ids)
                 WITH ORDINALITY AS u(k, r, h, t, ttl, rid, o)
            WHERE coalesce(v_occ[u.o], 1) = v_round
        ), cur AS (
            SELECT s.*, l.holder AS l_holder, l.token AS l_token, l.expires_at AS l_expires,
                   l.request_id AS l_request_id, l.ttl_ms AS l_ttl,
                   coalesce(l.token <> 0 AND l.expires_at > v_now, false) AS live
            FROM s LEFT JOIN leases AS l ON l.resource = s.r
        ), judged AS (
            SELECT c.*,
                   CASE c.k
                       WHEN 'acquire' THEN NOT c.live
                       ELSE coalesce(c.live AND c.l_token = c.t AND c.t <> 0
                                     AND (c.h = '' OR c.l_holder = c.h), false)
                   END AS change,
                   c.k = 'acquire' AND c.live AND c.rid <> '' AND c.l_request_id = c.rid
                       AND c.l_holder = c.h AS again,
                   -- The ttl granted: a renewal naming none (0) takes the lease's own.
                   CASE WHEN c.k = 'renew' AND c.ttl = 0
                        THEN coalesce(nullif(c.l_ttl, 0), 10000::bigint)
                        ELSE c.ttl END AS eff
            FROM cur AS c
        ), changed AS (
            -- Each changed step's verdict straight from the row it updated: joining the
            -- judged steps to the changed rows instead made a nested loop of the two
            -- (their sizes unknown to a generic plan), quadratic in the calls of a step.
            UPDATE leases AS l
            SET counter = CASE WHEN j.k = 'acquire' THEN l.counter + 1 ELSE l.counter END,
                token = CASE j.k WHEN 'acquire' THEN l.counter + 1
                                 WHEN 'renew' THEN l.token ELSE 0 END,
                holder = CASE j.k WHEN 'acquire' THEN j.h
                                  WHEN 'renew' THEN l.holder ELSE '' END,
                expires_at = CASE WHEN j.k = 'release' THEN NULL
                                  ELSE v_now + j.eff * interval '1 millisecond' END,
                ttl_ms = CASE WHEN j.k = 'release' THEN 0::bigint ELSE j.eff END,
                request_id = CASE j.k WHEN 'acquire' THEN j.rid
                                      WHEN 'renew' THEN l.request_id ELSE '' END
            FROM judged AS j
            WHERE l.resource = j.r AND j.change
            RETURNING j.o, j.r, j.k, j.l_token, j.l_holder, j.h, j.eff AS ttl, j.t,
                      l.token AS new_token
        ), verdicts AS (
            SELECT c.o, c.r, c.k, true AS change, c.l_token, c.l_holder, c.h, c.ttl, c.t,
                   true AS ok,
                   false AS replayed,
                   CASE WHEN c.k = 'renew' THEN c.l_holder ELSE c.h END AS v_holder,
                   CASE WHEN c.k = 'acquire' THEN c.new_token ELSE c.t END AS v_token,
                   CASE WHEN c.k = 'release' THEN 0::bigint ELSE c.ttl END AS v_ttl
            FROM changed AS c
            UNION ALL
            SELECT j.o, j.r, j.k, false, j.l_token, j.l_holder, j.h, j.ttl, j.t,
                   j.again,
                   j.again,
                   CASE j.k WHEN 'acquire' THEN j.l_holder WHEN 'renew' THEN '' ELSE j.h END,
                   CASE WHEN j.k = 'acquire' THEN j.l_token ELSE j.t END,
                   CASE j.k WHEN 'acquire' THEN
                                ceil(extract(epoch FROM j.l_expires - v_now) * 1000)::bigint
                            WHEN 'release' THEN 0::bigint
                            ELSE j.ttl END
            FROM judged AS j
            WHERE NOT j.change
        ), events AS (
            SELECT v.o, v.r, e.n, e.kind, e.token, e.holder, e.ttl
            FROM verdicts AS v
            CROSS JOIN LATERAL (VALUES
                (1, 'expired', v.l_token, v.l_holder, 0::bigint),
                (2, 'acquired', v.v_token, v.h, v.ttl),
                (3, 'released', v.t, v.l_holder, 0::bigint)
            ) AS e(n, kind, token, holder, ttl)
            WHERE v.change AND CASE e.n WHEN 1 THEN v.k = 'acquire' AND v.l_token <> 0
                                        WHEN 2 THEN v.k = 'acquire'
                                        ELSE v.k = 'release' END
        )
        SELECT r_ord || coalesce(a.o, '{}'), r_ok || coalesce(a.ok, '{}'),
               r_ev || coalesce(a.ev, '{}'),
               r_replayed || coalesce(a.rp, '{}'), r_holder || coalesce(a.h, '{}'),
               r_token || coalesce(a.t, '{}'), r_ttl || coalesce(a.ttl, '{}'),
               e_kind || coalesce(b.kind, '{}'),
               e_resource || coalesce(b.r, '{}'), e_token || coalesce(b.t, '{}'),
               e_holder || coalesce(b.h, '{}'), e_ttl || coalesce(b.ttl, '{}')
        INTO r_ord, r_ok, r_ev, r_replayed, r_holder, r_token, r_ttl,
             e_kind, e_resource, e_token, e_holder, e_ttl
        -- One aggregate pass each, so the arrays are aligned; the events in the order
        -- they are numbered (resource, then EXPIRED before ACQUIRED), the verdicts in
        -- any (each carries its ord).
        FROM (SELECT array_agg(v.o) AS o, array_agg(v.ok) AS ok, array_agg(v.replayed) AS rp,
                     array_agg(v.v_holder) AS h, array_agg(v.v_token) AS t,
                     array_agg(v.v_ttl) AS ttl,
                     array_agg(v.change AND v.k <> 'renew') AS ev
              FROM verdicts AS v) AS a,
             (SELECT array_agg(e.kind) AS kind, array_agg(e.r) AS r,
                     array_agg(e.token) AS t, array_agg(e.holder) AS h, array_agg(e.ttl) AS ttl
              FROM (SELECT * FROM events AS x ORDER BY x.r COLLATE "C", x.n) AS e) AS b;
        v_round := v_round + 1;
    END LOOP;
    -- 4. The step's events, numbered once (or parked if the log row is taken).
    IF cardinality(e_kind) > 0 THEN
        SELECT l.head, l.busy, l.revisions INTO v_head, v_busy, v_revisions
        FROM lease_events_log(e_kind, e_resource, e_token, e_holder, e_ttl) AS l;
        IF v_busy THEN
            -- Minus the seq of the last event parked: "run the sequencer after commit".
            v_head := v_revisions[cardinality(v_revisions)];
        END IF;
    END IF;
    RETURN QUERY
    SELECT x.o, x.ok, x.rp, x.h, x.t, x.ttl, CASE WHEN x.ev THEN v_head ELSE 0::bigint END
    FROM unnest(r_ord, r_ok, r_replayed, r_holder, r_token, r_ttl, r_ev)
         AS x(o, ok, rp, h, t, ttl, ev);
END
$$;

DROP FUNCTION lease_renew_many(text[], bigint[], text[], bigint[]);

CREATE FUNCTION lease_renew_many(
    p_resources text[], p_tokens bigint[], p_holders text[], p_ttl_ms bigint[]
)
RETURNS TABLE (ord bigint, holder text, ttl_ms bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    SELECT s.ord, s.holder, s.ttl_ms, s.revision
    FROM lease_steps(array_fill('renew'::text, ARRAY[cardinality(p_resources)]), p_resources,
                     p_holders, p_tokens, p_ttl_ms,
                     array_fill(''::text, ARRAY[cardinality(p_resources)])) AS s
    WHERE s.ok;
END
$$;

DROP FUNCTION lease_describe(text);

CREATE FUNCTION lease_describe(
    p_resource text,
    OUT held boolean, OUT holder text, OUT token bigint, OUT remaining_ms bigint,
    OUT last_token bigint, OUT ttl_ms bigint
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
    ttl_ms := CASE WHEN held THEN cur.ttl_ms ELSE 0 END;
END
$$;

-- Who ran a finished job stays on it: `fencing queue job ID` shows it.
CREATE OR REPLACE FUNCTION job_complete(
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
        SET state = 'succeeded', finished_at = now(), lease_until = NULL, last_error = ''
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

CREATE OR REPLACE FUNCTION job_reap(p_limit integer) RETURNS integer
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
        SET state = 'dead', finished_at = now(), lease_until = NULL,
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
