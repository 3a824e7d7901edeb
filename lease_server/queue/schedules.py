"""Periodic jobs, the pure rules: what a schedule is, which of its periods are due, and
the one job each period gets.

A **schedule** names a queue, a job template (payload, priority, max_attempts,
resource) and either a cron expression (5 fields, evaluated in ``timezone``, UTC
unless given, with ``cronsim``) or a fixed interval ``every_ms`` (periods aligned to
the Unix epoch, so every server computes the same period starts). A **period** is
named by its start, in Unix ms.

**One job per period**: the job of period *p* of schedule *s* carries the idempotency
key :func:`period_key` ``periodic:<s>:<p>``; a queue backend adds at most one job per
(queue, idempotency key) in the enqueue's own transaction (a unique index on
PostgreSQL and SQLite), so any number of schedulers racing on the same period add one
job between them, whichever commits first. The schedule's ``last_period_ms`` (the
latest period enqueued) is bookkeeping kept in the same transaction: it tells a
scheduler where to resume and stops it from enqueuing older periods again once their
jobs (and keys) were pruned.

**Missed periods** (every scheduler was down, or the backend was): by default only the
latest due period is enqueued (no burst after downtime, as Oban's and River's
schedulers skip what they missed); ``catch_up = N`` enqueues each missed period, the
latest N (as procrastinate's periodic deferrer catches up, bounded). A new schedule
starts with the first period after it was created.

Nothing here reads a clock: times come from the backend (``list_schedules``).
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass, replace
from datetime import UTC, datetime, tzinfo
from functools import lru_cache

from cronsim import CronSim, CronSimError

from fencing import limits
from fencing.errors import InvalidArgumentError
from lease_server.queue.jobs import NewJob

#: The prefix of the idempotency keys of periodic jobs; Enqueue refuses it from users.
KEY_PREFIX = limits.PERIODIC_KEY_PREFIX
#: The number of fields a cron expression has (minute hour day-of-month month day-of-week).
CRON_FIELDS = 5


@dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic job as registered: exactly one of ``cron`` and ``every_ms``."""

    name: str
    queue: str
    cron: str = ""
    every_ms: int = 0
    timezone: str = ""
    payload: bytes = b""
    priority: int = 0
    max_attempts: int = limits.DEFAULT_MAX_ATTEMPTS
    resource: str = ""
    catch_up: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A schedule as stored: when it was created and the latest period it enqueued
    (0: none yet) with that period's job id, on the backend's clock (Unix ms)."""

    schedule: Schedule
    created_at_ms: int
    last_period_ms: int = 0
    last_job_id: int = 0

    @property
    def name(self) -> str:
        return self.schedule.name

    @property
    def after_ms(self) -> int:
        """Periods starting after this are not enqueued yet."""
        return max(self.last_period_ms, self.created_at_ms)


@lru_cache(maxsize=256)
def _zone(name: str) -> tzinfo:
    return UTC if name in ("", "UTC") else zoneinfo.ZoneInfo(name)


def validate(s: Schedule) -> Schedule:
    """``s`` checked against :mod:`fencing.limits` (the error names the field), with the
    cron expression parsed and the time zone found; the default max_attempts filled in."""
    limits.check_schedule_name(s.name)
    limits.check_queue(s.queue)
    limits.check_payload(s.payload)
    limits.check_priority(s.priority)
    max_attempts = limits.check_max_attempts(s.max_attempts)
    limits.check_job_resource(s.resource)
    limits.check_catch_up(s.catch_up)
    limits.check_name("timezone", s.timezone, limits.MAX_TIMEZONE_BYTES, required=False)
    try:
        zone = _zone(s.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgumentError(
            f"timezone {s.timezone!r} is not a known IANA time zone", field="timezone"
        ) from None
    if bool(s.cron) == bool(s.every_ms):
        raise InvalidArgumentError("give exactly one of cron and every_ms", field="cron")
    if s.every_ms:
        limits.check_interval_ms(s.every_ms)
    else:
        limits.check_name("cron", s.cron, limits.MAX_CRON_BYTES)
        fields = s.cron.split()
        if len(fields) != CRON_FIELDS:
            raise InvalidArgumentError(
                f"cron {s.cron!r} has {len(fields)} fields; it needs 5 (minute hour "
                "day-of-month month day-of-week)",
                field="cron",
            )
        try:
            next(CronSim(s.cron, datetime.now(zone)))
        except (CronSimError, StopIteration) as exc:
            raise InvalidArgumentError(f"cron {s.cron!r}: {exc}", field="cron") from None
    return replace(s, max_attempts=max_attempts)


def _at(ms: int, zone: tzinfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=zone)


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def latest_periods(s: Schedule, after_ms: int, now_ms: int, limit: int) -> list[int]:
    """The starts of the latest ``limit`` periods in (``after_ms``, ``now_ms``], oldest first."""
    out: list[int] = []
    if s.every_ms:
        p = now_ms - now_ms % s.every_ms
        while p > after_ms and len(out) < limit:
            out.append(p)
            p -= s.every_ms
    else:
        # Reverse iteration yields times strictly before its start: start 1 ms past now.
        for dt in CronSim(s.cron, _at(now_ms + 1, _zone(s.timezone)), reverse=True):
            p = _ms(dt)
            if p <= after_ms or len(out) >= limit:
                break
            out.append(p)
    return out[::-1]


def due_periods(record: ScheduleRecord, now_ms: int) -> tuple[list[int], bool]:
    """The periods to enqueue now, oldest first, and whether older due ones were skipped
    (the catch-up policy dropped them)."""
    s = record.schedule
    keep = max(1, s.catch_up)
    found = latest_periods(s, record.after_ms, now_ms, keep + 1)
    if len(found) > keep:
        return found[1:], True
    return found, False


def next_period(s: Schedule, after_ms: int) -> int:
    """The start of the first period after ``after_ms``."""
    if s.every_ms:
        return after_ms - after_ms % s.every_ms + s.every_ms
    return _ms(next(CronSim(s.cron, _at(after_ms, _zone(s.timezone)))))


def period_key(name: str, period_ms: int) -> str:
    """The idempotency key of the job of one period: the unique key (schedule, period)."""
    return f"{KEY_PREFIX}{name}:{period_ms}"


def period_job(s: Schedule, period_ms: int, *, unique: bool = True) -> NewJob:
    """The job of one period, due at the period's start. ``unique=False`` leaves the key
    out: only the tests' control does that, to show the duplicates the key prevents."""
    return NewJob(
        payload=s.payload,
        idempotency_key=period_key(s.name, period_ms) if unique else "",
        max_attempts=s.max_attempts,
        run_at_ms=period_ms,
        priority=s.priority,
        resource=s.resource,
    )


__all__ = [
    "KEY_PREFIX",
    "Schedule",
    "ScheduleRecord",
    "due_periods",
    "latest_periods",
    "next_period",
    "period_job",
    "period_key",
    "validate",
]
