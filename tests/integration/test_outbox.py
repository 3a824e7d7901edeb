"""The transactional outbox on PostgreSQL: events written in the user's own transaction,
published at least once through the guard, once per event id, in order per aggregate."""

from __future__ import annotations

import asyncio
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from fencing import GuardClient, Job
from fencing.outbox import GuardSink, OutboxPublisher
from fencing.testing import RunningServers, running_servers
from tests import pg as testpg

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def schema_url() -> Iterator[tuple[str, str]]:
    """``(url with ?schema=, schema)`` of a fresh schema, dropped after the test."""
    dsn = testpg.test_dsn()
    name = f"{testpg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    yield testpg.with_schema(dsn, name), name
    asyncio.run(testpg.drop_schema(dsn, name))


@pytest.fixture
def servers(schema_url: tuple[str, str]) -> Iterator[RunningServers]:
    # Leases and jobs in the application's database (the queue follows the lease URL).
    with running_servers(schema_url[0], "memory://") as running:
        yield running


def emit(schema: str, events: list[tuple[str, str, bytes]], *, commit: bool = True) -> list[int]:
    """Write ``(aggregate, event id, payload)`` events in one transaction of our own."""
    ids = []
    with (
        psycopg.connect(testpg.test_dsn()) as conn,
        conn.transaction(force_rollback=not commit),
    ):
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS orders (id text, status text)")
        for aggregate, event, payload in events:
            conn.execute("INSERT INTO orders VALUES (%s, 'changed')", (aggregate,))
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.outbox (aggregate_key, event_id, payload)"
                    " VALUES (%s, %s, %s) RETURNING id"
                ).format(sql.Identifier(schema)),
                (aggregate, event, payload),
            ).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    return ids


def outbox_rows(schema: str) -> list[tuple[str, str, str, int]]:
    with psycopg.connect(testpg.test_dsn()) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT event_id, aggregate_key, state, attempts FROM {}.outbox ORDER BY id"
            ).format(sql.Identifier(schema))
        ).fetchall()
    return [(str(a), str(b), str(c), int(d)) for a, b, c, d in rows]


async def until(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


def test_events_commit_with_the_writing_transaction_once_per_event_id(
    servers: RunningServers, schema_url: tuple[str, str]
) -> None:
    schema = schema_url[1]
    emit(schema, [("order-1", "o1-created", b"{}"), ("order-1", "o1-paid", b"{}")])
    emit(schema, [("order-2", "o2-created", b"{}")], commit=False)  # rolled back: never seen
    again = emit(schema, [("order-1", "o1-paid", b"{}")])  # the same event id: added once
    rows = outbox_rows(schema)
    assert [(e, a, s) for e, a, s, _ in rows] == [
        ("o1-created", "order-1", "ready"),
        ("o1-paid", "order-1", "waiting"),  # behind the earlier event of its aggregate
    ]
    with psycopg.connect(testpg.test_dsn()) as conn:
        row = conn.execute(
            sql.SQL("SELECT {}.outbox_emit('order-3', 'x', NULL)").format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None and row[0] > again[0]
    assert len(outbox_rows(schema)[-1][0]) == 36  # a generated UUID event id


async def run_publisher(
    publisher: OutboxPublisher, done: Callable[[], bool], seconds: float = 30.0
) -> None:
    task = asyncio.create_task(publisher.run())
    try:
        await until(lambda: done() or task.done(), seconds)
    finally:
        publisher.stop()
        await asyncio.wait_for(task, 15)


async def test_the_publisher_delivers_each_event_in_order_per_aggregate(
    servers: RunningServers, schema_url: tuple[str, str]
) -> None:
    schema = schema_url[1]
    written: list[tuple[str, str, bytes]] = []
    for i in range(10):
        for agg in ("a", "b", "c"):
            one = (f"agg-{agg}", f"{agg}-{i}", f"{agg}:{i}".encode())
            await asyncio.to_thread(emit, schema, [one])
            written.append(one)
    sink = GuardSink(servers.guard_address)
    publisher = OutboxPublisher(
        servers.queue_address, sink, batch=8, ttl=5, poll=0.2, handle_signals=False
    )
    await run_publisher(
        publisher, lambda: all(r[2] == "succeeded" for r in outbox_rows(schema)), 60
    )
    await sink.aclose()
    assert publisher.counts["completed"] == 30
    with GuardClient(servers.guard_address) as guard:
        for agg in ("a", "b", "c"):
            tokens = []
            for aggregate, event, payload in (w for w in written if w[0] == f"agg-{agg}"):
                record = guard.read(f"outbox/{aggregate}", f"events/{event}")
                assert record is not None and record.value == payload
                tokens.append(record.written_by_token)
            assert tokens == sorted(tokens) and len(set(tokens)) == 10  # delivered in order


async def test_a_crashed_publisher_redelivers_and_the_guard_applies_each_event_once(
    servers: RunningServers, schema_url: tuple[str, str]
) -> None:
    schema = schema_url[1]
    emit(schema, [(f"agg-{i}", f"ev-{i}", f"payload {i}".encode()) for i in range(4)])
    real = GuardSink(servers.guard_address)
    first_tokens: dict[str, int] = {}
    stuck = asyncio.Event()

    class CrashesAfterDelivering:
        async def deliver(self, event: Job) -> None:
            await real.deliver(event)
            first_tokens[event.idempotency_key] = event.token
            await stuck.wait()  # never: the process "dies" before marking it published

    crashing = OutboxPublisher(
        servers.queue_address, CrashesAfterDelivering(), batch=4, ttl=1, handle_signals=False
    )
    task = asyncio.create_task(crashing.run())
    await until(lambda: len(first_tokens) == 4)
    task.cancel()  # a crash: nothing completed, nothing released
    with pytest.raises(asyncio.CancelledError):
        await task

    publisher = OutboxPublisher(
        servers.queue_address, real, batch=4, ttl=10, poll=0.2, handle_signals=False
    )
    await run_publisher(
        publisher, lambda: all(r[2] == "succeeded" for r in outbox_rows(schema)), 60
    )
    await real.aclose()
    assert [r[3] for r in outbox_rows(schema)] == [2, 2, 2, 2]  # each delivered twice...
    with GuardClient(servers.guard_address) as guard:
        for i in range(4):
            record = guard.read(f"outbox/agg-{i}", f"events/ev-{i}")
            assert record is not None and record.value == f"payload {i}".encode()
            # ... and applied once: the first delivery's write stands.
            assert record.written_by_token == first_tokens[f"ev-{i}"]


def test_fencing_outbox_run_publishes_until_sigterm(
    servers: RunningServers, schema_url: tuple[str, str]
) -> None:
    schema = schema_url[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fencingctl",
            "outbox",
            "run",
            "--lease-addr",
            servers.queue_address,
            "--guard-addr",
            servers.guard_address,
            "--batch",
            "10",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        emit(schema, [("order-9", f"o9-{i}", b"{}") for i in range(5)])
        deadline = time.monotonic() + 30
        while not all(r[2] == "succeeded" for r in outbox_rows(schema)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "completed=5" in out
