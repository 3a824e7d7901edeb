-- 0012_queue_stats_age: the oldest due job's age is 0 when no job is due.
--
-- Replaces job_stats (0003): the same columns. oldest_ready_age_ms subtracted
-- job_ms(min(...)), and job_ms turns the NULL of "no due job" into 0, so a queue with
-- rows but nothing due (all finished, or all scheduled later) reported the current
-- Unix time in milliseconds as its age. The interval is now taken before any coalesce:
-- no due job is NULL, which becomes 0.

CREATE OR REPLACE FUNCTION job_stats(p_queue text, p_window_ms bigint)
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
           coalesce(floor(extract(epoch FROM now() - min(j.available_at)
               FILTER (WHERE j.state = 'ready' AND j.available_at <= now())) * 1000)::bigint,
               0),
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
