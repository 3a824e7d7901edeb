"""The watch-mode guard against real lease servers: it fences by itself, survives restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencing import (
    AsyncGuardClient,
    AsyncLeaseClient,
    BackendUnavailableError,
    Claim,
    StaleTokenError,
)
from fencing.v1 import lease_pb2
from guard.fence import FenceMode
from guard.follower import HEALTH_SERVICE, LeaseFollower
from guard.server import GuardServer, start_guard
from lease_server.backends.base import EventLog, LeaseBackend
from lease_server.server import LeaseServer, start_lease_server

HANG_GUARD = 30.0  # seconds: generous bounds on waits that a bug would make endless


def events_of(server: LeaseServer) -> EventLog:
    """The event log behind a lease server (the embedded backends all keep one)."""
    assert server.service.events is not None
    return server.service.events


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds; fail only after the hang guard."""
    async with asyncio.timeout(HANG_GUARD):
        while not await check():  # noqa: ASYNC110 - polling state owned by a server
            await asyncio.sleep(0.02)
    assert await check(), what


async def fence_reaches(guard: AsyncGuardClient, resource: str, fence: int) -> None:
    async def check() -> bool:
        return await guard.describe_fence(resource) >= fence

    await eventually(check, f"fence of {resource} reaches {fence}")


def follower_of(server: GuardServer) -> LeaseFollower:
    assert server.follower is not None
    return server.follower


async def watch_health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=HEALTH_SERVICE))
        return int(reply.status)


@asynccontextmanager
async def watching_guard(
    lease_address: str, store: str = "memory://"
) -> AsyncIterator[tuple[GuardServer, AsyncGuardClient]]:
    guard = await start_guard(
        store, "127.0.0.1:0", mode=FenceMode.WATCH, lease_server=lease_address
    )
    try:
        async with AsyncGuardClient(guard.address) as client:
            await asyncio.wait_for(follower_of(guard).wait_following(), HANG_GUARD)
            yield guard, client
    finally:
        await guard.stop(0.5)


@asynccontextmanager
async def lease_server(
    url: str | LeaseBackend, address: str = "127.0.0.1:0"
) -> AsyncIterator[LeaseServer]:
    server = await start_lease_server(url, address)
    try:
        yield server
    finally:
        await server.stop(0.5)


async def test_fences_follow_grants_releases_and_expiries(tmp_path: Path) -> None:
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        watching_guard(ls.address) as (server, guard),
        AsyncLeaseClient(ls.address, holder="a") as leases,
    ):
        assert await watch_health(server.address) == health_pb2.HealthCheckResponse.SERVING
        lease = await leases.acquire("r", ttl=5)
        await fence_reaches(guard, "r", lease.token)  # at the grant, before any write
        await lease.release()
        await fence_reaches(guard, "r", lease.token + 1)  # past the released token
        with pytest.raises(StaleTokenError):
            await guard.put(lease, "k", b"late")
        short = await leases.acquire("s", ttl=0.2)  # never renewed: expires
        await fence_reaches(guard, "s", short.token + 1)
        with pytest.raises(StaleTokenError):
            await guard.put(short, "k", b"late")
        # The next holder's token is admitted: fencing past t never blocks t + 1.
        successor = await leases.acquire("s", ttl=5)
        assert await guard.put(successor, "k", b"mine") == successor.token


async def test_disconnected_guard_says_so_and_keeps_the_monotonic_rule(tmp_path: Path) -> None:
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        watching_guard(ls.address) as (server, guard),
        AsyncLeaseClient(ls.address) as leases,
    ):
        await (await leases.acquire("r", ttl=30)).release()
        lease = await leases.acquire("r", ttl=30)
        await fence_reaches(guard, "r", lease.token)
        await ls.stop(0)

        async def disconnected() -> bool:
            return not follower_of(server).status.following

        await eventually(disconnected, "the follower notices")
        status = follower_of(server).status
        assert status.state == "disconnected" and status.disconnects >= 1
        assert status.last_error
        assert await watch_health(server.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        # The guard itself still serves, and still fences by what it has seen.
        assert await guard.put(lease, "k", b"v") == lease.token
        with pytest.raises(StaleTokenError):
            await guard.put(Claim("r", lease.token - 1), "k", b"stale")
        # A token above every one it saw granted cannot be checked now: refused, retryable.
        with pytest.raises(BackendUnavailableError, match="cannot check with the lease server"):
            await guard.put(Claim("r", lease.token + 1), "k", b"unknown")
        assert await guard.describe_fence("r") == lease.token


async def test_resumes_after_a_lease_server_restart_without_missing_a_grant(
    tmp_path: Path,
) -> None:
    """Lease server A restarts on its address; meanwhile B (same SQLite file) grants."""
    url = f"sqlite:{tmp_path / 'leases.db'}"
    first = await start_lease_server(url, "127.0.0.1:0")
    address = first.address
    async with watching_guard(address) as (server, guard):
        async with AsyncLeaseClient(address, holder="a") as leases:
            old = await leases.acquire("r", ttl=0.5)
            await fence_reaches(guard, "r", old.token)
        await first.stop(0)
        async with lease_server(url) as other, AsyncLeaseClient(other.address, holder="b") as b:
            # While the follower's server is down, the lease changes hands elsewhere.
            new = await b.acquire("r", ttl=30, timeout=HANG_GUARD)
            assert new.token == old.token + 1
        assert await guard.describe_fence("r") == old.token  # not seen yet
        async with lease_server(url, address):  # A is back, on the same address
            await fence_reaches(guard, "r", new.token)
            # The paused former holder wakes up and writes: rejected, though B never wrote.
            with pytest.raises(StaleTokenError):
                await guard.put(old, "k", b"late")
            status = follower_of(server).status
            assert status.following and status.disconnects >= 1 and status.resyncs == 0


async def test_a_restarted_guard_resumes_from_its_stored_revision(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'guard.db'}"
    async with (
        lease_server(f"sqlite:{tmp_path / 'leases.db'}") as ls,
        AsyncLeaseClient(ls.address) as leases,
    ):
        async with watching_guard(ls.address, store) as (_, guard):
            old = await leases.acquire("r", ttl=30)
            await fence_reaches(guard, "r", old.token)
        await old.release()  # while no guard follows
        new = await leases.acquire("r", ttl=30)
        async with watching_guard(ls.address, store) as (server, guard):
            await fence_reaches(guard, "r", new.token)
            assert follower_of(server).status.resyncs == 0


async def test_resync_re_reads_the_resources_it_fenced(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'leases.db'}"
    first = await start_lease_server(url, "127.0.0.1:0")
    address = first.address
    async with watching_guard(address) as (server, guard):
        async with AsyncLeaseClient(address) as leases:
            old = await leases.acquire("r", ttl=30)
            await fence_reaches(guard, "r", old.token)
            await first.stop(0)
        async with lease_server(url) as other, AsyncLeaseClient(other.address) as leases:
            await leases.release("r", old.token)
            current = await leases.acquire("r", ttl=30)
            await events_of(other).prune_events(keep=0)  # the follower's cursor is gone
        async with lease_server(url, address):
            await fence_reaches(guard, "r", current.token)

            async def resynced() -> bool:
                return follower_of(server).status.resyncs == 1

            await eventually(resynced, "one resync")


class NoLog:
    """A lease backend without an event log (as a new backend may start out)."""

    def __init__(self) -> None:
        from lease_server.backends.memory import MemoryBackend

        self._inner = MemoryBackend()
        self.name = "bare"
        self.open, self.close = self._inner.open, self._inner.close
        self.acquire, self.renew = self._inner.acquire, self._inner.renew
        self.release, self.describe = self._inner.release, self._inner.describe
        self.list_held = self._inner.list_held
        self.on_release = self._inner.on_release


async def test_a_backend_without_an_event_log_serves_leases_but_not_watch() -> None:
    backend = NoLog()
    async with (
        lease_server(backend) as ls,
        AsyncLeaseClient(ls.address) as leases,
    ):
        assert ls.service.events is None
        lease = await leases.acquire("r", ttl=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in leases._stub.Watch(lease_pb2.WatchRequest(prefix="")):
                pass
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "event log" in (err.value.details() or "")
        guard = await start_guard(
            "memory://", "127.0.0.1:0", mode=FenceMode.WATCH, lease_server=ls.address
        )
        try:

            async def says_why() -> bool:
                return "event log" in follower_of(guard).status.last_error

            await eventually(says_why, "the follower reports why it cannot follow")
            assert not follower_of(guard).status.following
            assert await watch_health(guard.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await guard.stop(0)
        await lease.release()
