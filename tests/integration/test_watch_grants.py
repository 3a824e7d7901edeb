"""A watch guard refuses tokens nobody was granted, and still admits a fresh grant.

A token above the highest the guard has seen granted for a resource is either a grant
whose event is still in delivery or a token nobody was granted: the guard asks its
lease server (``Describe(resource).last_token``) before it admits it, and refuses one
above the lease server's counter with ``LEASE_LOST``, so one bad client cannot raise a
fence to 2**63 - 1 and wedge the resource for every real holder. The control is
``monotonic`` mode, which cannot know and accepts it (a documented limit).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fencing import AsyncGuardClient, AsyncLeaseClient, Claim, LeaseLost, Put, StaleTokenError
from fencing.limits import MAX_TOKEN
from guard.fence import FenceMode
from guard.server import start_guard
from tests import pg
from tests.integration.test_watch_guard import (
    HANG_GUARD,
    events_of,
    fence_reaches,
    follower_of,
    lease_server,
    watching_guard,
)

WEDGE = MAX_TOKEN  # 2**63 - 1: the largest token the wire accepts


async def test_watch_refuses_a_token_nobody_was_granted(tmp_path: Path) -> None:
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        watching_guard(ls.address) as (_, guard),
        AsyncLeaseClient(ls.address, holder="real") as leases,
    ):
        lease = await leases.acquire("r", ttl=30)
        await fence_reaches(guard, "r", lease.token)
        with pytest.raises(LeaseLost) as err:
            await guard.put(Claim("r", WEDGE), "k", b"wedge")
        assert "never granted" in str(err.value) and err.value.token == WEDGE
        with pytest.raises(LeaseLost):
            await guard.fence(Claim("r", WEDGE))
        with pytest.raises(LeaseLost):
            await guard.write_many([(Claim("r", WEDGE), Put("k", b"wedge"))])
        async with guard.stream() as stream:
            with pytest.raises(LeaseLost):
                await stream.write(Claim("r", WEDGE), Put("k", b"wedge"))
        # A resource nobody ever leased cannot be wedged either.
        with pytest.raises(LeaseLost):
            await guard.put(Claim("never-leased", WEDGE), "k", b"wedge")
        assert await guard.describe_fence("never-leased") == 0
        # The fence did not move: the real holder goes on writing.
        assert await guard.describe_fence("r") == lease.token
        assert await guard.put(lease, "k", b"mine") == lease.token
        assert (await guard.read("r", "k")).value == b"mine"  # type: ignore[union-attr]


async def test_control_monotonic_accepts_it_and_the_resource_is_wedged(tmp_path: Path) -> None:
    """What monotonic alone cannot know: the documented limit the watch rule closes."""
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        AsyncLeaseClient(ls.address, holder="real") as leases,
    ):
        server = await start_guard("memory://", "127.0.0.1:0", mode=FenceMode.MONOTONIC)
        try:
            async with AsyncGuardClient(server.address) as guard:
                lease = await leases.acquire("r", ttl=30)
                assert await guard.put(Claim("r", WEDGE), "k", b"wedge") == WEDGE
                with pytest.raises(StaleTokenError):
                    await guard.put(lease, "k", b"mine")  # every real holder, forever
        finally:
            await server.stop(0)


@pytest.mark.postgres
async def test_a_fresh_grant_whose_event_is_still_in_delivery_is_accepted(
    tmp_path: Path,
) -> None:
    """The follower is held up applying an earlier event (another writer holds that
    fence row's lock), so the grant of ``r`` is in the log but not at the guard yet:
    the new holder's first write is admitted on the lease server's word."""
    import psycopg
    from psycopg import sql

    from guard.stores.postgres import PostgresStore

    async with pg.fresh_schema() as (dsn, schema):
        store = PostgresStore(dsn, schema)
        async with (
            lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
            AsyncLeaseClient(ls.address, holder="h") as leases,
        ):
            server = await start_guard(
                store, "127.0.0.1:0", mode=FenceMode.WATCH, lease_server=ls.address
            )
            try:
                await asyncio.wait_for(follower_of(server).wait_following(), HANG_GUARD)
                async with AsyncGuardClient(server.address) as guard:
                    first = await leases.acquire("q", ttl=30)
                    await fence_reaches(guard, "q", first.token)
                    async with await psycopg.AsyncConnection.connect(dsn) as conn:
                        await conn.execute(
                            sql.SQL(
                                "SELECT fence FROM {}.fences WHERE resource = 'q' FOR UPDATE"
                            ).format(sql.Identifier(schema))
                        )
                        await first.release()  # the follower blocks on q's row
                        fresh = await leases.acquire("r", ttl=30)
                        granted_at = await events_of(ls).head_revision()
                        assert await guard.put(fresh, "k", b"first") == fresh.token
                        assert follower_of(server).status.revision < granted_at  # not seen
                        await conn.rollback()
                    await fence_reaches(guard, "q", first.token + 1)  # it catches up
            finally:
                await server.stop(0)
