-- 0023_enqueue_in_transaction: enqueue from your own transaction, checked, waking claimers on commit
--
-- Adds      jobs_channel() -> the NOTIFY channel that carries queues with new ready jobs
--           jobs_notify_enqueued()  [trigger: one NOTIFY per queue per statement]
--           job_check(field, queue, payload, idempotency_key, ordering_key, priority,
--                     max_attempts, delay_ms, run_at, resource)  [raises 22023]
--           enqueue(queue, payloads, idempotency_keys, ordering_keys, priorities,
--                   max_attempts, delays_ms, run_ats, resources)
--               -> setof (id, created, state): job_enqueue_many behind the Enqueue RPC's
--               checks, for any language's own transaction.
--
-- A NOTIFY is part of its transaction: PostgreSQL delivers it at commit and drops it on
-- rollback, so a lease server listening on jobs_channel() wakes its waiting claims when
-- the jobs can be seen, never before, never for a rollback. The trigger covers every
-- way in (the Enqueue RPC, this function, the outbox view, a plain INSERT).
--
-- job_check holds a job to the limits fencing/limits.py holds the Enqueue RPC to (the
-- tests run one table of cases through both): a violation raises SQLSTATE 22023
-- (invalid_parameter_value) whose message starts with the field and whose DETAIL is
-- {"field": "jobs[i].<name>"}, and, raised inside the caller's transaction, it leaves
-- nothing inserted.

CREATE FUNCTION jobs_channel() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT 'fencing_jobs:' || current_schema()
$$;

CREATE FUNCTION jobs_notify_enqueued() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify(jobs_channel(), q.queue)
    FROM (SELECT DISTINCT n.queue FROM enqueued AS n WHERE n.state = 'ready') AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_enqueued AFTER INSERT ON jobs
REFERENCING NEW TABLE AS enqueued
FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_enqueued();

CREATE FUNCTION job_check_name(
    p_field text, p_value text, p_max_bytes integer, p_required boolean
) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_size integer := octet_length(convert_to(coalesce(p_value, ''), 'UTF8'));
BEGIN
    IF p_required AND v_size = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = p_field || ' must not be empty',
            DETAIL = json_build_object('field', p_field)::text;
    END IF;
    IF v_size > p_max_bytes THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s is %s bytes; the limit is %s bytes of UTF-8',
                             p_field, v_size, p_max_bytes),
            DETAIL = json_build_object('field', p_field)::text;
    END IF;
    IF coalesce(p_value, '') ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = p_field || ' must not contain control characters',
            DETAIL = json_build_object('field', p_field)::text;
    END IF;
END
$$;

CREATE FUNCTION job_check_range(
    p_field text, p_value bigint, p_low bigint, p_high bigint
) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_value IS NULL OR p_value < p_low OR p_value > p_high THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s is %s; it must be between %s and %s',
                             p_field, coalesce(p_value::text, 'null'), p_low, p_high),
            DETAIL = json_build_object('field', p_field)::text;
    END IF;
END
$$;

-- One job against the Enqueue RPC's limits (fencing/limits.py); p_field is its name in
-- the request (jobs[3]).
CREATE FUNCTION job_check(
    p_field text, p_payload bytea, p_idempotency_key text, p_ordering_key text,
    p_priority integer, p_max_attempts integer, p_delay_ms bigint, p_run_at timestamptz,
    p_resource text
) RETURNS void
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_payload IS NULL OR octet_length(p_payload) > 1048576 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s.payload is %s bytes; the limit is 1048576 bytes',
                             p_field, coalesce(octet_length(p_payload)::text, 'null')),
            DETAIL = json_build_object('field', p_field || '.payload')::text;
    END IF;
    PERFORM job_check_name(p_field || '.idempotency_key', p_idempotency_key, 256, false);
    IF coalesce(p_idempotency_key, '') LIKE 'periodic:%' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = p_field || '.idempotency_key: keys starting with ''periodic:'' are '
                      'the periodic jobs'' (one per schedule and period)',
            DETAIL = json_build_object('field', p_field || '.idempotency_key')::text;
    END IF;
    PERFORM job_check_name(p_field || '.ordering_key', p_ordering_key, 256, false);
    PERFORM job_check_name(p_field || '.resource', p_resource, 256, false);
    PERFORM job_check_range(p_field || '.priority', coalesce(p_priority, 0), -1000, 1000);
    PERFORM job_check_range(p_field || '.max_attempts', coalesce(p_max_attempts, 0), 0, 1000);
    PERFORM job_check_range(p_field || '.delay_ms', coalesce(p_delay_ms, 0), 0, 31536000000);
    IF p_run_at IS NOT NULL AND (p_run_at < 'epoch'::timestamptz
                                 OR p_run_at > now() + interval '365 days') THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = p_field || '.run_at_ms must be a Unix time in ms at most 365 days ahead',
            DETAIL = json_build_object('field', p_field || '.run_at_ms')::text;
    END IF;
END
$$;

CREATE FUNCTION enqueue(
    p_queue text, p_payloads bytea[], p_idempotency_keys text[] DEFAULT NULL,
    p_ordering_keys text[] DEFAULT NULL, p_priorities integer[] DEFAULT NULL,
    p_max_attempts integer[] DEFAULT NULL, p_delays_ms bigint[] DEFAULT NULL,
    p_run_ats timestamptz[] DEFAULT NULL, p_resources text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, created boolean, state text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_n integer := coalesce(array_length(p_payloads, 1), 0);
    v_keys text[] := coalesce(p_idempotency_keys, array_fill(''::text, ARRAY[v_n]));
    v_orders text[] := coalesce(p_ordering_keys, array_fill(''::text, ARRAY[v_n]));
    v_priorities integer[] := coalesce(p_priorities, array_fill(0, ARRAY[v_n]));
    v_attempts integer[] := coalesce(p_max_attempts, array_fill(0, ARRAY[v_n]));
    v_delays bigint[] := coalesce(p_delays_ms, array_fill(0::bigint, ARRAY[v_n]));
    v_run_ats timestamptz[] := coalesce(p_run_ats, array_fill(NULL::timestamptz, ARRAY[v_n]));
    v_resources text[] := coalesce(p_resources, array_fill(''::text, ARRAY[v_n]));
BEGIN
    PERFORM job_check_name('queue', p_queue, 128, true);
    PERFORM job_check_range('jobs', v_n, 1, 1000);
    FOR i IN 1 .. v_n LOOP
        PERFORM job_check(format('jobs[%s]', i - 1), p_payloads[i], v_keys[i], v_orders[i],
                          v_priorities[i], v_attempts[i], v_delays[i], v_run_ats[i],
                          v_resources[i]);
        IF v_attempts[i] = 0 THEN
            v_attempts[i] := 5;
        END IF;
    END LOOP;
    RETURN QUERY SELECT * FROM job_enqueue_many(
        p_queue, p_payloads, v_keys, v_orders, v_priorities, v_attempts, v_delays,
        v_run_ats, v_resources);
END
$$;
