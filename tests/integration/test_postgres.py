"""PostgreSQL beyond the contract suites: migrations, races, timeouts, wake-ups, strict mode,
and fencing inside your own transactions."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo

from fencing import GuardClient, LeaseClient
from fencing.errors import (
    BackendUnavailableError,
    LeaseLost,
    StaleTokenError,
)
from fencing.testing import running_servers
from fencing.types import Put, Record
from guard.fence import FenceMode, admit, advance
from guard.server import start_guard
from guard.stores.postgres import PostgresStore
from lease_server.backends.postgres import PostgresBackend
from lease_server.leases import Grant, Held
from serving import postgres_db
from serving.ports import free_port
from tests import pg as testpg

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[tuple[str, str]]:
    """``(dsn, schema)``: a fresh schema name, dropped after the test."""
    async with testpg.fresh_schema() as pair:
        yield pair


@pytest.fixture
def schema_url() -> Iterator[str]:
    """A fresh schema as a ``?schema=`` URL, for servers built from URLs; dropped after."""
    with testpg.fresh_schema_url() as url:
        yield url


@pytest.fixture
async def backend(schema: tuple[str, str]) -> AsyncIterator[PostgresBackend]:
    b = PostgresBackend(*schema)
    await b.open()
    yield b
    await b.close()


@pytest.fixture
async def store(schema: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(*schema)
    await s.open()
    yield s
    await s.close()


async def _query(dsn: str, query: sql.Composed) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query)
        return await cur.fetchall()


# -- URLs and migrations ---------------------------------------------------------------------


async def test_migrate_is_idempotent_and_safe_to_race(schema: tuple[str, str]) -> None:
    dsn, name = schema
    results = await asyncio.gather(*(postgres_db.migrate(dsn, name) for _ in range(4)))
    everything = [m.version for m in postgres_db.migrations()]
    assert sorted(map(tuple, results)) == [(), (), (), tuple(everything)]
    assert await postgres_db.migrate(testpg.with_schema(dsn, name)) == []
    rows = await _query(
        dsn,
        sql.SQL("SELECT version, name FROM {}.schema_migrations ORDER BY version").format(
            sql.Identifier(name)
        ),
    )
    assert [(v, n) for v, n in rows] == [(m.version, m.name) for m in postgres_db.migrations()]


async def test_servers_need_no_ddl_rights_once_migrated(schema: tuple[str, str]) -> None:
    """After an owner ran ``migrate``, a role that cannot create schemas can serve."""
    dsn, name = schema
    role = f"fencing_app_{secrets.token_hex(4)}"
    s, r = sql.Identifier(name), sql.Identifier(role)
    await postgres_db.migrate(dsn, name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(r))
        try:
            await admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r))
            await admin.execute(
                sql.SQL(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}"
                ).format(s, r)
            )
            backend = PostgresBackend(make_conninfo(dsn, user=role), name)
            await backend.open()
            try:
                assert isinstance(await backend.acquire("r", "a", 1000, ""), Grant)
            finally:
                await backend.close()
        finally:
            await admin.execute(sql.SQL("DROP OWNED BY {}").format(r))
            await admin.execute(sql.SQL("DROP ROLE {}").format(r))


# -- races and bounds ------------------------------------------------------------------------


async def test_first_acquire_races_across_servers_grant_exactly_once(
    schema: tuple[str, str],
) -> None:
    servers = [PostgresBackend(*schema) for _ in range(2)]
    for b in servers:
        await b.open()
    try:
        outcomes = await asyncio.gather(
            *(servers[i % 2].acquire("new", f"h{i}", 10_000, "") for i in range(16))
        )
    finally:
        for b in servers:
            await b.close()
    grants = [o for o in outcomes if isinstance(o, Grant)]
    assert len(grants) == 1 and grants[0].token == 1
    assert all(isinstance(o, Held) and o.token == 1 for o in outcomes if o is not grants[0])


async def test_concurrent_first_writes_and_retries_apply_once(store: PostgresStore) -> None:
    results = await asyncio.gather(
        *(store.write("fresh", 3, [Put("k", b"v")], idempotency_key="once") for _ in range(12))
    )
    assert sum(not r.replayed for r in results) == 1
    assert {r.fence for r in results} == {3}
    assert await store.read("fresh", "k") == Record(b"v", 3)


async def test_a_blocked_call_fails_within_its_timeout(schema: tuple[str, str]) -> None:
    """A call stuck on a lock (or a dead server) ends as BACKEND_UNAVAILABLE, never hangs."""
    dsn, name = schema
    store = PostgresStore(testpg.with_schema(dsn, name) + "&timeout=0.5")
    await store.open()
    try:
        await store.write("r", 1, [Put("k", b"v")])
        async with await psycopg.AsyncConnection.connect(dsn) as blocker:
            await blocker.execute(
                sql.SQL("SELECT * FROM {}.fences WHERE resource = 'r' FOR UPDATE").format(
                    sql.Identifier(name)
                )
            )
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError):
                await store.write("r", 2, [Put("k", b"late")])
            assert time.monotonic() - started < 5  # a hang guard, not a timing claim
            await blocker.rollback()
        assert await store.read("r", "k") == Record(b"v", 1)
    finally:
        await store.close()


async def test_an_unreachable_database_is_backend_unavailable() -> None:
    backend = PostgresBackend(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    with pytest.raises(BackendUnavailableError):
        await backend.open()
    with pytest.raises(BackendUnavailableError):
        await backend.describe("r")


async def test_a_fault_is_not_dressed_up_as_an_outage(
    schema: tuple[str, str], backend: PostgresBackend
) -> None:
    """A bug (here: the schema's function is gone) propagates as itself, not as retryable."""
    dsn, name = schema
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("DROP FUNCTION {}.lease_describe").format(sql.Identifier(name)))
    with pytest.raises(psycopg.errors.UndefinedFunction):
        await backend.describe("r")
    assert postgres_db.driver_error(psycopg.OperationalError("down"), "x") is not None
    assert postgres_db.driver_error(psycopg.errors.UndefinedFunction("bug"), "x") is None


# -- wake-ups --------------------------------------------------------------------------------


async def test_a_release_through_another_server_wakes_listeners(
    schema: tuple[str, str],
) -> None:
    listener, releaser = PostgresBackend(*schema), PostgresBackend(*schema)
    await listener.open()
    await releaser.open()
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener.on_release(woken.put_nowait)
    try:
        first = await _listener_pid(schema)
        grant = await releaser.acquire("job", "a", 10_000, "")
        assert isinstance(grant, Grant)
        await releaser.release("job", grant.token, "a")
        assert await asyncio.wait_for(woken.get(), 5) == "job"

        # Kill the LISTEN connection: it comes back by itself and delivers again.
        await _query(
            schema[0], sql.SQL("SELECT pg_terminate_backend({})").format(sql.Literal(first))
        )
        assert await _listener_pid(schema, other_than=first) != first
        grant = await releaser.acquire("job", "a", 10_000, "")
        assert isinstance(grant, Grant)
        await releaser.release("job", grant.token, "a")
        assert await asyncio.wait_for(woken.get(), 5) == "job"
    finally:
        await listener.close()
        await releaser.close()


async def _listener_pid(schema: tuple[str, str], other_than: int = 0) -> int:
    """The pid of the backend's LISTEN connection once it is idle (listening: its last
    statement LISTENed on the release or, after it, the event channel)."""
    query = sql.SQL(
        "SELECT pid FROM pg_stat_activity WHERE query IN ({}, {}) AND state = 'idle' AND pid <> %s"
    ).format(
        sql.Literal(f'LISTEN "fencing_released:{schema[1]}"'),
        sql.Literal(f'LISTEN "fencing_events:{schema[1]}"'),
    )
    for _ in range(200):
        async with await psycopg.AsyncConnection.connect(schema[0], autocommit=True) as conn:
            rows = await (await conn.execute(query, (other_than,))).fetchall()
        if rows:
            return int(rows[0][0])
        await asyncio.sleep(0.05)
    raise AssertionError("the listener did not (re)connect")


# -- strict mode (G5) ------------------------------------------------------------------------


async def test_strict_rejects_an_expired_lease_that_monotonic_accepts(
    backend: PostgresBackend, store: PostgresStore
) -> None:
    grant = await backend.acquire("acct", "a", 300, "")
    assert isinstance(grant, Grant)
    ok = await store.write("acct", grant.token, [Put("k", b"live")], mode=FenceMode.STRICT)
    assert ok.fence == grant.token
    await asyncio.sleep(0.4)  # the lease expires; nobody takes it over
    assert not (await backend.describe("acct")).held
    # Not below the fence, but dead: LEASE_LOST (nobody newer owns it), not STALE_TOKEN.
    with pytest.raises(LeaseLost, match="not the live lease") as refused:
        await store.write("acct", grant.token, [Put("k", b"late")], mode=FenceMode.STRICT)
    assert refused.value.resource == "acct" and refused.value.token == grant.token
    assert await store.read("acct", "k") == Record(b"live", grant.token)
    # The control: the same write under monotonic mode is accepted (token == fence).
    control = await store.write("acct", grant.token, [Put("k", b"late")])
    assert control.fence == grant.token
    assert await store.read("acct", "k") == Record(b"late", grant.token)


def test_a_strict_guard_over_grpc_refuses_an_expired_lease(schema_url: str) -> None:
    """End to end: the strict guard refuses (LEASE_LOST, "not the live lease"); a monotonic
    guard on the same schema, the control, accepts the same write."""
    backend, store = PostgresBackend(schema_url), PostgresStore(schema_url)
    with running_servers(backend, store, mode=FenceMode.STRICT) as servers:
        control = servers.call(start_guard(PostgresStore(schema_url), "127.0.0.1:0"))
        try:
            with (
                LeaseClient(servers.lease_address, holder="a") as leases,
                GuardClient(servers.guard_address) as strict,
                GuardClient(control.address) as monotonic,
            ):
                lease = leases.acquire("acct", ttl=0.3)
                assert strict.put(lease, "k", b"live") == lease.token
                time.sleep(0.4)  # expired; nobody takes it over
                with pytest.raises(LeaseLost, match="not the live lease"):
                    strict.put(lease, "k", b"late")
                assert strict.read("acct", "k") == Record(b"live", lease.token)
                assert monotonic.put(lease, "k", b"late") == lease.token
                assert strict.read("acct", "k") == Record(b"late", lease.token)
        finally:
            servers.call(control.stop(0))


async def test_strict_after_a_takeover(backend: PostgresBackend, store: PostgresStore) -> None:
    old = await backend.acquire("r", "a", 200, "")
    await asyncio.sleep(0.3)
    new = await backend.acquire("r", "b", 10_000, "")
    assert isinstance(old, Grant) and isinstance(new, Grant) and new.token > old.token
    # The new holder has not written yet: the old token is not below the fence, but dead.
    with pytest.raises(LeaseLost, match="not the live lease"):
        await store.write("r", old.token, [Put("k", b"zombie")], mode=FenceMode.STRICT)
    await store.write("r", new.token, [Put("k", b"new")], mode=FenceMode.STRICT)
    with pytest.raises(StaleTokenError, match="fence is") as stale:
        await store.write("r", old.token, [Put("k", b"zombie")], mode=FenceMode.STRICT)
    assert stale.value.current_token == new.token
    # A released lease is not live either.
    await backend.release("r", new.token, "b")
    with pytest.raises(LeaseLost, match="not the live lease"):
        await store.write("r", new.token, [Put("k", b"after")], mode=FenceMode.STRICT)
    assert await store.read("r", "k") == Record(b"new", new.token)


async def test_a_strict_write_holds_a_takeover_back_until_it_commits(
    schema: tuple[str, str], backend: PostgresBackend
) -> None:
    """The lease row is share-locked by the strict check: no grant can slip in before commit."""
    dsn, name = schema
    grant = await backend.acquire("r", "a", 200, "")
    assert isinstance(grant, Grant)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(
            sql.SQL("SELECT {}.check_live_lease('r', %s)").format(sql.Identifier(name)),
            (grant.token,),
        )
        await asyncio.sleep(0.3)  # expired by now, but our transaction is still open
        takeover = asyncio.create_task(backend.acquire("r", "b", 10_000, ""))
        await asyncio.sleep(0.3)
        assert not takeover.done()
        await conn.commit()
    new = await asyncio.wait_for(takeover, 5)
    assert isinstance(new, Grant) and new.token == grant.token + 1


# -- fencing inside your own transactions ----------------------------------------------------


async def test_user_transactions_fence_their_own_writes(
    schema: tuple[str, str], store: PostgresStore
) -> None:
    dsn, name = schema
    s = sql.Identifier(name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE TABLE {}.orders (id int, token bigint)").format(s))

    async def fenced_insert(order: int, token: int) -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            # Insert first, check second: a stale check must roll the insert back.
            await conn.execute(
                sql.SQL("INSERT INTO {}.orders VALUES (%s, %s)").format(s), (order, token)
            )
            await conn.execute(
                sql.SQL("SELECT {}.check_and_advance('orders', %s)").format(s), (token,)
            )
            await conn.commit()

    await fenced_insert(1, 5)
    await fenced_insert(2, 5)  # equal tokens pass: one holder writes many times
    with pytest.raises(psycopg.Error) as raised:
        await fenced_insert(3, 4)
    assert raised.value.sqlstate == postgres_db.STALE_TOKEN_SQLSTATE
    error = postgres_db.fencing_error(raised.value)
    assert isinstance(error, StaleTokenError)
    assert (error.resource, error.token, error.current_token) == ("orders", 4, 5)
    # The guard and your transactions share one fence per resource.
    await store.write("orders", 7, [Put("k", b"v")])
    with pytest.raises(psycopg.Error):
        await fenced_insert(4, 6)
    assert await store.describe_fence("orders") == 7
    rows = await _query(dsn, sql.SQL("SELECT id, token FROM {}.orders ORDER BY id").format(s))
    assert rows == [(1, 5), (2, 5)]


async def test_check_live_lease_needs_the_current_unexpired_lease(
    schema: tuple[str, str], backend: PostgresBackend
) -> None:
    dsn, name = schema
    check = sql.SQL("SELECT {}.check_live_lease(%s, %s)").format(sql.Identifier(name))
    grant = await backend.acquire("job", "w", 300, "")
    assert isinstance(grant, Grant)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(check, ("job", grant.token))
        assert await cur.fetchone() == (grant.token,)
        await asyncio.sleep(0.4)
        with pytest.raises(psycopg.Error) as raised:
            await conn.execute(check, ("job", grant.token))
        assert raised.value.sqlstate == postgres_db.LEASE_NOT_LIVE_SQLSTATE
        error = postgres_db.fencing_error(raised.value)
        # Not below the fence but not live: LeaseLost, told apart from a stale token.
        assert isinstance(error, LeaseLost) and "not the live lease" in str(error)
        assert (error.resource, error.token) == ("job", grant.token)
        with pytest.raises(psycopg.Error) as unknown:
            await conn.execute(check, ("never-leased", 1))
        assert unknown.value.sqlstate == postgres_db.LEASE_NOT_LIVE_SQLSTATE
    assert postgres_db.fencing_error(ValueError("not ours")) is None


async def test_prune_deletes_in_batches(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import guard.stores.postgres as module

    monkeypatch.setattr(module, "PRUNE_BATCH", 3)
    for i in range(7):
        await store.write("r", 1, [Put("k", b"v")], idempotency_key=f"key-{i}")
    assert await store.prune_idempotency(time.time_ns() // 1_000_000 + 1000) == 7
    assert not (await store.write("r", 1, [Put("k", b"v")], idempotency_key="key-0")).replayed


async def test_bench_direct_write_measures_something() -> None:
    """bench/postgres.py stays runnable (a smoke test, no figures asserted)."""
    from bench.postgres import direct_write

    dsn = testpg.test_dsn()
    for batch in (False, True):
        figures = await direct_write(dsn, 2, 0.2, batch=batch)
        assert figures["ops_per_s"] > 0 and figures["concurrency"] == 2


STEPS = st.lists(
    st.tuples(st.sampled_from(["monotonic", "off", "fence"]), st.integers(1, 6)),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
async def test_the_sql_fence_rule_is_the_pure_rule(
    store: PostgresStore, steps: list[tuple[str, int]]
) -> None:
    """guard_write and check_and_advance decide exactly as guard.fence.admit/advance do."""
    resource, fence = f"prop-{secrets.token_hex(4)}", 0
    for kind, token in steps:
        try:
            if kind == "fence":
                expected = advance(resource, token, fence)
            else:
                expected = admit(resource, token, fence, FenceMode(kind))
        except StaleTokenError:
            with pytest.raises(StaleTokenError) as stale:
                if kind == "fence":
                    await store.fence(resource, token)
                else:
                    await store.write(resource, token, [Put("k", b"v")], mode=FenceMode(kind))
            assert stale.value.current_token == fence
            continue
        if kind == "fence":
            assert await store.fence(resource, token) == expected
        else:
            result = await store.write(resource, token, [Put("k", b"v")], mode=FenceMode(kind))
            assert result.fence == expected
            assert await store.read(resource, "k") == Record(b"v", token)
        fence = expected
        assert await store.describe_fence(resource) == fence


# -- pooled sessions the server closed ---------------------------------------------------------


async def _terminate(dsn: str, application_name: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (application_name,),
        )
        row = await cur.fetchone()
    await asyncio.sleep(0.2)  # their FATAL and EOF reach our sockets
    return int(row[0]) if row else 0


@pytest.mark.parametrize("checked", [True, False], ids=["quiet-check", "control-no-check"])
async def test_sessions_the_server_closed_are_replaced_without_failing_a_call(
    schema: tuple[str, str], monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """pg_terminate_backend of every pooled session (what a restart does to them): the
    next calls get fresh connections and succeed, with no round trip spent checking a
    connection before each call. The control takes the check away: a call then fails."""
    dsn, name = schema
    if not checked:

        async def unchecked(conn: object) -> None:
            pass

        monkeypatch.setattr(postgres_db, "quiet_check", unchecked)
    app = f"fencing_test_{secrets.token_hex(4)}"
    backend = PostgresBackend(make_conninfo(dsn, application_name=app), name)
    await backend.open()
    try:
        await asyncio.gather(*(backend.describe(f"r{i}") for i in range(8)))  # fill the pool
        assert await _terminate(dsn, app) >= 2
        if checked:
            for i in range(3):
                assert isinstance(await backend.acquire(f"a{i}", "h", 5000, ""), Grant)
            await asyncio.gather(*(backend.describe(f"r{i}") for i in range(8)))
        else:
            with pytest.raises(BackendUnavailableError):
                for i in range(8):
                    await backend.describe(f"r{i}")
    finally:
        await backend.close()
