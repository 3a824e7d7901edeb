"""Periodic jobs over real gRPC (a lease server on SQLite in a thread): the schedule RPCs
through both SDK twins, the scheduler enqueuing one job per period, validation at the
edge naming the field, the reserved key prefix, and the auth scope of the calls."""

from __future__ import annotations

import asyncio
import itertools
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import AsyncQueueClient, QueueClient
from fencing.client import ScheduleInfo
from fencing.errors import InvalidArgumentError, PermissionDeniedError, ResourceExhaustedError
from fencing.testing import RunningServers, running_servers
from lease_server.queue.service import QueueOptions
from serving.auth import AuthPolicy
from serving.server import ServerOptions

pytestmark = pytest.mark.slow  # real periods of a second


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}",
        f"sqlite:{tmp_path / 'guard.db'}",
        queue_options=QueueOptions(schedule_refresh_s=0.2),
    ) as running:
        yield running


def _claim_all(queue: QueueClient, name: str) -> list[str]:
    keys = []
    while jobs := queue.claim(name, batch=100):
        keys += [j.idempotency_key for j in jobs]
        queue.complete(jobs)
    return keys


def test_a_schedule_enqueues_one_job_per_period(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address) as queue:
        info = queue.put_schedule(
            "tick", "ticks", every=1, payload="hello", priority=5, max_attempts=2
        )
        assert (info.name, info.queue, info.every, info.cron) == ("tick", "ticks", 1.0, "")
        assert info.last_period is None and info.next_run > time.time() - 1
        time.sleep(3.4)
        (listed,) = queue.list_schedules()
        assert listed.last_period is not None and listed.last_job_id > 0
        assert listed.next_run == listed.last_period + 1
        jobs = queue.claim("ticks", batch=100)
        periods = sorted(int(j.idempotency_key.rsplit(":", 1)[1]) for j in jobs)
        assert 2 <= len(periods) <= 4, periods
        assert all(b - a == 1000 for a, b in itertools.pairwise(periods))
        assert all(j.payload == b"hello" and j.priority == 5 and j.max_attempts == 2 for j in jobs)
        assert sorted(j.period or 0.0 for j in jobs) == [p / 1000 for p in periods]
        assert {j.schedule_name for j in jobs} == {"tick"}
        assert max(periods) / 1000 >= listed.last_period
        queue.complete(jobs)
        assert queue.delete_schedule("tick", queue="other") is False  # not of that queue
        assert queue.delete_schedule("tick") is True
        assert queue.list_schedules() == []
        time.sleep(1.5)
        late = _claim_all(queue, "ticks")
        assert len(late) <= 1  # at most the period being enqueued as it was deleted


def test_the_async_twin_puts_lists_and_deletes() -> None:
    async def main(address: str) -> tuple[ScheduleInfo, list[ScheduleInfo], bool]:
        async with AsyncQueueClient(address) as queue:
            put = await queue.put_schedule(
                "nightly", "reports", cron="0 3 * * *", timezone="Europe/Riga", catch_up=2
            )
            listed = await queue.list_schedules("reports")
            return put, listed, await queue.delete_schedule("nightly", queue="reports")

    with running_servers("memory://", "memory://") as servers:
        put, listed, deleted = asyncio.run(main(servers.queue_address))
    assert put.cron == "0 3 * * *" and put.timezone == "Europe/Riga" and put.catch_up == 2
    assert [s.name for s in listed] == ["nightly"] and deleted
    assert time.gmtime(put.next_run).tm_hour in (0, 1)  # 03:00 in Riga is 01:00 or 00:00 UTC


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "*/5 * * *"}, "schedule.cron"),
        ({"cron": "0 25 * * *"}, "schedule.cron"),
        ({"every": 0.5}, "schedule.every_ms"),
        ({"cron": "* * * * *", "every": 60}, "schedule.cron"),
        ({}, "schedule.cron"),
        ({"cron": "* * * * *", "timezone": "Nowhere/City"}, "schedule.timezone"),
        ({"cron": "* * * * *", "catch_up": 1000}, "schedule.catch_up"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with (
        running_servers("memory://", "memory://") as servers,
        QueueClient(servers.queue_address) as queue,
    ):
        with pytest.raises(InvalidArgumentError) as info:
            queue.put_schedule("bad", "q", **kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
        with pytest.raises(InvalidArgumentError) as named:
            queue.put_schedule("n" * 200, "q", every=60)
        assert named.value.field == "schedule.name"
        assert queue.list_schedules() == []


def test_the_periodic_key_prefix_is_reserved() -> None:
    with (
        running_servers("memory://", "memory://") as servers,
        QueueClient(servers.queue_address) as queue,
    ):
        with pytest.raises(InvalidArgumentError) as info:
            queue.enqueue("q", b"x", idempotency_key="periodic:tick:1000")
        assert info.value.field == "jobs[0].idempotency_key"
        assert queue.enqueue("q", b"x", idempotency_key="periodical").created
        (job,) = queue.claim("q")
        assert (job.schedule_name, job.period) == ("", None)


POLICY = """
[principals.reports]
tokens = ["reports-token"]
allow = [{ prefix = "reports", actions = ["enqueue", "describe"] }]

[principals.ops]
tokens = ["ops-token"]
allow = [{ prefix = "", actions = ["*"] }]
"""


def test_schedule_calls_are_authorised_by_the_schedules_queue() -> None:
    policy = AuthPolicy.from_dict(tomllib.loads(POLICY))
    with (
        running_servers(options=ServerOptions(auth=policy)) as servers,
        QueueClient(servers.queue_address, token="reports-token") as reports,
        QueueClient(servers.queue_address, token="ops-token") as ops,
    ):
        reports.put_schedule("daily", "reports", cron="0 6 * * *")
        with pytest.raises(PermissionDeniedError):
            reports.put_schedule("sneaky", "billing", every=60)
        ops.put_schedule("billing-run", "billing", every=60)
        assert [s.name for s in reports.list_schedules("reports")] == ["daily"]
        with pytest.raises(PermissionDeniedError):
            reports.list_schedules()  # every queue: only a grant on everything
        with pytest.raises(PermissionDeniedError):
            reports.delete_schedule("billing-run", queue="billing")
        with pytest.raises(PermissionDeniedError):
            reports.delete_schedule("billing-run")  # any queue
        assert reports.delete_schedule("billing-run", queue="reports") is False  # not its
        assert reports.delete_schedule("daily", queue="reports") is True
        assert [s.name for s in ops.list_schedules()] == ["billing-run"]


def test_the_number_of_schedules_is_bounded() -> None:
    options = QueueOptions(max_schedules=2)
    with (
        running_servers(queue_options=options) as servers,
        QueueClient(servers.queue_address) as queue,
    ):
        queue.put_schedule("a", "q", every=60)
        queue.put_schedule("b", "q", every=60)
        with pytest.raises(ResourceExhaustedError) as info:
            queue.put_schedule("c", "q", every=60)
        assert info.value.limit == "schedules"
        queue.put_schedule("b", "q", every=120)  # replacing one is not adding one
        assert [(s.name, s.every) for s in queue.list_schedules()] == [("a", 60), ("b", 120)]
