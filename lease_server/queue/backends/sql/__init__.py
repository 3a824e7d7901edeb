"""SQL of the queue backends as named assets: one ``.sql`` file per backend.

A file is a sequence of blocks, each starting with a ``-- name: <name>`` line and a
header comment saying what the statement takes and returns (procrastinate's
``queries.sql`` shape)::

    -- name: claim_ready
    -- Ready, due jobs of a queue in claim order. Takes queue, now_ms, limit.
    SELECT ...

:func:`load` returns ``{name: statement}`` with the comments kept (SQLite and
PostgreSQL ignore them), so a statement seen in a log or ``pg_stat_statements``
still says what it is. :func:`job_record` reads a job row as both SQL backends
select it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from lease_server.queue.jobs import AttemptOutcome, JobAttempt, JobRecord, JobState
from lease_server.queue.schedules import Schedule, ScheduleRecord

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def load(file: str) -> dict[str, str]:
    """The named statements of ``lease_server/queue/backends/sql/<file>``."""
    text = resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"{file}: query {name} is defined twice")
        queries[name] = body.strip()
    return queries


def job_record(row: Sequence[Any]) -> JobRecord:
    """A job row as SQLite's ``select_job`` and PostgreSQL's ``job_rows`` view give it:
    the columns of :class:`~lease_server.queue.jobs.JobRecord`, in order, times in ms
    (``claimed_at_ms`` last: added by a later schema, so appended)."""
    return JobRecord(
        id=int(row[0]),
        queue=row[1],
        payload=bytes(row[2]),
        state=JobState(row[3]),
        resource=row[4],
        ordering_key=row[5],
        idempotency_key=row[6] or "",
        priority=int(row[7]),
        attempts=int(row[8]),
        max_attempts=int(row[9]),
        token=int(row[10]),
        available_at_ms=int(row[11]),
        lease_owner=row[12],
        lease_until_ms=int(row[13]),
        last_error=row[14],
        created_at_ms=int(row[15]),
        finished_at_ms=int(row[16]),
        claimed_at_ms=int(row[17]),
    )


def attempt_record(row: Sequence[Any]) -> JobAttempt:
    """An attempt row as both SQL backends select it: attempt, started_at_ms, worker,
    token, outcome, ended_at_ms, error (times in ms)."""
    return JobAttempt(
        attempt=int(row[0]),
        started_at_ms=int(row[1]),
        worker=row[2],
        token=int(row[3]),
        outcome=AttemptOutcome(row[4]),
        ended_at_ms=int(row[5]),
        error=row[6],
    )


def schedule_record(row: Sequence[Any]) -> ScheduleRecord:
    """A schedule row as both SQL backends select it: name, queue, cron, every_ms,
    timezone, payload, priority, max_attempts, resource, catch_up, created_at_ms,
    last_period_ms, last_job_id."""
    return ScheduleRecord(
        Schedule(
            name=row[0],
            queue=row[1],
            cron=row[2],
            every_ms=int(row[3]),
            timezone=row[4],
            payload=bytes(row[5]),
            priority=int(row[6]),
            max_attempts=int(row[7]),
            resource=row[8],
            catch_up=int(row[9]),
        ),
        created_at_ms=int(row[10]),
        last_period_ms=int(row[11]),
        last_job_id=int(row[12]),
    )


def schedule_params(s: Schedule) -> tuple[Any, ...]:
    """A schedule's columns from name to catch_up, as the put statements take them."""
    return (
        s.name,
        s.queue,
        s.cron,
        s.every_ms,
        s.timezone,
        s.payload,
        s.priority,
        s.max_attempts,
        s.resource,
        s.catch_up,
    )
