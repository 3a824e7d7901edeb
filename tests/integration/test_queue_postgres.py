"""The PostgreSQL queue beyond the contract suite: the schema and its partial indexes in
the plan, several servers on one database, enqueue inside your own transaction, the
database refusing a second running job of an ordering key, tokens across restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from fencing.errors import LeaseLost
from lease_server.queue.backends.postgres import PostgresQueue
from lease_server.queue.jobs import JobRef, JobState, NewJob
from tests import pg as testpg

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with testpg.fresh_schema() as pair:
        yield pair


@pytest.fixture
async def queue(schema: tuple[str, str]) -> AsyncIterator[PostgresQueue]:
    q = PostgresQueue(*schema)
    await q.open()
    yield q
    await q.close()


async def connect(schema: tuple[str, str]) -> psycopg.AsyncConnection[tuple[object, ...]]:
    dsn, name = schema
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
    return conn


async def test_seed_schema_and_partial_indexes_apply_and_claims_use_them(
    queue: PostgresQueue, schema: tuple[str, str]
) -> None:
    """The queue's first check, and why it matters: with many finished rows, the claim
    reads the partial index of ready jobs, never the finished ones."""
    conn = await connect(schema)
    async with conn:
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = %s AND tablename = 'jobs'",
            (schema[1],),
        )
        indexes = {str(name): str(definition) for name, definition in await cur.fetchall()}
        assert "WHERE (state = 'ready'::text)" in indexes["jobs_ready"]
        assert "WHERE (state = 'running'::text)" in indexes["jobs_running"]
        assert "UNIQUE" in indexes["jobs_one_running_per_key"]
        await conn.execute(
            "INSERT INTO jobs (queue, payload, state, max_attempts, finished_at)"
            " SELECT 'q', 'x', 'succeeded', 5, now() FROM generate_series(1, 20000)"
        )
        await queue.enqueue("q", [NewJob(b"live") for _ in range(5)])
        await conn.execute("ANALYZE jobs")
        cur = await conn.execute(
            "EXPLAIN SELECT id FROM jobs WHERE queue = 'q' AND state = 'ready'"
            " AND available_at <= now() ORDER BY priority DESC, available_at, id"
            " LIMIT 10 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
    assert "jobs_ready" in plan, plan
    claimed = await queue.claim("q", "w", 10, 60_000)
    assert [r.payload for r in claimed] == [b"live"] * 5


async def test_two_servers_on_one_database_never_share_a_job(schema: tuple[str, str]) -> None:
    a, b = PostgresQueue(*schema), PostgresQueue(*schema)
    await a.open()
    await b.open()
    try:
        await a.enqueue("q", [NewJob(str(i).encode()) for i in range(300)])
        seen: list[int] = []

        async def claimer(q: PostgresQueue, name: str) -> None:
            for _ in range(300):
                claimed = await q.claim("q", name, 5, 60_000)
                if not claimed:
                    return
                seen.extend(r.id for r in claimed)
                await q.complete([JobRef(r.id, r.token) for r in claimed])

        await asyncio.wait_for(
            asyncio.gather(*(claimer(q, f"{q is a}-{i}") for q in (a, b) for i in range(6))), 60
        )
        assert len(seen) == 300 and len(set(seen)) == 300
    finally:
        await a.close()
        await b.close()


async def test_enqueue_inside_your_own_transaction(
    queue: PostgresQueue, schema: tuple[str, str]
) -> None:
    conn = await connect(schema)
    async with conn:
        async with conn.transaction():
            await conn.execute("SELECT job_enqueue('mail', 'hello', 'k1')")
            await conn.execute("SELECT job_enqueue('mail', 'again', 'k1')")  # same key: no-op
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("SELECT job_enqueue('mail', 'rolled back', 'k2')")
                raise RuntimeError("the caller's transaction fails")
    claimed = await queue.claim("mail", "w", 10, 60_000)
    assert [r.payload for r in claimed] == [b"hello"]


async def test_the_database_refuses_a_second_running_job_of_a_key(
    queue: PostgresQueue, schema: tuple[str, str]
) -> None:
    await queue.enqueue("q", [NewJob(b"a", ordering_key="k"), NewJob(b"b", ordering_key="k")])
    (first,) = await queue.claim("q", "w", 10, 60_000)
    conn = await connect(schema)
    async with conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute(
                "UPDATE jobs SET state = 'running', lease_until = now() WHERE id <> %s",
                (first.id,),
            )


async def test_tokens_keep_growing_across_a_restart(schema: tuple[str, str]) -> None:
    q = PostgresQueue(*schema)
    await q.open()
    await q.enqueue("q", [NewJob(b"x", max_attempts=5)])
    (first,) = await q.claim("q", "w", 1, 60_000)
    await q.release([JobRef(first.id, first.token)])
    await q.close()
    again = PostgresQueue(*schema)
    await again.open()
    try:
        (second,) = await again.claim("q", "w", 1, 60_000)
        assert second.id == first.id and second.token > first.token
        with pytest.raises(LeaseLost):
            await again.complete([JobRef(first.id, first.token)])
        stored = await again.get(first.id)
        assert stored is not None and stored.state is JobState.RUNNING
    finally:
        await again.close()


def test_a_drained_queue_reports_no_oldest_job_age_in_the_metric() -> None:
    """The backlog alert reads ``fencing_queue_oldest_job_age_seconds``: on a queue whose
    jobs all finished, or are all due later, the gauge is 0, not the Unix time."""
    import secrets
    import time

    from fencing import QueueClient
    from fencing.testing import running_servers
    from lease_server.queue.service import QueueOptions

    dsn, name = testpg.test_dsn(), f"{testpg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    options = QueueOptions(stats_interval_s=0.05, reap_interval_s=0.05, poll_interval_s=0.05)
    try:
        with (
            running_servers(testpg.with_schema(dsn, name), "memory://", queue_options=options) as s,
            QueueClient(s.queue_address) as q,
        ):
            registry = s.lease.metrics.registry

            def age(queue: str) -> float | None:
                return registry.get_sample_value(
                    "fencing_queue_oldest_job_age_seconds", {"queue": queue}
                )

            q.enqueue("done", b"x")
            (job,) = q.claim("done")
            q.complete(job)
            q.enqueue("later", b"x", delay=60)
            q.enqueue("due", b"x")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and None in (age("done"), age("later"), age("due")):
                time.sleep(0.05)  # the gauges refresh every 50 ms
            assert age("done") == 0 and age("later") == 0
            due = age("due")
            assert due is not None and 0 <= due < 3600  # a real age, not seconds since 1970
    finally:
        asyncio.run(testpg.drop_schema(dsn, name))
