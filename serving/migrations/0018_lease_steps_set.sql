-- 0018_lease_steps_set: lease calls judged a set at a time, their events numbered once.
--
-- Creates function lease_events_log(kinds, resources, tokens, holders, ttl_ms)
--                    -> (head, seqs, busy, revisions): the one numbering rule. Appends
--                    the given lease events, numbered at once after every committed
--                    pending one when the log row is free (head: the new head; seqs:
--                    the pending ones it numbered), else parked in lease_events_pending
--                    (busy; revisions: minus each given event's seq)
-- and replaces     lease_steps (0017): the same arguments and rows, set-based;
--                  lease_events_sequence (0013), lease_event_append (0017): calls of
--                  lease_events_log;
--                  lease_acquire_logged (0005), lease_renew_logged and
--                  lease_release_logged (0013), lease_renew_many and lease_release_many
--                  (0013): each now one call of lease_steps, same signatures;
--                  lease_channel (0001), lease_events_channel (0005): in plpgsql (a SQL
--                  function with a SET clause is planned afresh at every call).
--
-- Why. Until 0017 lease_steps looped over its steps, calling the single call's plpgsql
-- function for each, and each of those ran its own statements: a lock, an update, an
-- append to lease_events_pending (a row inserted, then deleted again when numbered).
-- PostgreSQL's CPU went to that per-statement machinery (executor start and end per
-- statement, CHECK constraints parsed afresh for every statement that writes, the
-- pending table's dead rows scanned), about 115 us of its CPU a call on this project's
-- 2-core machine, on top of about 600 us a step. Now a step runs a fixed number of
-- statements whatever the number of calls (measured: 725 us for one call, 1,075 us for
-- eight, against 825 and 1,700 us before), and every rule of a lease call lives here
-- once: the single calls (lease_acquire_logged, lease_renew_logged,
-- lease_release_logged) and the many-at-once calls are lease_steps of their calls.
-- Its statements keep generic plans (plan_cache_mode): their custom plans cost more to
-- make, every call, than they save.
--
-- lease_steps(kinds, resources, holders, tokens, ttl_ms, request_ids), unchanged from
-- 0017 for its callers: one row per step (ord, ok, replayed, holder, token, ttl_ms,
-- revision), each step judged as its single call would be at its place:
--   acquire: granted when the resource is free or its lease expired (counter + 1; the
--            token floor of 0010 applies through its trigger), or replayed when the live
--            lease has the same non-empty request_id and holder; else held (holder,
--            token, remaining ms of the live lease)
--   renew:   the current unexpired token (and holder, unless ''): expiry moved
--   release: the same test: the lease freed, the counter kept
--   revision: for a call that appended events, > 0 the head they were numbered
--             through, or < 0 when they were left pending (minus the seq of the last
--             event the step parked: run lease_events_sequence); 0 for one that
--             appended none
--   events: a takeover of an expired lease appends its EXPIRED, then the ACQUIRED; a
--           release its RELEASED; a renewal nothing.
--
-- How, in order, with all statements of the step in its one transaction:
-- 1. Lock every row the step names, in COLLATE "C" order: the lock order of 0017 and
--    0007, so two steps, a step and AcquireMany, or a step and single calls wait for
--    each other instead of deadlocking. When every resource to acquire has its row
--    (rows are never deleted, so it still has it when locked), one SELECT ... ORDER BY
--    ... FOR UPDATE. Otherwise (a resource acquired for the first time) one INSERT ...
--    ON CONFLICT DO UPDATE ... WHERE false over the distinct resources in that order:
--    it locks each existing row (a refused DO UPDATE still locks) and inserts a free
--    row (counter 0) for a new one, one resource after the other, so the new rows are
--    taken in the same order as the others. A resource only renewed or released is
--    locked only if its row exists (one that does not cannot hold the token presented).
-- 2. Clock: clock_timestamp() read once, every lock held (G7): every decision of the
--    step is taken at that instant.
-- 3. Rounds: steps of distinct resources are judged by one statement that reads the
--    locked rows, decides, updates and returns the verdicts and events. A resource
--    named several times has its k-th step in round k, which sees the rounds before
--    it (a release and then another caller's acquire of one resource grants it).
-- 4. Events: numbered once, by lease_events_log: the log row is tried with FOR UPDATE
--    SKIP LOCKED after every lease row (never waiting for it). Free: in a snapshot
--    taken after that lock, every pending event it can see is numbered first (they
--    committed before this transaction could see them), then this step's events in
--    the order appended, head raised, NOTIFYs sent, all in this transaction, which
--    holds the row to commit (0013's rule: numbers become visible in turn). Taken:
--    the step's events go to lease_events_pending, to be numbered by the next run,
--    and the step commits without waiting. A step's events no longer pass through the
--    pending table when the row is free. Changes of one resource keep their order: a
--    later change waited for this one's row lock, so it numbers or parks its events
--    after this commit.
CREATE OR REPLACE FUNCTION lease_events_log(
    p_kinds text[], p_resources text[], p_tokens bigint[], p_holders text[],
    p_ttl_ms bigint[],
    OUT head bigint, OUT seqs bigint[], OUT busy boolean, OUT revisions bigint[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_given integer := coalesce(cardinality(p_kinds), 0);
    v_numbered integer;
    v_released text[];
BEGIN
    seqs := '{}';
    revisions := '{}';
    busy := false;
    IF v_given = 0 THEN
        IF NOT EXISTS (SELECT 1 FROM lease_events_pending) THEN
            -- Nothing to number (or only what is not committed yet): no lock, no commit.
            SELECT g.head INTO head FROM lease_event_log AS g WHERE g.id = 1;
            RETURN;
        END IF;
    END IF;
    -- Numberers take turns here and never wait for each other. The next statement has
    -- a snapshot taken after the lock: it sees what the holder before this one moved,
    -- and the pending rows it sees are committed, or this transaction's own.
    SELECT g.head INTO v_head FROM lease_event_log AS g WHERE g.id = 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        busy := true;
        IF v_given > 0 THEN
            WITH parked AS (
                INSERT INTO lease_events_pending (kind, resource, token, holder, ttl_ms)
                SELECT u.kind, u.resource, u.token, u.holder, u.ttl_ms
                FROM unnest(p_kinds, p_resources, p_tokens, p_holders, p_ttl_ms)
                     WITH ORDINALITY AS u(kind, resource, token, holder, ttl_ms, n)
                ORDER BY u.n
                RETURNING seq
            )
            SELECT array_agg(-p.seq ORDER BY p.seq) INTO revisions FROM parked AS p;
        END IF;
        SELECT g.head INTO head FROM lease_event_log AS g WHERE g.id = 1;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM lease_events_pending) THEN
        -- Committed pending events (another server's, a job claim's) go first: they
        -- committed before this transaction could see them.
        WITH moved AS (
            DELETE FROM lease_events_pending RETURNING *
        ), appended AS (
            SELECT 0 AS src, m.seq AS pos, m.kind, m.resource, m.token, m.holder, m.ttl_ms,
                   m.job_id, m.queue
            FROM moved AS m
            UNION ALL
            SELECT 1, u.n, u.kind, u.resource, u.token, u.holder, u.ttl_ms, 0, ''
            FROM unnest(p_kinds, p_resources, p_tokens, p_holders, p_ttl_ms)
                 WITH ORDINALITY AS u(kind, resource, token, holder, ttl_ms, n)
        ), numbered AS (
            INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms,
                                      job_id, queue)
            SELECT v_head + row_number() OVER (ORDER BY a.src, a.pos), a.kind, a.resource,
                   a.token, a.holder, a.ttl_ms, a.job_id, a.queue
            FROM appended AS a
            RETURNING revision, kind, resource, job_id
        )
        SELECT coalesce((SELECT array_agg(m.seq ORDER BY m.seq) FROM moved AS m), '{}'),
               (SELECT count(*) FROM numbered),
               (SELECT array_agg(DISTINCT n.resource) FROM numbered AS n
                WHERE n.job_id = 0 AND n.kind IN ('released', 'expired'))
        INTO seqs, v_numbered, v_released;
    ELSE
        -- Nothing pending (one server alone, mostly): only the given events.
        INSERT INTO lease_events (revision, kind, resource, token, holder, ttl_ms)
        SELECT v_head + u.n, u.kind, u.resource, u.token, u.holder, u.ttl_ms
        FROM unnest(p_kinds, p_resources, p_tokens, p_holders, p_ttl_ms)
             WITH ORDINALITY AS u(kind, resource, token, holder, ttl_ms, n);
        v_numbered := v_given;
        IF p_kinds && ARRAY['released', 'expired'] THEN
            PERFORM pg_notify(c.channel, u.r)
            FROM (SELECT lease_channel() AS channel) AS c,
                 (SELECT DISTINCT u.r FROM unnest(p_kinds, p_resources) AS u(k, r)
                  WHERE u.k IN ('released', 'expired')) AS u;
        END IF;
    END IF;
    head := v_head + v_numbered;
    IF v_numbered > 0 THEN
        UPDATE lease_event_log AS g SET head = v_head + v_numbered WHERE g.id = 1;
        -- Delivered only if this transaction commits, i.e. once the numbers are visible.
        IF cardinality(v_released) > 0 THEN  -- (without pending events: notified above)
            PERFORM pg_notify(c.channel, u.r)
            FROM (SELECT lease_channel() AS channel) AS c, unnest(v_released) AS u(r);
        END IF;
        PERFORM pg_notify(lease_events_channel(), head::text);
    END IF;
END
$$;

-- 0013's sequencer run: what is pending, nothing of its own.
CREATE OR REPLACE FUNCTION lease_events_sequence(OUT head bigint, OUT seqs bigint[],
                                                 OUT busy boolean)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT l.head, l.seqs, l.busy FROM lease_events_log('{}', '{}', '{}', '{}', '{}') AS l
$$;

-- One event (the sweeper's EXPIRED): the head numbered through, or minus its seq.
CREATE OR REPLACE FUNCTION lease_event_append(
    p_kind text, p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint
) RETURNS bigint
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT CASE WHEN l.busy THEN l.revisions[1] ELSE l.head END
    FROM lease_events_log(ARRAY[p_kind], ARRAY[p_resource], ARRAY[p_token],
                          ARRAY[p_holder], ARRAY[p_ttl_ms]) AS l
$$;

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
                   l.request_id AS l_request_id,
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
                       AND c.l_holder = c.h AS again
            FROM cur AS c
        ), changed AS (
            UPDATE leases AS l
            SET counter = CASE WHEN j.k = 'acquire' THEN l.counter + 1 ELSE l.counter END,
                token = CASE j.k WHEN 'acquire' THEN l.counter + 1
                                 WHEN 'renew' THEN l.token ELSE 0 END,
                holder = CASE j.k WHEN 'acquire' THEN j.h
                                  WHEN 'renew' THEN l.holder ELSE '' END,
                expires_at = CASE WHEN j.k = 'release' THEN NULL
                                  ELSE v_now + j.ttl * interval '1 millisecond' END,
                request_id = CASE j.k WHEN 'acquire' THEN j.rid
                                      WHEN 'renew' THEN l.request_id ELSE '' END
            FROM judged AS j
            WHERE l.resource = j.r AND j.change
            RETURNING l.resource, l.token
        ), verdicts AS (
            SELECT j.o, j.r, j.k, j.change, j.l_token, j.l_holder, j.h, j.ttl, j.t,
                   j.change OR j.again AS ok,
                   j.again AS replayed,
                   CASE WHEN j.k = 'acquire' THEN
                            CASE WHEN j.change THEN j.h ELSE j.l_holder END
                        WHEN j.k = 'renew' THEN CASE WHEN j.change THEN j.l_holder ELSE '' END
                        ELSE j.h END AS v_holder,
                   CASE WHEN j.k = 'acquire' AND j.change THEN c.token
                        WHEN j.k = 'acquire' THEN j.l_token
                        ELSE j.t END AS v_token,
                   CASE WHEN j.k = 'acquire' AND NOT j.change THEN
                            ceil(extract(epoch FROM j.l_expires - v_now) * 1000)::bigint
                        WHEN j.k = 'release' THEN 0::bigint
                        ELSE j.ttl END AS v_ttl
            FROM judged AS j LEFT JOIN changed AS c ON c.resource = j.r
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

-- The single calls and the many-at-once calls: lease_steps of their calls. In plpgsql,
-- as the channels below: a SQL function with a SET clause is planned at every call.
CREATE OR REPLACE FUNCTION lease_acquire_logged(
    p_resource text, p_holder text, p_ttl_ms bigint, p_request_id text,
    OUT granted boolean, OUT replayed boolean, OUT holder text, OUT token bigint,
    OUT ttl_ms bigint, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    SELECT s.ok, s.replayed, s.holder, s.token, s.ttl_ms, s.revision
    INTO granted, replayed, holder, token, ttl_ms, revision
    FROM lease_steps(ARRAY['acquire'], ARRAY[p_resource], ARRAY[p_holder], ARRAY[0::bigint],
                     ARRAY[p_ttl_ms], ARRAY[p_request_id]) AS s;
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_logged(
    p_resource text, p_token bigint, p_holder text, p_ttl_ms bigint,
    OUT holder text, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    SELECT CASE WHEN s.ok THEN s.holder END, s.revision INTO holder, revision
    FROM lease_steps(ARRAY['renew'], ARRAY[p_resource], ARRAY[p_holder], ARRAY[p_token],
                     ARRAY[p_ttl_ms], ARRAY['']) AS s;
END
$$;

CREATE OR REPLACE FUNCTION lease_release_logged(
    p_resource text, p_token bigint, p_holder text,
    OUT released boolean, OUT revision bigint
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    SELECT s.ok, s.revision INTO released, revision
    FROM lease_steps(ARRAY['release'], ARRAY[p_resource], ARRAY[p_holder], ARRAY[p_token],
                     ARRAY[0::bigint], ARRAY['']) AS s;
END
$$;

CREATE OR REPLACE FUNCTION lease_renew_many(
    p_resources text[], p_tokens bigint[], p_holders text[], p_ttl_ms bigint[]
)
RETURNS TABLE (ord bigint, holder text, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    SELECT s.ord, s.holder, s.revision
    FROM lease_steps(array_fill('renew'::text, ARRAY[cardinality(p_resources)]), p_resources,
                     p_holders, p_tokens, p_ttl_ms,
                     array_fill(''::text, ARRAY[cardinality(p_resources)])) AS s
    WHERE s.ok;
END
$$;

CREATE OR REPLACE FUNCTION lease_release_many(
    p_resources text[], p_tokens bigint[], p_holders text[]
)
RETURNS TABLE (ord bigint, revision bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    SELECT s.ord, s.revision
    FROM lease_steps(array_fill('release'::text, ARRAY[cardinality(p_resources)]),
                     p_resources, p_holders, p_tokens,
                     array_fill(0::bigint, ARRAY[cardinality(p_resources)]),
                     array_fill(''::text, ARRAY[cardinality(p_resources)])) AS s
    WHERE s.ok;
END
$$;

-- The channels, in plpgsql too: the numbering above calls them in every step that
-- notifies.
CREATE OR REPLACE FUNCTION lease_channel() RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN 'fencing_released:' || current_schema();
END
$$;

CREATE OR REPLACE FUNCTION lease_events_channel() RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN 'fencing_events:' || current_schema();
END
$$;
