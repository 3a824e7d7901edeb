-- 0004_outbox: the transactional outbox, on the queue's jobs (queue 'outbox').
--
-- Creates view     outbox (event_id, aggregate_key, payload, max_attempts, id, state,
--                          attempts, last_error, created_at, published_at)   [public]
-- with trigger     outbox_insert: INSERT INTO outbox enqueues an event        [public]
-- and function     outbox_emit(aggregate_key, payload, event_id) -> job id    [public]
--
-- Write events in the same transaction as the change they announce; they become
-- visible to the publisher (`fencing outbox run`) only if that transaction commits:
--
--     BEGIN;
--     UPDATE orders SET status = 'paid' WHERE id = 42;
--     INSERT INTO fencing.outbox (aggregate_key, event_id, payload)
--     VALUES ('order-42', 'order-42-paid', '{"order": 42, "status": "paid"}');
--     COMMIT;
--
-- Each event is one job of queue 'outbox' (job_enqueue of 0003_queue):
--   event_id      -> idempotency_key: inserting the same event twice adds it once, and
--                    the publisher delivers with idempotency_key = event_id, so a
--                    redelivery (at least once) is applied once by an idempotent sink.
--                    NULL: a random UUID.
--   aggregate_key -> ordering_key: events of one aggregate are published one at a
--                    time, in insert (commit) order; '' or NULL: no order.
--                 -> resource 'outbox/<aggregate_key>': every claim's token fences the
--                    sink for that aggregate, so a paused publisher cannot deliver an
--                    event late, after a newer one of its aggregate was delivered.
--   max_attempts  -> 25 by default (about 1.5 h of retries with the default backoff).
-- An event that exhausts its attempts is 'dead' and no longer holds up its aggregate.

CREATE VIEW outbox AS
SELECT j.idempotency_key AS event_id,
       j.ordering_key AS aggregate_key,
       j.payload,
       j.max_attempts,
       j.id,
       j.state,
       j.attempts,
       j.last_error,
       j.created_at,
       CASE WHEN j.state = 'succeeded' THEN j.finished_at END AS published_at
FROM jobs AS j
WHERE j.queue = 'outbox';

CREATE FUNCTION outbox_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_key text := coalesce(NEW.aggregate_key, '');
    v_event text := coalesce(nullif(NEW.event_id, ''), gen_random_uuid()::text);
    v_job record;
BEGIN
    IF NEW.payload IS NULL THEN
        RAISE EXCEPTION 'outbox: payload must not be NULL' USING ERRCODE = 'not_null_violation';
    END IF;
    SELECT * INTO v_job FROM job_enqueue(
        'outbox', NEW.payload, v_event, v_key, 0, coalesce(NEW.max_attempts, 25), 0, NULL,
        CASE WHEN v_key <> '' THEN 'outbox/' || v_key ELSE '' END);
    NEW.event_id := v_event;
    NEW.aggregate_key := v_key;
    NEW.max_attempts := coalesce(NEW.max_attempts, 25);
    NEW.id := v_job.id;
    NEW.state := v_job.state;
    NEW.attempts := 0;
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON outbox
FOR EACH ROW EXECUTE FUNCTION outbox_insert();

-- The same as an INSERT INTO outbox, as a function: returns the event's job id.
CREATE FUNCTION outbox_emit(p_aggregate_key text, p_payload bytea, p_event_id text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO outbox (aggregate_key, payload, event_id)
    VALUES (p_aggregate_key, p_payload, p_event_id)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
