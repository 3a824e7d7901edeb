"""PostgreSQL's lease_steps (0018) beyond the contract suite: a step that names new
resources among existing ones takes every row in one pass in the lock order, so two
servers' steps over the same names, in opposite orders, wait for each other and never
deadlock, whatever mix of rows to create and rows to lock they carry; the control takes
the rows in the order the calls came and deadlocks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from fencing.errors import BackendUnavailableError
from lease_server.backends.postgres import PostgresBackend
from lease_server.batches import steps_of
from lease_server.leases import AcquireItem, Grant, Held, LeaseStep, ReleaseItem
from tests import pg as testpg
from tests.waiting import eventually

pytestmark = pytest.mark.postgres


Two = tuple[PostgresBackend, PostgresBackend, str, str]
#: The two backends' connections, to see them wait.
APP = "fencing-test-steps-race"


@pytest.fixture
async def two() -> AsyncIterator[Two]:
    """Two backends on one schema: two lease-server processes."""
    async with testpg.fresh_schema() as (dsn, name):
        url = f"{dsn}{'&' if '?' in dsn else '?'}application_name={APP}"
        a, b = PostgresBackend(url, name), PostgresBackend(url, name)
        await a.open()
        await b.open()
        try:
            yield a, b, dsn, name
        finally:
            await a.close()
            await b.close()


async def _lock_in_arrival_order(dsn: str, name: str) -> None:
    """The control: lease_steps taking the rows in the order the calls came."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pg_get_functiondef(%s::regprocedure)",
            (f"{name}.lease_steps(text[], text[], text[], bigint[], bigint[], text[])",),
        )
        row = await cur.fetchone()
        assert row is not None
        body = str(row[0])
        for ordered in ('ORDER BY s.r COLLATE "C"', 'ORDER BY l.resource COLLATE "C"'):
            assert ordered in body
        body = body.replace(
            "FROM unnest(p_resources, p_kinds) AS u(r, k) GROUP BY u.r",
            "FROM unnest(p_resources, p_kinds) WITH ORDINALITY AS u(r, k, o) GROUP BY u.r",
        ).replace('ORDER BY s.r COLLATE "C"', "ORDER BY min(s.o)")
        body = body.replace(
            "SELECT u.r, bool_or(u.k = 'acquire') AS acquired",
            "SELECT u.r, bool_or(u.k = 'acquire') AS acquired, min(u.o) AS o",
        ).replace("ORDER BY min(s.o)", "ORDER BY s.o")
        body = body.replace(
            "PERFORM 1 FROM leases AS l WHERE l.resource = ANY (p_resources)\n"
            '        ORDER BY l.resource COLLATE "C" FOR UPDATE;',
            "PERFORM 1 FROM unnest(p_resources) WITH ORDINALITY AS u(r, o)\n"
            "        JOIN leases AS l ON l.resource = u.r ORDER BY u.o FOR UPDATE OF l;",
        )
        await conn.execute(body.encode())


async def _waiting(dsn: str, app: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (app,),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _race(one: PostgresBackend, other: PostgresBackend, dsn: str, name: str) -> None:
    """Rounds of two steps over the same names, in opposite orders, each round made to
    overlap: a third transaction holds the middle name (a lock on its row, or its row
    inserted and not committed yet) until both steps wait, then lets go."""
    s1, s2 = steps_of(one), steps_of(other)
    old = [f"r{i}" for i in range(0, 12, 2)]
    for n in range(6):
        # New names fall between the existing ones in the lock order.
        names = sorted([*old, *(f"r{i}-{n}" for i in range(1, 12, 4))])
        forward: list[LeaseStep] = [AcquireItem(r, "one", 10_000, "") for r in names]
        backward: list[LeaseStep] = [AcquireItem(r, "two", 10_000, "") for r in reversed(names)]
        async with await psycopg.AsyncConnection.connect(dsn) as holder:
            await holder.execute(
                sql.SQL(
                    "INSERT INTO {}.leases AS l (resource, counter) VALUES (%s, 0)"
                    " ON CONFLICT (resource) DO UPDATE SET counter = l.counter WHERE false"
                ).format(sql.Identifier(name)),
                (names[len(names) // 2],),
            )
            both = asyncio.gather(s1.lease_steps(forward), s2.lease_steps(backward))
            await eventually(lambda: _waits(dsn), "both steps waiting")
            await holder.rollback()
            got1, got2 = await asyncio.wait_for(both, 30)
        by1 = {op.resource: g for op, g in zip(forward, got1, strict=True)}
        by2 = {op.resource: g for op, g in zip(backward, got2, strict=True)}
        for r in names:
            winner, loser = (by1[r], by2[r]) if isinstance(by1[r], Grant) else (by2[r], by1[r])
            assert isinstance(winner, Grant) and isinstance(loser, Held), (n, r, by1[r], by2[r])
            assert loser.token == winner.token
        releases: list[tuple[list[LeaseStep], PostgresBackend]] = [
            ([ReleaseItem(r, g.token, g.holder) for r, g in by.items() if isinstance(g, Grant)], b)
            for by, b in ((by1, one), (by2, other))
        ]
        done = await asyncio.gather(*(steps_of(b).lease_steps(ops) for ops, b in releases if ops))
        assert all(v is None for part in done for v in part)


async def _waits(dsn: str) -> bool:
    return await _waiting(dsn, APP) >= 2


async def test_steps_creating_and_locking_rows_at_once_never_deadlock(two: Two) -> None:
    await _race(*two)


async def test_control_steps_taking_rows_in_arrival_order_deadlock(two: Two) -> None:
    """The same race with the rows taken in the order the calls came: PostgreSQL finds
    the two steps waiting for each other and fails one of them."""
    await _lock_in_arrival_order(two[2], two[3])
    with pytest.raises(BackendUnavailableError, match="deadlock"):
        await _race(*two)
