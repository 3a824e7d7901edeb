"""The PostgreSQL event log beyond the contract suite: commit order under concurrency,
several servers on one schema, the 0001 entry points, upgrades, and migrations that
arrive out of order (numbers reserved by parallel work leave gaps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lease_server.backends import postgres as backend_module
from lease_server.backends.postgres import PostgresBackend
from lease_server.leases import Grant, LoggedEvent, Scope, TransitionKind
from serving import postgres_db
from tests import pg as testpg
from tests.waiting import eventually

pytestmark = pytest.mark.postgres

A, L, X = TransitionKind.ACQUIRED, TransitionKind.RELEASED, TransitionKind.EXPIRED


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    async with testpg.fresh_schema() as pair:
        yield pair


@pytest.fixture
async def two(schema: tuple[str, str]) -> AsyncIterator[tuple[PostgresBackend, PostgresBackend]]:
    """Two backends on one schema: two lease-server processes."""
    a, b = PostgresBackend(*schema), PostgresBackend(*schema)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def _sql(
    dsn: str, query: sql.SQL | sql.Composed, params: tuple[object, ...] = ()
) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def test_revisions_become_visible_in_order_under_concurrent_appends(
    two: tuple[PostgresBackend, PostgresBackend],
) -> None:
    """Rule 3: a reader that has seen revision N never finds a revision <= N later.

    Many appenders on two servers race while readers page through the log from their
    cursors; every page must continue exactly where the cursor was (no revision skipped
    now and appearing later), and in the end every reader saw 1..N once each."""
    a, b = two
    rounds, workers = 15, 8
    stop = asyncio.Event()

    async def churn(i: int) -> None:
        backend = (a, b)[i % 2]
        for _ in range(rounds):
            g = await backend.acquire(f"r{i}", f"w{i}", 5000, "")
            assert isinstance(g, Grant)
            await backend.renew(f"r{i}", g.token, "", 5000)
            await backend.release(f"r{i}", g.token, "")

    async def read(backend: PostgresBackend) -> list[int]:
        seen: list[int] = []
        cursor = 0
        while True:
            done = stop.is_set()  # decided before the read: the last pass sees everything
            page = await backend.events_after(cursor, Scope(), 7)
            revisions = [e.revision for e in page.events]
            assert revisions == list(range(cursor + 1, cursor + 1 + len(revisions)))
            seen += revisions
            cursor = revisions[-1] if len(revisions) == 7 else max(cursor, page.head)
            if done and len(revisions) < 7:
                return seen
            await asyncio.sleep(0)

    readers = [asyncio.create_task(read(x)) for x in (a, b, a)]
    await asyncio.gather(*(churn(i) for i in range(workers)))
    total = rounds * workers * 2  # acquire and release: a renewal is not an event

    # Events a step parked while another held the log row are numbered soon after, by
    # their process's next step or its background run, which may still be under way
    # when the last call returns: the head gets to the total, never past it.
    async def all_numbered() -> bool:
        head = await a.head_revision()
        assert head <= total
        return head == total

    await eventually(all_numbered, "every event numbered")
    stop.set()
    for seen in await asyncio.gather(*readers):
        assert seen == list(range(1, total + 1))


async def test_another_servers_appends_are_heard_through_notify(
    two: tuple[PostgresBackend, PostgresBackend],
) -> None:
    a, b = two
    heard: asyncio.Queue[int] = asyncio.Queue()
    b.on_events(heard.put_nowait)  # starts b's LISTEN connection
    # Heard through NOTIFY, or, if b's LISTEN was not up yet, from the head b's listener
    # reports once it is: either way at once, with no poll.
    g = await a.acquire("r", "a", 5000, "")
    assert isinstance(g, Grant)
    assert await asyncio.wait_for(heard.get(), 5) == 1
    await a.release("r", g.token, "a")
    assert await asyncio.wait_for(heard.get(), 5) == 2
    # Own appends are reported at once; their NOTIFY echo is not reported again.
    await b.acquire("s", "b", 5000, "")
    assert heard.get_nowait() == 3
    await asyncio.sleep(0.3)
    assert heard.empty()


async def test_the_0001_entry_points_log_too(
    schema: tuple[str, str], two: tuple[PostgresBackend, PostgresBackend]
) -> None:
    """An older lease server, or your own SQL, calling lease_acquire/renew/release
    (0001) appends the same events as the backend does."""
    dsn, name = schema
    a, _ = two
    s = sql.Identifier(name)

    async def call(function: str, *args: object) -> Any:
        query = sql.SQL("SELECT * FROM {}.{}(" + ", ".join(["%s"] * len(args)) + ")")
        return (await _sql(dsn, query.format(s, sql.Identifier(function)), args))[0]

    granted, _, _, token, _ = await call("lease_acquire", "r", "old", 5000, "")
    assert granted
    assert await call("lease_renew", "r", token, "", 5000) == ("old",)
    assert await call("lease_release", "r", token, "") == (True,)
    assert await call("lease_release", "r", token, "") == (False,)
    events = (await a.events_after(0, Scope(), 100)).events
    assert [(e.kind, e.token, e.holder) for e in events] == [
        (A, token, "old"),
        (L, token, "old"),
    ]


async def test_an_upgrade_logs_the_end_of_leases_granted_before_it(
    schema: tuple[str, str],
) -> None:
    """A schema at 0001-0002 (the code before the log) with a live and an expiring lease;
    after 0005 their ends are logged once like any other."""
    dsn, name = schema
    before = [m for m in postgres_db.migrations() if m.version <= 2]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await postgres_db._apply_migrations(conn, name, before) == [1, 2]
        s = sql.Identifier(name)
        for resource, ttl in (("live", 5000), ("dying", 100)):
            await conn.execute(
                sql.SQL("SELECT * FROM {}.lease_acquire(%s, 'h', %s, '')").format(s),
                (resource, ttl),
            )
    backend = PostgresBackend(dsn, name)
    await backend.open()  # migrates the rest
    try:
        assert await backend.head_revision() == 0
        await asyncio.sleep(0.15)
        swept = await backend.expire_due(10)
        assert [(e.kind, e.resource, e.token) for e in swept] == [(X, "dying", 1)]
        await backend.release("live", 1, "h")
        events = (await backend.events_after(0, Scope(), 10)).events
        assert [(e.kind, e.resource) for e in events] == [(X, "dying"), (L, "live")]
    finally:
        await backend.close()


async def test_a_lease_held_across_0022_renews_by_the_old_default_ttl(
    schema: tuple[str, str],
) -> None:
    """0022 keeps each lease's ttl: a lease granted before it, whose ttl was never stored,
    renews (ttl 0: its own) by 10 s, the SDK's default its renewals sent until then; a
    lease granted after it by its own."""
    dsn, name = schema
    before = [m for m in postgres_db.migrations() if m.version < 22]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await postgres_db._apply_migrations(conn, name, before)
        s = sql.Identifier(name)
        await conn.execute(
            sql.SQL("SELECT * FROM {}.lease_steps(ARRAY['acquire'], ARRAY['old'], ARRAY['h'],"
                    " ARRAY[0::bigint], ARRAY[60000::bigint], ARRAY[''])").format(s)
        )  # fmt: skip
    backend = PostgresBackend(dsn, name)
    await backend.open()  # migrates 0022
    try:
        assert (await backend.describe("old")).ttl_ms == 10_000
        assert (await backend.renew("old", 1, "h", 0)).ttl_ms == 10_000
        new = await backend.acquire("new", "h", 60_000, "")
        assert isinstance(new, Grant)
        assert (await backend.renew("new", new.token, "h", 0)).ttl_ms == 60_000
    finally:
        await backend.close()


def _fake(version: int) -> postgres_db.Migration:
    return postgres_db.Migration(
        version,
        f"fake{version}",
        f"-- {version:04d}_fake{version}: test\nCREATE TABLE fake{version} (id integer);\n",
    )


async def test_migrations_apply_across_gaps_and_fill_them_later(schema: tuple[str, str]) -> None:
    """Parallel work reserves numbers: 0005 may ship before 0003 and 0004. Each missing
    version is applied, in order, whenever it arrives; none is required to be contiguous."""
    dsn, name = schema
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await postgres_db._apply_migrations(conn, name, [_fake(1), _fake(2), _fake(5)]) == [
            1,
            2,
            5,
        ]
        assert await postgres_db._apply_migrations(conn, name, [_fake(1), _fake(2), _fake(5)]) == []
        later = [_fake(4), _fake(1), _fake(3), _fake(2), _fake(5)]
        assert await postgres_db._apply_migrations(conn, name, later) == [3, 4]
        # Code that knows fewer versions than the schema has: nothing to do, no error.
        assert await postgres_db._apply_migrations(conn, name, [_fake(1)]) == []
    rows = await _sql(
        dsn,
        sql.SQL(
            "SELECT version, name FROM {}.schema_migrations ORDER BY applied_at, version"
        ).format(sql.Identifier(name)),
    )
    assert sorted(v for v, _ in rows) == [1, 2, 3, 4, 5]
    tables = await _sql(
        dsn,
        sql.SQL(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name LIKE 'fake%%' ORDER BY table_name"
        ),
        (name,),
    )
    assert [t for (t,) in tables] == ["fake1", "fake2", "fake3", "fake4", "fake5"]


def test_migration_numbers_must_be_unique_and_positive() -> None:
    with pytest.raises(RuntimeError, match="unique"):
        postgres_db.ordered([_fake(1), _fake(3), _fake(3)])
    with pytest.raises(RuntimeError, match="positive"):
        postgres_db.ordered([_fake(0), _fake(1)])
    assert [m.version for m in postgres_db.ordered([_fake(5), _fake(1), _fake(2)])] == [1, 2, 5]


def _events(page_events: tuple[LoggedEvent, ...]) -> list[tuple[TransitionKind, str]]:
    return [(e.kind, e.resource) for e in page_events]


async def test_a_narrow_scope_reads_past_other_resources(
    two: tuple[PostgresBackend, PostgresBackend],
) -> None:
    a, _ = two
    for i in range(50):
        await a.acquire(f"noise/{i}", "n", 5000, "")
    await a.acquire("jobs/1", "j", 5000, "")
    page = await a.events_after(0, Scope(prefix="jobs/"), 10)
    assert _events(page.events) == [(A, "jobs/1")] and page.head == 51
    page = await a.events_after(51, Scope(resource="jobs/1"), 10)
    assert page.events == () and page.head == 51


async def test_servers_on_one_schema_share_the_log_identity_and_a_restart_keeps_it(
    schema: tuple[str, str], two: tuple[PostgresBackend, PostgresBackend]
) -> None:
    a, b = two
    identity = await a.log_id()
    assert identity and await b.log_id() == identity
    again = PostgresBackend(*schema)
    await again.open()
    try:
        assert await again.log_id() == identity
    finally:
        await again.close()
    async with testpg.fresh_schema() as other:
        elsewhere = PostgresBackend(*other)
        await elsewhere.open()
        try:
            assert await elsewhere.log_id() not in ("", identity)
        finally:
            await elsewhere.close()


async def test_a_change_that_commits_later_is_never_skipped_by_a_reader_in_between(
    schema: tuple[str, str], two: tuple[PostgresBackend, PostgresBackend]
) -> None:
    """The hazard of numbering events as they are written (a sequence): a transaction
    that appended first but commits last would hold a smaller revision than one a reader
    already passed. Here the first writer stays open while another server writes and a
    reader reads, and commits only after: the reader, resuming from the cursor it had,
    gets both, each once, in dense order. The second writer waits for neither the open
    transaction nor its numbering (no row every append must lock to commit)."""
    dsn, name = schema
    a, b = two
    s = sql.Identifier(name)
    async with await psycopg.AsyncConnection.connect(dsn) as slow:  # an open transaction
        await slow.execute(
            sql.SQL("SELECT * FROM {}.lease_acquire_logged('first', 'h', 5000, '')").format(s)
        )
        async with asyncio.timeout(1.5):  # below the backend's own 2 s statement timeout
            assert isinstance(await a.acquire("second", "h", 5000, ""), Grant)
        page = await b.events_after(0, Scope(), 100)
        seen = list(page.events)
        cursor = page.head
        assert [e.revision for e in seen] == list(range(1, cursor + 1))
        await slow.commit()
    for _ in range(200):  # numbered by a's retry, or by this read's own run
        page = await b.events_after(cursor, Scope(), 100)
        assert [e.revision for e in page.events] == list(range(cursor + 1, page.head + 1))
        seen += page.events
        cursor = page.head
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert sorted(_events(tuple(seen))) == [(A, "first"), (A, "second")]
    assert [e.revision for e in seen] == [1, 2]
    assert await a.head_revision() == 2


async def _held_log_row(dsn: str, name: str) -> psycopg.AsyncConnection[Any]:
    """A connection in a transaction holding the log row, as another server's step does
    while it commits."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.execute(
        sql.SQL("SELECT 1 FROM {}.lease_event_log WHERE id = 1 FOR UPDATE").format(
            sql.Identifier(name)
        )
    )
    return conn


async def _numbered(dsn: str, name: str) -> list[tuple[int, str, str]]:
    """The log as the table holds it, and the pending count, read without the backend
    (whose reads would number what is pending first)."""
    s = sql.Identifier(name)
    rows = await _sql(
        dsn, sql.SQL("SELECT revision, kind, resource FROM {}.lease_events ORDER BY 1").format(s)
    )
    pending = await _sql(dsn, sql.SQL("SELECT count(*) FROM {}.lease_events_pending").format(s))
    return [(int(r), k, res) for r, k, res in rows] + [(-1, "pending", str(pending[0][0]))]


async def test_events_a_step_parked_are_numbered_by_its_next_step_without_a_run_of_their_own(
    schema: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that finds the log row taken (two servers on one schema collide on it all
    the time) parks its events and commits. The next step of the process takes the row
    after they committed, so it numbers them, before its own: a sequencer run of their
    own would be one more transaction for nothing. With that run's delay made long,
    only the next step can have numbered them; and no run was started."""
    dsn, name = schema
    monkeypatch.setattr(backend_module, "PARKED_NUMBERING_S", 3600.0)
    backend = PostgresBackend(dsn, name)
    await backend.open()
    runs = 0
    sequence = backend._sequence

    async def counted() -> tuple[int, dict[int, int], bool]:
        nonlocal runs
        runs += 1
        return await sequence()

    monkeypatch.setattr(backend, "_sequence", counted)
    try:
        holder = await _held_log_row(dsn, name)
        granted = await backend.acquire("parked", "h", 5000, "")
        assert isinstance(granted, Grant)
        await holder.rollback()
        await holder.close()
        assert await _numbered(dsn, name) == [(-1, "pending", "1")]
        await backend.release("parked", granted.token, "h")
        assert await _numbered(dsn, name) == [
            (1, "acquired", "parked"),
            (2, "released", "parked"),
            (-1, "pending", "0"),
        ]
        assert runs == 0
    finally:
        await backend.close()


async def test_events_a_step_parked_are_numbered_without_another_step(
    schema: tuple[str, str],
) -> None:
    """The other way: nothing follows the step that parked its events, and no one
    reads; its sequencer run numbers them, once the row is free."""
    dsn, name = schema
    backend = PostgresBackend(dsn, name)
    await backend.open()
    try:
        holder = await _held_log_row(dsn, name)
        assert isinstance(await backend.acquire("alone", "h", 5000, ""), Grant)
        await holder.rollback()
        await holder.close()

        async def numbered() -> bool:
            return await _numbered(dsn, name) == [(1, "acquired", "alone"), (-1, "pending", "0")]

        await eventually(numbered, "the parked ACQUIRED numbered")
    finally:
        await backend.close()
