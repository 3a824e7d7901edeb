-- 0010_token_floor: the clock floor under every token, for sessions that ask for it.
--
-- Creates functions token_floor_us() -> bigint: the database's clock in microseconds
--                   lease_token_floor(), job_token_floor(): BEFORE triggers
--         triggers  leases_token_floor_insert, leases_token_floor_update on leases
--                   jobs_token_floor on jobs
--
-- A grant takes counter + 1 (leases, 0001/0005/0007) or nextval(job_tokens) (job
-- claims, 0003). A database that loses acknowledged writes (a failover to an
-- asynchronously replicated standby that had not received them, a restore from an
-- earlier backup) has an older counter row or sequence, and hands out a token again.
-- In a session with fencing.token_floor = 'clock' (the lease server sets it from its
-- URL, ?token_floor=clock) every grant instead takes
--
--     max(counter + 1, clock_timestamp() in microseconds)          (leases)
--     max(nextval(job_tokens), clock_us, the job's last token + 1)  (job claims)
--
-- as the Redis backend does. Earlier tokens were at most the clock reading of their own
-- grant (or far below it: a counter starts at 1, the clock near 1.8e15), so a token
-- granted after the loss is larger than every token granted before it, provided the
-- clock of the database serving the grant (after a failover, the new primary's) has not
-- stepped back by more than the time between the last grant before the loss and the
-- first after it. NTP slewing is harmless; a clock step back, or a standby whose clock
-- is behind by more than that, is not, and nothing detects it. Only tokens are
-- protected: fences kept in the lost writes are lost with them.
--
-- Triggers, not new function bodies, so every path that grants (acquire, the logged
-- acquire, acquire_many, job claims and rescues, and any SQL of yours that raises a
-- counter the same way) takes the floor, and RETURNING and the event log (written
-- after the row) see the floored token. A grant is an update that raises the counter
-- and sets the token to it (or an insert with a token); a release, a renewal, or an
-- operator's `UPDATE leases SET counter = counter + N` is not one and is left alone.
-- The WHEN clause reads the setting, so sessions without it pay nothing but that test.
-- Counters raised by the floor stay raised, so a session without it still grants
-- counter + 1, larger; a job's sequence is not raised, so its trigger also makes a
-- claim in such a session pass the job's last token.

CREATE FUNCTION token_floor_us() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

CREATE FUNCTION lease_token_floor() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.counter := greatest(NEW.counter, token_floor_us());
    NEW.token := NEW.counter;
    RETURN NEW;
END
$$;

CREATE TRIGGER leases_token_floor_insert
BEFORE INSERT ON leases
FOR EACH ROW
WHEN (NEW.token > 0 AND NEW.token = NEW.counter
      AND current_setting('fencing.token_floor', true) = 'clock')
EXECUTE FUNCTION lease_token_floor();

CREATE TRIGGER leases_token_floor_update
BEFORE UPDATE OF counter ON leases
FOR EACH ROW
WHEN (NEW.counter > OLD.counter AND NEW.token = NEW.counter
      AND current_setting('fencing.token_floor', true) = 'clock')
EXECUTE FUNCTION lease_token_floor();

CREATE FUNCTION job_token_floor() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('fencing.token_floor', true) = 'clock' THEN
        NEW.token := greatest(NEW.token, token_floor_us(), OLD.token + 1);
    ELSE
        -- A session without the floor, after claims that took it: the sequence is
        -- behind the job's last token, which the next claim must still pass.
        NEW.token := OLD.token + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_token_floor
BEFORE UPDATE OF token ON jobs
FOR EACH ROW
WHEN (NEW.token <> OLD.token AND NEW.token <> 0
      AND (NEW.token <= OLD.token OR current_setting('fencing.token_floor', true) = 'clock'))
EXECUTE FUNCTION job_token_floor();
