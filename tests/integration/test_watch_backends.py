"""Watch on the networked lease backends, end to end over gRPC.

- PostgreSQL and one Redis keep one event log for every resource: a guard in watch
  mode following a lease server on them rejects a paused former holder's late write
  after a takeover, while a monotonic guard (the control) accepts it; and a grant
  through another lease server on the same database reaches the follower too
  (NOTIFY / pub/sub, or the feed's poll).
- A Redis Cluster keeps one log per resource: Watch of one resource streams its
  events (expiry included, logged when the stream reads); a prefix is refused with
  UNIMPLEMENTED saying why, so a watch-mode guard cannot follow it and says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2

from fencing import AsyncGuardClient, AsyncLeaseClient, StaleTokenError
from fencing.client._core import EventKind, LeaseEvent
from fencing.v1 import lease_pb2
from guard.fence import FenceMode
from guard.server import start_guard
from lease_server.backends.base import LeaseBackend
from lease_server.backends.redis import RedisBackend
from tests import redis_server
from tests.integration.test_watch_guard import (
    HANG_GUARD,
    eventually,
    fence_reaches,
    follower_of,
    lease_server,
    watch_health,
    watching_guard,
)

Factory = Callable[[], LeaseBackend]


@asynccontextmanager
async def shared_backend(which: str) -> AsyncIterator[Factory]:
    """A factory of backend objects on one private schema or key prefix (one per server)."""
    if which == "postgres":
        from lease_server.backends.postgres import PostgresBackend
        from tests import pg

        async with pg.fresh_schema() as (dsn, schema):
            yield lambda: PostgresBackend(dsn, schema)
        return
    url = (
        redis_server.SERVERS.cluster_url()
        if which == "redis-cluster"
        else redis_server.SERVERS.standalone_url()
    )
    prefix = redis_server.unique_prefix()
    try:
        yield lambda: RedisBackend(url, prefix=prefix)
    finally:
        await redis_server.drop_prefix(url, prefix)


@pytest.fixture(params=["postgres", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    async with shared_backend(request.param) as make:
        yield make


async def test_a_watch_guard_rejects_the_late_write_that_a_monotonic_guard_accepts(
    backend: Factory,
) -> None:
    """The old holder writes, is paused past its ttl (it never renews), a new holder
    takes over and does not write, the old holder resumes and writes."""
    control = await start_guard("memory://", "127.0.0.1:0")  # monotonic
    try:
        async with (
            lease_server(backend()) as ls,
            watching_guard(ls.address) as (_, watch),
            AsyncGuardClient(control.address) as monotonic,
            AsyncLeaseClient(ls.address, holder="old") as old_client,
            AsyncLeaseClient(ls.address, holder="new") as new_client,
        ):
            old = await old_client.acquire("account", ttl=0.3)
            for guard in (watch, monotonic):
                assert await guard.put(old, "balance", b"old: 100") == old.token
            new = await new_client.acquire("account", ttl=5, timeout=HANG_GUARD)
            assert new.token > old.token
            await fence_reaches(watch, "account", new.token)  # the takeover's delivery
            with pytest.raises(StaleTokenError) as stale:
                await watch.put(old, "balance", b"old: 150")
            assert stale.value.current_token == new.token
            record = await watch.read("account", "balance")
            assert record is not None and record.value == b"old: 100"
            # The control: the monotonic guard never saw the new token and lets it in.
            assert await monotonic.put(old, "balance", b"old: 150") == old.token
            record = await monotonic.read("account", "balance")
            assert record is not None and record.written_by_token == old.token
    finally:
        await control.stop(0)


async def test_a_grant_through_another_server_reaches_the_follower(backend: Factory) -> None:
    async with (
        lease_server(backend()) as followed,
        lease_server(backend()) as other,
        watching_guard(followed.address) as (server, guard),
        AsyncLeaseClient(other.address, holder="b") as leases,
    ):
        lease = await leases.acquire("r", ttl=5)
        await fence_reaches(guard, "r", lease.token)
        await lease.release()
        await fence_reaches(guard, "r", lease.token + 1)
        short = await leases.acquire("s", ttl=0.2)  # expires: either server's sweeper logs it
        await fence_reaches(guard, "s", short.token + 1)
        assert follower_of(server).status.resyncs == 0


# -- Redis Cluster: one log per resource ---------------------------------------------------


@pytest.fixture
async def cluster() -> AsyncIterator[Factory]:
    async with shared_backend("redis-cluster") as make:
        yield make


async def next_events(stream: AsyncIterator[LeaseEvent], n: int) -> list[LeaseEvent]:
    return [await anext(stream) for _ in range(n)]


@pytest.mark.redis
async def test_on_a_cluster_watch_streams_one_resource(cluster: Factory) -> None:
    async with (
        lease_server(cluster()) as ls,
        lease_server(cluster()) as other,
        AsyncLeaseClient(ls.address, holder="a") as leases,
        AsyncLeaseClient(other.address, holder="b") as elsewhere,
    ):
        assert ls.service.events is None and ls.service.resource_events is not None
        warm = await leases.acquire("r", ttl=5)
        await warm.release()  # revisions 1 and 2 of r's own log
        # A cursor, not "from now": the stream opens at its first read, maybe after the
        # acquire below, and must not miss it.
        stream = leases.watch("r", after_revision=2)
        first = await leases.acquire("r", ttl=0.3)  # never renewed: expires
        await leases.acquire("unwatched", ttl=5)
        events = await next_events(stream, 2)
        # The expiry is logged by the stream's own periodic read of the resource's log.
        assert [(e.kind, e.token, e.revision) for e in events] == [
            (EventKind.ACQUIRED, first.token, 3),
            (EventKind.EXPIRED, first.token, 4),
        ]
        second = await elsewhere.acquire("r", ttl=5)  # another server's append
        await second.release()
        events = await next_events(stream, 2)
        assert [(e.kind, e.token, e.revision) for e in events] == [
            (EventKind.ACQUIRED, second.token, 5),
            (EventKind.RELEASED, second.token, 6),
        ]
        await stream.aclose()
        # Resuming from a revision of that resource's log misses nothing.
        resumed = leases.watch("r", after_revision=4)
        assert [e.revision for e in await next_events(resumed, 2)] == [5, 6]
        await resumed.aclose()


@pytest.mark.redis
async def test_on_a_cluster_a_prefix_watch_is_refused_and_a_watch_guard_says_why(
    cluster: Factory,
) -> None:
    async with lease_server(cluster()) as ls, AsyncLeaseClient(ls.address) as leases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in leases._stub.Watch(lease_pb2.WatchRequest(prefix="jobs/")):
                pass
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "one event log per resource" in (err.value.details() or "")
        guard = await start_guard(
            "memory://", "127.0.0.1:0", mode=FenceMode.WATCH, lease_server=ls.address
        )
        try:

            async def says_why() -> bool:
                return "one event log per resource" in follower_of(guard).status.last_error

            await eventually(says_why, "the follower reports why it cannot follow")
            assert not follower_of(guard).status.following
            assert await watch_health(guard.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await guard.stop(0)
