"""Tokens on PostgreSQL survive a database that lost writes, with ``?token_floor=clock``.

A failover to an asynchronously replicated standby that lagged, or a restore from an
earlier dump, leaves the counter rows (and the job token sequence) as they were some
grants ago. Each test grants tokens, saves the rows as they are, grants more, then
puts the saved rows back, exactly what such a database would hold, and grants again.
With the floor the next token is larger than every earlier one; the control (the
floor off, as PostgreSQL has shipped until now) hands out a token again.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.types import Put
from guard.stores.postgres import PostgresStore
from lease_server.backends.postgres import PostgresBackend
from lease_server.leases import Grant
from lease_server.queue.backends.postgres import PostgresQueue
from lease_server.queue.jobs import JobRef, NewJob
from serving.postgres_db import PgConfig
from tests import pg as testpg

pytestmark = pytest.mark.postgres

FLOORS = pytest.mark.parametrize("floor", ["clock", "off"], ids=["floor", "control-no-floor"])


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with testpg.fresh_schema() as pair:
        yield pair


def url(schema: tuple[str, str], floor: str) -> str:
    return testpg.with_schema(schema[0], schema[1]) + f"&token_floor={floor}"


class Database:
    """A plain connection on the schema, standing in for what a lagging standby holds."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def lease_row(self, resource: str) -> Any:
        cur = await self.conn.execute(
            "SELECT to_jsonb(l) FROM leases AS l WHERE resource = %s", (resource,)
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0]

    async def put_lease_row(self, saved: Any) -> None:
        await self.conn.execute(
            "UPDATE leases AS l SET (counter, holder, token, expires_at, request_id) = "
            "(SELECT s.counter, s.holder, s.token, s.expires_at, s.request_id"
            " FROM jsonb_populate_record(NULL::leases, %s) AS s)"
            " WHERE l.resource = %s",
            (Jsonb(saved), saved["resource"]),
        )

    async def jobs_state(self) -> tuple[Any, int]:
        cur = await self.conn.execute("SELECT jsonb_agg(to_jsonb(j)) FROM jobs AS j")
        rows = await cur.fetchone()
        cur = await self.conn.execute("SELECT last_value FROM job_tokens")
        seq = await cur.fetchone()
        assert rows is not None and seq is not None
        return rows[0], int(seq[0])

    async def put_jobs_state(self, state: tuple[Any, int]) -> None:
        rows, last_value = state
        # A standby's rows are simply older; no trigger of ours ran on the way back
        # (the floor's job trigger would refuse to lower a token).
        await self.conn.execute("SET session_replication_role = replica")
        for saved in rows:
            await self.conn.execute(
                "UPDATE jobs AS j SET (state, attempts, token, lease_owner, lease_until) = "
                "(SELECT s.state, s.attempts, s.token, s.lease_owner, s.lease_until"
                " FROM jsonb_populate_record(NULL::jobs, %s) AS s) WHERE j.id = %s",
                (Jsonb(saved), saved["id"]),
            )
        await self.conn.execute("SELECT setval('job_tokens', %s)", (last_value,))
        await self.conn.execute("SET session_replication_role = origin")


@pytest.fixture
async def database(schema: tuple[str, str]) -> AsyncIterator[Database]:
    dsn, name = schema
    # The schema exists once a backend opened: migrate it first.
    backend = PostgresBackend(dsn, name)
    await backend.open()
    await backend.close()
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
    try:
        yield Database(conn)
    finally:
        await conn.close()


async def grant_and_release(backend: PostgresBackend, resource: str, n: int) -> list[int]:
    tokens = []
    for i in range(n):
        grant = await backend.acquire(resource, f"h{i}", 60_000, f"req-{resource}-{i}")
        assert isinstance(grant, Grant)
        tokens.append(grant.token)
        await backend.release(resource, grant.token, grant.holder)
    return tokens


@FLOORS
async def test_acquire_after_lost_writes(
    schema: tuple[str, str], database: Database, floor: str
) -> None:
    backend = PostgresBackend(url(schema, floor))
    await backend.open()
    try:
        assert backend.token_floor == floor
        earlier = await grant_and_release(backend, "orders", 5)
        saved = await database.lease_row("orders")  # what the standby has
        earlier += await grant_and_release(backend, "orders", 5)  # never reached it
        assert all(a < b for a, b in itertools.pairwise(earlier))
        await database.put_lease_row(saved)  # failover: the standby is the primary now
        after = await backend.acquire("orders", "new", 60_000, "req-new")
        assert isinstance(after, Grant)
        if floor == "clock":
            assert after.token > max(earlier), (after.token, earlier)
            assert (await backend.describe("orders")).last_token == after.token
        else:
            # The control: the sixth token is handed out a second time.
            assert earlier[:5] == [1, 2, 3, 4, 5]
            assert after.token == earlier[5] == 6
    finally:
        await backend.close()


@FLOORS
async def test_acquire_many_after_lost_writes(
    schema: tuple[str, str], database: Database, floor: str
) -> None:
    backend = PostgresBackend(url(schema, floor))
    await backend.open()
    try:
        first = await backend.acquire_many(["a", "b"], "h1", 60_000, "req-1")
        assert isinstance(first, list)
        saved = [await database.lease_row(r) for r in ("a", "b")]
        for grant in first:
            await backend.release(grant.resource, grant.token, grant.holder)
        second = await backend.acquire_many(["a", "b"], "h2", 60_000, "req-2")
        assert isinstance(second, list)
        for grant in second:
            await backend.release(grant.resource, grant.token, grant.holder)
        for row in saved:
            await database.put_lease_row(row)
            # The standby also had the first grant's lease still held: let it be expired.
            await database.conn.execute(
                "UPDATE leases SET expires_at = clock_timestamp() WHERE resource = %s",
                (row["resource"],),
            )
        after = await backend.acquire_many(["a", "b"], "h3", 60_000, "req-3")
        assert isinstance(after, list)
        before = {f.resource: max(f.token, s.token) for f, s in zip(first, second, strict=True)}
        for grant in after:
            if floor == "clock":
                assert grant.token > before[grant.resource]
            else:
                assert grant.token == before[grant.resource]  # the control: repeated
    finally:
        await backend.close()


@FLOORS
async def test_job_claims_after_lost_writes(
    schema: tuple[str, str], database: Database, floor: str
) -> None:
    queue = PostgresQueue(url(schema, floor))
    await queue.open()
    try:
        assert queue.token_floor == floor
        await queue.enqueue("q", [NewJob(b"job")])
        tokens = []
        saved = None
        for n in range(4):
            (job,) = await queue.claim("q", "w", 1, 60_000)
            tokens.append(job.token)
            await queue.release([JobRef(job.id, job.token)], "q")
            if n == 1:
                saved = await database.jobs_state()
        assert saved is not None and all(a < b for a, b in itertools.pairwise(tokens))
        await database.put_jobs_state(saved)  # the job row and the sequence go back
        (after,) = await queue.claim("q", "w", 1, 60_000)
        if floor == "clock":
            assert after.token > max(tokens), (after.token, tokens)
        else:
            assert after.token == tokens[2], tokens  # the control: the third claim's token again
    finally:
        await queue.close()


async def test_turning_the_floor_off_later_never_goes_back(
    schema: tuple[str, str], database: Database
) -> None:
    """Counters and job tokens raised by the floor stay raised for a server without it."""
    floored, plain = PostgresBackend(url(schema, "clock")), PostgresBackend(url(schema, "off"))
    fq, pq = PostgresQueue(url(schema, "clock")), PostgresQueue(url(schema, "off"))
    for part in (floored, plain, fq, pq):
        await part.open()
    try:
        high = (await grant_and_release(floored, "r", 1))[0]
        assert (await grant_and_release(plain, "r", 1))[0] == high + 1
        await fq.enqueue("q", [NewJob(b"job")])
        (job,) = await fq.claim("q", "w", 1, 60_000)
        await fq.release([JobRef(job.id, job.token)], "q")
        (again,) = await pq.claim("q", "w", 1, 60_000)  # the sequence is far below
        assert again.token == job.token + 1
        await pq.release([JobRef(again.id, again.token)], "q")
        (floored_claim,) = await fq.claim("q", "w", 1, 60_000)
        cancelled = await pq.cancel(floored_claim.id, "q", "")  # a cancel passes it too
        assert cancelled is not None and cancelled.fence_token > floored_claim.token
        assert cancelled.record.token == cancelled.fence_token
    finally:
        for part in (floored, plain, fq, pq):
            await part.close()


def test_the_url_option() -> None:
    plain = PgConfig.from_url("postgresql://u@h/db?schema=s")
    assert plain.token_floor == "off"
    floored = PgConfig.from_url("postgresql://u@h/db?schema=s&token_floor=clock&sslmode=allow")
    assert floored.token_floor == "clock"
    assert "token_floor" not in floored.conninfo and "sslmode=allow" in floored.conninfo
    with pytest.raises(InvalidArgumentError) as bad:
        PgConfig.from_url("postgresql://u@h/db?token_floor=wall")
    assert bad.value.field == "token_floor"


@FLOORS
async def test_a_paused_holder_after_failover_with_the_guard_in_the_same_database(
    schema: tuple[str, str], database: Database, floor: str
) -> None:
    """The whole scenario: B takes over from A and writes, then B pauses; a failover
    loses both (the standby had only A's release); C acquires and writes; B wakes and
    writes. With the floor C's token is larger than B's and B is refused; without it C
    gets B's token again, and B's late write lands over C's."""
    backend = PostgresBackend(url(schema, floor))
    store = PostgresStore(url(schema, floor))
    await backend.open()
    await store.open()
    try:
        a = await backend.acquire("orders", "a", 60_000, "req-a")
        assert isinstance(a, Grant)
        await store.write("orders", a.token, [Put("k", b"a")])
        await backend.release("orders", a.token, "a")
        saved_lease = await database.lease_row("orders")
        saved_fence = a.token
        b = await backend.acquire("orders", "b", 60_000, "req-b")
        assert isinstance(b, Grant)
        await store.write("orders", b.token, [Put("k", b"b")])  # then B pauses
        await database.put_lease_row(saved_lease)  # the failover loses B's grant ...
        await database.conn.execute(
            "UPDATE fences SET fence = %s WHERE resource = 'orders'", (saved_fence,)
        )  # ... and B's write
        c = await backend.acquire("orders", "c", 60_000, "req-c")
        assert isinstance(c, Grant)
        await store.write("orders", c.token, [Put("k", b"c")])
        if floor == "clock":
            assert c.token > b.token
            with pytest.raises(StaleTokenError) as stale:
                await store.write("orders", b.token, [Put("k", b"b, late")])
            assert stale.value.current_token == c.token
            expected = b"c"
        else:
            # The control: B and C hold the same token, and B's late write is accepted.
            assert c.token == b.token
            await store.write("orders", b.token, [Put("k", b"b, late")])
            expected = b"b, late"
        record = await store.read("orders", "k")
        assert record is not None and record.value == expected
    finally:
        await store.close()
        await backend.close()
