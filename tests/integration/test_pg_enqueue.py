"""Enqueue in the application's own PostgreSQL transaction (``fencing.pg.enqueue``).

Real PostgreSQL, a real lease server hosting the queue on it (in-process, its claims'
poll set to a minute so that only the queue's NOTIFY can wake them): a rolled-back
transaction leaves no job; a waiting claim stays waiting while the transaction is
open and gets the job once it commits (control: without the trigger's NOTIFY the same
claim sleeps through its wait); the RPC, ``fencing.pg.enqueue`` and the SQL function
refuse every bad job with the same field; an idempotency key is one job whichever path
enqueued it; the asyncio twin and the batch form.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from fencing import InvalidArgumentError, QueueClient
from fencing import pg as fpg
from fencing.client import Job, new_job
from fencing.testing import running_servers
from lease_server.queue.service import QueueOptions
from tests import pg

pytestmark = pytest.mark.postgres

#: Long enough that a claim woken within its wait was woken by a NOTIFY, not a poll.
NO_POLL = QueueOptions(poll_interval_s=60.0)


@dataclass
class Setup:
    dsn: str
    schema: str
    queue: QueueClient


@pytest.fixture
def setup(postgres_url: str) -> Iterator[Setup]:
    schema = parse_qs(urlsplit(postgres_url).query)["schema"][0]
    with (
        running_servers(postgres_url, queue_options=NO_POLL) as servers,
        QueueClient(servers.queue_address) as queue,
    ):
        yield Setup(pg.test_dsn(), schema, queue)


def count(s: Setup, queue: str) -> int:
    with psycopg.connect(s.dsn) as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{s.schema}".jobs WHERE queue = %s', (queue,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_rolled_back_transaction_leaves_no_job(setup: Setup) -> None:
    with psycopg.connect(setup.dsn) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            fpg.enqueue(conn, "tx-rollback", b"order 1", schema=setup.schema)
            raise RuntimeError("the order failed")
        with conn.transaction():
            job = fpg.enqueue(conn, "tx-rollback", b"order 2", schema=setup.schema)
    assert job.created and job.state == "ready"
    assert count(setup, "tx-rollback") == 1
    (claimed,) = setup.queue.claim("tx-rollback", ttl=30)
    assert claimed.id == job.id and claimed.payload == b"order 2"


def _claim_in_background(
    queue: QueueClient, name: str, wait: float
) -> tuple[threading.Thread, list[list[Job]]]:
    got: list[list[Job]] = []
    thread = threading.Thread(target=lambda: got.append(queue.claim(name, ttl=30, wait=wait)))
    thread.start()
    return thread, got


def test_commit_wakes_a_waiting_claim_and_an_open_transaction_does_not(setup: Setup) -> None:
    setup.queue.stats("tx-wake")  # the queue's claims wait from here on
    thread, got = _claim_in_background(setup.queue, "tx-wake", wait=20)
    with psycopg.connect(setup.dsn) as conn:
        with conn.transaction():
            job = fpg.enqueue(conn, "tx-wake", b"email", schema=setup.schema)
            thread.join(1.0)  # the transaction is open: nothing to see, nothing woken
            assert thread.is_alive() and got == []
        thread.join(15)  # well inside the claim's 20 s wait: the NOTIFY woke it
    assert not thread.is_alive()
    assert [j.id for j in got[0]] == [job.id]


def test_control_without_the_notify_the_claim_sleeps_through_its_wait(setup: Setup) -> None:
    with psycopg.connect(setup.dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{setup.schema}".jobs DISABLE TRIGGER jobs_enqueued')
    setup.queue.stats("tx-silent")
    thread, got = _claim_in_background(setup.queue, "tx-silent", wait=8)
    with psycopg.connect(setup.dsn) as conn, conn.transaction():
        job = fpg.enqueue(conn, "tx-silent", b"email", schema=setup.schema)
    thread.join(4)
    assert thread.is_alive() and got == []  # committed, yet nobody told the waiting claim
    thread.join(30)  # it finds the job only when its wait ends and it asks again
    assert [j.id for j in got[0]] == [job.id]


#: (what, the enqueue's keyword arguments, the field every path names)
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("payload too large", {"payload": b"x" * (1024 * 1024 + 1)}, "jobs[0].payload"),
    ("idempotency key too long", {"idempotency_key": "k" * 257}, "jobs[0].idempotency_key"),
    ("a periodic job's key", {"idempotency_key": "periodic:x:1"}, "jobs[0].idempotency_key"),
    ("ordering key with a control", {"ordering_key": "a\tb"}, "jobs[0].ordering_key"),
    ("resource too long", {"resource": "r" * 257}, "jobs[0].resource"),
    ("priority too high", {"priority": 1001}, "jobs[0].priority"),
    ("priority too low", {"priority": -1001}, "jobs[0].priority"),
    ("too many attempts", {"max_attempts": 1001}, "jobs[0].max_attempts"),
    ("delay past a year", {"delay": 366 * 86400.0}, "jobs[0].delay_ms"),
    (
        "run_at past a year",
        {"run_at": datetime.now(UTC) + timedelta(days=400)},
        "jobs[0].run_at_ms",
    ),
]


def _raw_sql(conn: psycopg.Connection[Any], schema: str, queue: str, job: Any) -> None:
    """The SQL function as another language calls it: no Python check before it."""
    run_at = datetime.fromtimestamp(job.run_at_ms / 1000, UTC) if job.run_at_ms else None
    conn.execute(
        f'SELECT * FROM "{schema}".enqueue(%s, %s, %s, %s, %s, %s, %s, %s::timestamptz[], %s)',
        (
            queue,
            [job.payload],
            [job.idempotency_key],
            [job.ordering_key],
            [job.priority],
            [job.max_attempts],
            [job.delay_ms],
            [run_at],
            [job.resource],
        ),
    )


@pytest.mark.parametrize(("what", "kwargs", "field"), BAD, ids=[b[0] for b in BAD])
def test_the_rpc_and_both_sql_paths_refuse_a_bad_job_naming_one_field(
    setup: Setup, what: str, kwargs: dict[str, Any], field: str
) -> None:
    args = {"payload": b"ok", **kwargs}
    payload = args.pop("payload")
    with pytest.raises(InvalidArgumentError) as rpc:
        setup.queue.enqueue("tx-bad", payload, **args)
    with psycopg.connect(setup.dsn) as conn:
        with pytest.raises(InvalidArgumentError) as sdk:
            fpg.enqueue(conn, "tx-bad", payload, schema=setup.schema, **args)
        with pytest.raises(psycopg.Error) as raw, conn.transaction():
            _raw_sql(conn, setup.schema, "tx-bad", new_job(payload, **args))
    from_sql = fpg.fencing_error(raw.value)
    assert isinstance(from_sql, InvalidArgumentError), raw.value
    assert rpc.value.field == sdk.value.field == from_sql.field == field
    assert count(setup, "tx-bad") == 0


@pytest.mark.parametrize(("queue", "field"), [("", "queue"), ("q\x01", "queue")])
def test_the_queue_name_is_checked_on_every_path(setup: Setup, queue: str, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as rpc:
        setup.queue.enqueue(queue, b"x")
    with psycopg.connect(setup.dsn) as conn:
        with pytest.raises(InvalidArgumentError) as sdk:
            fpg.enqueue(conn, queue, b"x", schema=setup.schema)
        with pytest.raises(psycopg.Error) as raw, conn.transaction():
            _raw_sql(conn, setup.schema, queue, new_job(b"x"))
    from_sql = fpg.fencing_error(raw.value)
    assert isinstance(from_sql, InvalidArgumentError)
    assert rpc.value.field == sdk.value.field == from_sql.field == field


def test_one_idempotency_key_is_one_job_whichever_path_enqueued_it(setup: Setup) -> None:
    first = setup.queue.enqueue("tx-key", b"a", idempotency_key="order-7")
    with psycopg.connect(setup.dsn) as conn, conn.transaction():
        again = fpg.enqueue(conn, "tx-key", b"b", idempotency_key="order-7", schema=setup.schema)
        other = fpg.enqueue(conn, "tx-key", b"c", idempotency_key="order-8", schema=setup.schema)
    assert (again.id, again.created) == (first.id, False)
    assert other.created
    assert setup.queue.enqueue("tx-key", b"d", idempotency_key="order-8").id == other.id


def test_a_batch_in_order_with_the_defaults_the_rpc_gives(setup: Setup) -> None:
    jobs = [new_job(f"n{i}".encode(), priority=0) for i in range(3)]
    with psycopg.connect(setup.dsn) as conn, conn.transaction():
        done = fpg.enqueue_many(conn, "tx-batch", jobs, schema=setup.schema)
    assert [d.created for d in done] == [True] * 3
    assert [d.id for d in done] == sorted(d.id for d in done)
    info = setup.queue.get_job(done[0].id)
    assert info.max_attempts == 5  # 0: the server's default, as the RPC makes it
    with psycopg.connect(setup.dsn) as conn, pytest.raises(InvalidArgumentError) as empty:
        fpg.enqueue_many(conn, "tx-batch", [], schema=setup.schema)
    assert empty.value.field == "jobs"


async def test_the_asyncio_twin_commits_and_rolls_back(setup: Setup) -> None:
    async with await psycopg.AsyncConnection.connect(setup.dsn) as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await fpg.enqueue_async(conn, "tx-async", b"lost", schema=setup.schema)
                raise RuntimeError("rolled back")
        async with conn.transaction():
            job = await fpg.enqueue_async(conn, "tx-async", b"kept", schema=setup.schema)
            batch = await fpg.enqueue_many_async(
                conn, "tx-async", [new_job(b"b1"), new_job(b"b2")], schema=setup.schema
            )
    assert count(setup, "tx-async") == 3
    assert job.created and all(b.created for b in batch)
