"""Exactly one job per period however many lease servers run, and no burst after downtime.

PostgreSQL: three real ``python -m lease_server`` processes on one schema run a schedule
every second for about five seconds; every period in the run has exactly one job. The
control runs three processes whose schedulers leave the unique key (schedule, period)
off (``tests/e2e/periodic_server.py --no-unique``) and must show a period with several
jobs. SQLite: the same with three in-process lease servers sharing the database files
(as ``--workers N`` processes share them). Downtime: the servers stop for several
periods and start again; only the latest missed period is enqueued (with ``catch_up``
the latest N missed ones), never a burst of all of them.

Periods are read from the jobs themselves: a periodic job is due at its period's start.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from fencing import AsyncQueueClient, QueueClient
from lease_server.queue.schedules import period_key
from lease_server.queue.service import QueueOptions
from lease_server.server import LeaseServer, start_lease_server
from tests.e2e.test_postgres_servers import lease_servers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUEUE = "ticks"
RUN_S = 5.5


#: A job as read back: due time (its period's start), idempotency key, creation time (ms).
Row = tuple[int, str, int]


def periods_of(jobs: list[Row]) -> collections.Counter[int]:
    """Jobs per period (a periodic job's due time is its period's start)."""
    return collections.Counter(due for due, _, _ in jobs)


def assert_one_job_per_period(jobs: list[Row]) -> None:
    counts = periods_of(jobs)
    assert len(counts) >= 3, counts  # the run spanned several periods
    assert set(counts.values()) == {1}, counts
    periods = sorted(counts)
    assert all(b - a == 1000 for a, b in itertools.pairwise(periods)), periods  # none lost
    assert all(key == period_key("tick", due) for due, key, _ in jobs)


def assert_duplicates(jobs: list[Row]) -> None:
    counts = periods_of(jobs)
    assert len(counts) >= 3, counts
    assert max(counts.values()) > 1, counts  # what the key prevents


def run_schedule(address: str, catch_up: int = 0) -> None:
    with QueueClient(address) as queue:
        queue.put_schedule("tick", QUEUE, every=1, catch_up=catch_up)
        time.sleep(RUN_S)
        assert queue.delete_schedule("tick")
    time.sleep(0.5)  # a step that read the schedule just before the delete finishes


# -- PostgreSQL: real processes -----------------------------------------------------------------


def pg_jobs(url: str) -> list[Row]:
    dsn, _, query = url.partition("?")
    schema = dict(p.split("=", 1) for p in query.split("&"))["schema"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT {schema}.job_ms(available_at), coalesce(idempotency_key, ''),"
            f" {schema}.job_ms(created_at) FROM {schema}.jobs WHERE queue = %s",
            (QUEUE,),
        ).fetchall()
    return [(int(due), str(key), int(created)) for due, key, created in rows]


@pytest.mark.postgres
def test_three_server_processes_enqueue_one_job_per_period(postgres_url: str) -> None:
    with lease_servers(postgres_url, 3) as addresses:
        run_schedule(addresses[1])
    assert_one_job_per_period(pg_jobs(postgres_url))


@pytest.mark.postgres
def test_control_without_the_unique_key_three_processes_enqueue_duplicates(
    postgres_url: str,
) -> None:
    command = ("-m", "tests.e2e.periodic_server", "--no-unique")
    with lease_servers(postgres_url, 3, command) as addresses:
        run_schedule(addresses[0])
    assert_duplicates(pg_jobs(postgres_url))


# -- SQLite: in-process servers sharing the files, and downtime on both -------------------------


@contextlib.asynccontextmanager
async def servers(backend: str, count: int, *, unique: bool = True) -> AsyncIterator[list[str]]:
    options = QueueOptions(periodic_unique=unique)
    started: list[LeaseServer] = []
    try:
        for _ in range(count):
            started.append(await start_lease_server(backend, "127.0.0.1:0", queue_options=options))
        yield [s.address for s in started]
    finally:
        for s in started:
            await s.stop(0.5)


def sqlite_jobs(path: Path) -> list[Row]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT available_at_ms, coalesce(idempotency_key, ''), created_at_ms FROM jobs"
            " WHERE queue = ?",
            (QUEUE,),
        ).fetchall()
    return [(int(due), str(key), int(created)) for due, key, created in rows]


@pytest.mark.parametrize("unique", [True, False], ids=["keyed", "control-no-key"])
async def test_three_servers_on_one_sqlite_file(tmp_path: Path, unique: bool) -> None:
    async with servers(f"sqlite:{tmp_path / 'leases.db'}", 3, unique=unique) as addresses:
        await asyncio.to_thread(run_schedule, addresses[2])
    jobs = sqlite_jobs(tmp_path / "leases-queue.db")
    if unique:
        assert_one_job_per_period(jobs)
    else:
        assert_duplicates(jobs)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'leases.db'}"
    return str(request.getfixturevalue("postgres_url"))


def jobs_of(backend: str, tmp_path: Path) -> list[Row]:
    if backend.startswith("sqlite"):
        return sqlite_jobs(tmp_path / "leases-queue.db")
    return pg_jobs(backend)


DOWN_S = 4.5


def run_with_downtime(backend: str, catch_up: int) -> tuple[int, int]:
    """Two servers run a schedule every second, stop for DOWN_S, start again; returns the
    wall times (ms) the first run ended and the second started."""

    async def run(first: bool) -> None:
        async with servers(backend, 2) as addresses, AsyncQueueClient(addresses[0]) as queue:
            if first:
                await queue.put_schedule("tick", QUEUE, every=1, catch_up=catch_up)
            await asyncio.sleep(2.6)
            if not first:
                await queue.delete_schedule("tick")

    asyncio.run(run(True))
    stopped = time.time_ns() // 1_000_000
    time.sleep(DOWN_S)
    restarted = time.time_ns() // 1_000_000
    asyncio.run(run(False))
    return stopped, restarted


@pytest.mark.parametrize("catch_up", [0, 2])
def test_after_downtime_no_burst_of_missed_periods(
    backend: str, tmp_path: Path, catch_up: int
) -> None:
    stopped, restarted = run_with_downtime(backend, catch_up)
    jobs = jobs_of(backend, tmp_path)
    counts = periods_of(jobs)
    assert set(counts.values()) == {1}, counts
    before = sorted(p for p in counts if p <= stopped)
    after = sorted(p for p in counts if p > stopped)
    assert len(before) >= 2 and len(after) >= 2, counts
    missed = [p for p in range(before[-1] + 1000, restarted + 1, 1000)]
    assert len(missed) >= 3  # periods that started while every server was down
    assert all(b - a == 1000 for a, b in itertools.pairwise(after)), after
    # A period's job is normally enqueued within a second of its start (the scheduler
    # picks the latest due period); only a caught-up missed period is enqueued later.
    late = sorted(due for due, _, created in jobs if created - due >= 1000)
    assert len(late) == max(1, catch_up) - 1, (late, counts)
    assert all(p in missed for p in late)
    enqueued_missed = [p for p in after if p in missed]
    assert len(enqueued_missed) <= max(1, catch_up), (enqueued_missed, missed)
