-- 0024_queue_pause: an operator can pause a queue (PauseQueue/ResumeQueue).
--
-- Adds table       queue_pauses (one row per paused queue; resume deletes it). A paused
--                  queue accepts enqueues and lets running jobs heartbeat, complete and
--                  fail; the backend (lease_server/queue/backends/postgres.py) hands out
--                  no claims of it. Kept in the shared database so every lease server on
--                  it honours the pause on its next claim.
CREATE TABLE IF NOT EXISTS queue_pauses (
    queue     TEXT PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION queue_notify_resumed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify(jobs_channel(), OLD.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER queue_resumed AFTER DELETE ON queue_pauses
FOR EACH ROW EXECUTE FUNCTION queue_notify_resumed();
