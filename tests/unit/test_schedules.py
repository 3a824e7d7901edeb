"""The pure rules of periodic jobs: validation at the edge, due periods, catch-up."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencing.client import Job
from fencing.errors import InvalidArgumentError
from fencing.v1 import queue_pb2
from lease_server.queue.schedules import (
    Schedule,
    ScheduleRecord,
    due_periods,
    next_period,
    period_job,
    period_key,
    validate,
)

EVERY_S = Schedule(name="s", queue="q", every_ms=1000)
HOURLY = Schedule(name="h", queue="q", cron="0 * * * *")


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "* * * * * *"}, "cron"),  # seconds are not cron's
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "@daily"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),  # never matches
        ({"cron": "* * * * *", "every_ms": 1000}, "cron"),
        ({"cron": "", "every_ms": 0}, "cron"),
        ({"cron": "", "every_ms": 999}, "every_ms"),
        ({"cron": "", "every_ms": 366 * 24 * 3600 * 1000}, "every_ms"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"name": ""}, "name"),
        ({"name": "n" * 129}, "name"),
        ({"name": "a\nb"}, "name"),
        ({"queue": ""}, "queue"),
        ({"catch_up": 101}, "catch_up"),
        ({"catch_up": -1}, "catch_up"),
        ({"priority": 1001}, "priority"),
        ({"max_attempts": 1001}, "max_attempts"),
    ],
)
def test_validation_names_the_field(change: dict[str, object], field: str) -> None:
    base = Schedule(name="n", queue="q", cron="* * * * *")
    with pytest.raises(InvalidArgumentError) as info:
        validate(replace(base, **change))  # type: ignore[arg-type]
    assert info.value.field == field


def test_validation_fills_the_default_max_attempts() -> None:
    s = validate(Schedule(name="n", queue="q", every_ms=1000, max_attempts=0))
    assert s.max_attempts == 5
    assert validate(replace(HOURLY, timezone="America/New_York")).timezone == "America/New_York"


def test_a_new_schedule_starts_with_the_first_period_after_its_creation() -> None:
    record = ScheduleRecord(EVERY_S, created_at_ms=10_500)
    assert due_periods(record, 10_900) == ([], False)
    assert due_periods(record, 11_000) == ([11_000], False)
    assert next_period(EVERY_S, record.after_ms) == 11_000


def test_after_downtime_only_the_latest_period_by_default() -> None:
    record = ScheduleRecord(EVERY_S, created_at_ms=0, last_period_ms=20_000)
    assert due_periods(record, 21_100) == ([21_000], False)
    assert due_periods(record, 25_400) == ([25_000], True)  # 21..24 s skipped


def test_catch_up_enqueues_each_missed_period_up_to_its_bound() -> None:
    record = ScheduleRecord(replace(EVERY_S, catch_up=3), created_at_ms=0, last_period_ms=20_000)
    assert due_periods(record, 22_100) == ([21_000, 22_000], False)
    assert due_periods(record, 25_400) == ([23_000, 24_000, 25_000], True)


def test_cron_periods_in_utc_and_in_a_time_zone() -> None:
    record = ScheduleRecord(HOURLY, created_at_ms=ms(2026, 1, 1, 10, 30))
    assert due_periods(record, ms(2026, 1, 1, 12, 5)) == ([ms(2026, 1, 1, 12)], True)
    nine = Schedule(name="r", queue="q", cron="0 9 * * *", timezone="Europe/Riga")
    winter = ScheduleRecord(nine, created_at_ms=ms(2026, 1, 1))
    assert next_period(nine, winter.after_ms) == ms(2026, 1, 1, 7)  # UTC+2
    assert next_period(nine, ms(2026, 7, 1)) == ms(2026, 7, 1, 6)  # summer: UTC+3
    catch = ScheduleRecord(replace(nine, catch_up=2), created_at_ms=ms(2026, 1, 1))
    assert due_periods(catch, ms(2026, 1, 5, 12)) == (
        [ms(2026, 1, 4, 7), ms(2026, 1, 5, 7)],
        True,
    )


def test_the_job_of_a_period() -> None:
    s = Schedule(name="s", queue="q", every_ms=1000, payload=b"x", priority=3, resource="r")
    job = period_job(s, 42_000)
    assert job.idempotency_key == "periodic:s:42000" and job.run_at_ms == 42_000
    assert (job.payload, job.priority, job.resource) == (b"x", 3, "r")
    assert period_job(s, 42_000, unique=False).idempotency_key == ""


@given(
    every=st.integers(1000, 10**7),
    last=st.integers(0, 10**10),
    gap=st.integers(0, 10**9),
    catch_up=st.integers(0, 100),
)
def test_interval_periods_are_aligned_in_order_and_bounded(
    every: int, last: int, gap: int, catch_up: int
) -> None:
    s = Schedule(name="s", queue="q", every_ms=every, catch_up=catch_up)
    record = ScheduleRecord(s, created_at_ms=0, last_period_ms=last)
    now = last + gap
    periods, skipped = due_periods(record, now)
    assert periods == sorted(set(periods))
    assert all(p % every == 0 and last < p <= now for p in periods)
    assert len(periods) <= max(1, catch_up)
    latest = now - now % every
    if latest > last:
        assert periods[-1] == latest  # the latest due period is always among them
        missed = (latest - last - 1) // every + 1
        assert skipped == (missed > max(1, catch_up))
    else:
        assert periods == [] and not skipped


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (period_key("nightly", 1_700_000_000_000), ("nightly", 1_700_000_000.0)),
        (period_key("a:b", 5000), ("a:b", 5.0)),  # a name may hold the separator
        ("periodic::5000", ("", None)),
        ("periodic:x:soon", ("", None)),
        ("mine-5000", ("", None)),
        ("", ("", None)),
    ],
)
def test_the_sdk_reads_the_servers_period_key(key: str, expected: tuple[str, float | None]) -> None:
    job = Job(queue_pb2.Job(id=1, queue="q", token=1, ttl_ms=1000, idempotency_key=key), 0.0)
    assert (job.schedule_name, job.period) == expected
