-- 0009_watch_cursors: the identity of the PostgreSQL lease backend's event log.
--
-- Creates table lease_event_log_identity (one row: log_id)
--
-- A Watch stream's resume cursor is a revision of one log; the same number in another
-- log (another database or schema, or this one dropped and created again) names other
-- events. log_id is drawn at random once, with the log, and never changes: the lease
-- server sends it to watchers, a guard keys its stored cursor by it, and a cursor that
-- comes back with another log's id is answered with RESYNC (lease_server/backends/base.py,
-- rule 5). A database restored from a dump keeps its id (and its revisions go back:
-- readers ahead of the restored head are told by the gap check, as before).

CREATE TABLE lease_event_log_identity (
    id     integer PRIMARY KEY CHECK (id = 1),
    log_id text NOT NULL
);
INSERT INTO lease_event_log_identity (id, log_id) VALUES (1, replace(gen_random_uuid()::text, '-', ''));
