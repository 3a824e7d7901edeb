-- 0014_job_complete_batch: several Completes in one transaction, one verdict each.
--
-- Creates function job_complete_batch(ids, tokens, groups, queues)
--                    -> setof (group_no, stale_id, stale_token, stale_resource, woken)
--
-- The queue service packs the Completes that arrive together (from several workers, and
-- the completes a Claim carries) into one call of this function: one round trip and one
-- commit for all of them. A group is one Complete (ids[k] with tokens[k] belongs to group
-- groups[k], 1-based; queues[g] is the queue group g names): it is judged as job_complete
-- (0003) judges it, alone and all or none, so a stale group changes nothing and refuses
-- only itself. Every named row is locked first, in id order, so two batches never
-- deadlock; groups are then applied in order (a job named by two groups completes once,
-- the second is a replay). Returns one row per refused group (its first stale job) and a
-- last row with group_no 0 carrying the queues where an ordering key's next job became
-- ready.

CREATE FUNCTION job_complete_batch(
    p_ids bigint[], p_tokens bigint[], p_groups integer[], p_queues text[]
)
RETURNS TABLE (
    group_no integer, stale_id bigint, stale_token bigint, stale_resource text, woken text[]
)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_woken text[] := '{}';
    v_ids bigint[];
    v_tokens bigint[];
    r record;
BEGIN
    PERFORM job_lock_rows(p_ids);
    FOR g IN 1 .. coalesce(array_length(p_queues, 1), 0) LOOP
        SELECT coalesce(array_agg(x.id ORDER BY x.n), '{}'),
               coalesce(array_agg(x.token ORDER BY x.n), '{}')
        INTO v_ids, v_tokens
        FROM unnest(p_ids, p_tokens, p_groups) WITH ORDINALITY AS x (id, token, grp, n)
        WHERE x.grp = g;
        SELECT * INTO r FROM job_complete(v_ids, v_tokens, p_queues[g]);
        IF r.stale_id IS NOT NULL THEN
            group_no := g;
            stale_id := r.stale_id;
            stale_token := r.stale_token;
            stale_resource := r.stale_resource;
            woken := NULL;
            RETURN NEXT;
        ELSE
            v_woken := v_woken || r.woken;
        END IF;
    END LOOP;
    group_no := 0;
    stale_id := NULL;
    stale_token := NULL;
    stale_resource := NULL;
    woken := v_woken;
    RETURN NEXT;
END
$$;
