"""Watch guards sharing one store keep their own resume cursors, on every guard store.

Two guards follow one lease server on different prefixes and keep their fences in one
store. The guard of ``a/`` is down while ``a/x`` changes hands, and the guard of ``b/``
follows ``b/`` events meanwhile. When ``a/``'s guard comes back it must resume from
*its own* cursor, see the takeover and reject the paused former holder. The control
keys every cursor under one name (the old path), so the restarted guard resumes at the
other guard's cursor, past its own takeover, and accepts the late write.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import cast

import pytest

from fencing import AsyncGuardClient, AsyncLeaseClient, StaleTokenError
from fencing.types import Record
from guard import follower as follower_module
from guard.fence import FenceMode
from guard.server import GuardServer, start_guard
from guard.stores.base import GuardStore
from guard.stores.memory import MemoryStore
from guard.stores.sqlite import SQLiteStore
from tests import pg, redis_server
from tests.integration.test_watch_guard import (
    HANG_GUARD,
    events_of,
    eventually,
    fence_reaches,
    follower_of,
    lease_server,
)

STORES = ["memory", "sqlite", "postgres", "redis"]


class Unclosed:
    """One in-memory store shared by two guards: a guard's stop must not close it."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.name = inner.name
        self.supports_strict = inner.supports_strict
        self.commit_concurrency = inner.commit_concurrency

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@asynccontextmanager
async def shared_storage(kind: str, tmp_path: Path) -> AsyncIterator[Callable[[], GuardStore]]:
    """A factory of store objects (one per guard process) over one storage."""
    if kind == "memory":
        memory = MemoryStore()
        yield lambda: cast(GuardStore, Unclosed(memory))
    elif kind == "sqlite":
        yield lambda: SQLiteStore(tmp_path / "guard.db")
    elif kind == "postgres":
        from guard.stores.postgres import PostgresStore

        async with pg.fresh_schema() as (dsn, schema):
            yield lambda: PostgresStore(dsn, schema)
    else:
        from guard.stores.redis import RedisStore

        url = redis_server.SERVERS.standalone_url()
        prefix = redis_server.unique_prefix()
        try:
            yield lambda: RedisStore(url, prefix=prefix)
        finally:
            await redis_server.drop_prefix(url, prefix)


async def watching(store: GuardStore, lease_address: str, prefix: str) -> GuardServer:
    guard = await start_guard(
        store, "127.0.0.1:0", mode=FenceMode.WATCH, lease_server=lease_address, watch_prefix=prefix
    )
    await asyncio.wait_for(follower_of(guard).wait_following(), HANG_GUARD)
    return guard


async def late_write_after_restart(kind: str, tmp_path: Path) -> tuple[int, int, Record | None]:
    """Run the scenario; return the new holder's token, the fence of ``a/x`` and what its
    key holds at the end (the new holder never writes)."""
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        shared_storage(kind, tmp_path) as open_store,
        AsyncLeaseClient(ls.address, holder="old") as old_client,
        AsyncLeaseClient(ls.address, holder="new") as new_client,
    ):
        guard_a = await watching(open_store(), ls.address, "a/")
        guard_b = await watching(open_store(), ls.address, "b/")
        async with AsyncGuardClient(guard_a.address) as a:
            old = await old_client.acquire("a/x", ttl=0.3)  # never renewed: it will expire
            await fence_reaches(a, "a/x", old.token)
        await guard_a.stop(0.5)  # its cursor is stored on stop

        # While a/'s guard is down, a/x changes hands: the old holder is paused, its lease
        # expires, and the new holder takes over (EXPIRED, ACQUIRED in the log).
        new = await new_client.acquire("a/x", ttl=30, timeout=HANG_GUARD)
        takeover = await events_of(ls).head_revision()
        # Meanwhile b/'s guard follows its own prefix past the takeover, and stores that.
        other = await new_client.acquire("b/y", ttl=30)

        async def b_followed() -> bool:
            return follower_of(guard_b).status.revision > takeover

        await eventually(b_followed, "b/'s guard follows past the takeover")
        async with AsyncGuardClient(guard_b.address) as b:
            await fence_reaches(b, "b/y", other.token)
        await guard_b.stop(0.5)

        guard_a = await watching(open_store(), ls.address, "a/")  # a/'s guard restarts
        try:

            async def a_caught_up() -> bool:
                return follower_of(guard_a).status.revision >= takeover

            await eventually(a_caught_up, "a/'s restarted guard resumes past the takeover")
            async with AsyncGuardClient(guard_a.address) as a:
                # The paused former holder wakes up and writes (the new holder never did).
                with suppress(StaleTokenError):
                    await a.put(old, "k", b"late")
                fence = await a.describe_fence("a/x")
                found = await guard_a.store.read("a/x", "k")
            assert new.token > old.token
            return new.token, fence, found
        finally:
            await guard_a.stop(0.5)


@pytest.mark.parametrize("kind", STORES)
async def test_a_restarted_watch_guard_resumes_from_its_own_cursor(
    kind: str, tmp_path: Path
) -> None:
    new_token, fence, found = await late_write_after_restart(kind, tmp_path)
    assert found is None, "the paused former holder's late write was applied"
    assert fence == new_token  # the takeover it missed while down was applied on resume


@pytest.mark.parametrize("kind", STORES)
async def test_control_one_shared_cursor_lets_the_late_write_through(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old path: every guard on the store keeps its cursor under one name."""
    monkeypatch.setattr(
        follower_module, "cursor_resource", lambda log_id, prefix: follower_module.SHARED_CURSOR
    )
    new_token, fence, found = await late_write_after_restart(kind, tmp_path)
    assert found is not None and found.value == b"late", "the control must show the damage"
    assert fence < new_token  # the restarted guard never saw its own takeover


async def test_a_lease_server_that_now_keeps_another_log_is_met_with_resync(
    tmp_path: Path,
) -> None:
    """The follower's cursor is revision 2 of the first file's log; the server comes back
    on the same address with another file whose log is past 2: the follower must hear
    RESYNC (and re-read what it fenced), not resume at revision 2 of the wrong log."""
    from lease_server.server import start_lease_server

    first = await start_lease_server(f"sqlite:{tmp_path / 'one.db'}", "127.0.0.1:0")
    address = first.address
    first_log = await events_of(first).log_id()
    guard = await watching(MemoryStore(), address, "")
    try:
        async with AsyncLeaseClient(address) as leases, AsyncGuardClient(guard.address) as g:
            held = await leases.acquire("r", ttl=30)
            await leases.acquire("q", ttl=30)
            await fence_reaches(g, "r", held.token)
        assert follower_of(guard).log_id == first_log
        await first.stop(0)
        async with lease_server(f"sqlite:{tmp_path / 'two.db'}") as other:
            async with AsyncLeaseClient(other.address) as leases:
                for name in ("s", "t", "r"):  # revisions 1..3 of the other log
                    await leases.acquire(name, ttl=30)
            await other.stop(0)
        async with lease_server(f"sqlite:{tmp_path / 'two.db'}", address) as back:

            async def resynced() -> bool:
                return follower_of(guard).status.resyncs == 1

            await eventually(resynced, "the follower hears RESYNC")
            assert follower_of(guard).log_id == await events_of(back).log_id() != first_log
    finally:
        await guard.stop(0.5)


async def test_a_store_of_an_older_guard_is_resumed_from_its_shared_cursor_once(
    tmp_path: Path,
) -> None:
    """Upgrading: the store holds only the one cursor older guards kept per store. A
    guard with no cursor of its own resumes from it (never later than "from now")."""
    store = MemoryStore()
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        AsyncLeaseClient(ls.address) as leases,
    ):
        before = await leases.acquire("r", ttl=30)  # revision 1
        missed = await leases.acquire("s", ttl=30)  # revision 2, while no guard followed
        await store.fence(follower_module.SHARED_CURSOR, 1)  # as an older guard left it
        guard = await watching(cast(GuardStore, Unclosed(store)), ls.address, "")
        try:
            async with AsyncGuardClient(guard.address) as g:
                await fence_reaches(g, "s", missed.token)
                assert await g.describe_fence("r") == 0 < before.token  # behind the cursor
        finally:
            await guard.stop(0.5)  # stores its own cursor; the shared one is left alone
        own = follower_module.cursor_resource(await events_of(ls).log_id(), "")
        assert await store.describe_fence(own) == 2
