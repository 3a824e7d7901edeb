"""Redis behind real gRPC lease servers: wake-ups across servers, and a Redis restart.

Both run several lease servers (one process, separate backends, so they share only
Redis) and drive them with the blocking SDK from threads.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter

import pytest

from fencing import (
    BackendUnavailableError,
    Claim,
    GuardClient,
    LeaseClient,
    LeaseHeldError,
    LeaseLost,
)
from fencing.testing import running_servers
from guard.fence import FenceMode
from lease_server.backends.redis import RedisBackend
from lease_server.server import LeaseServer, start_lease_server
from tests.redis_server import SERVERS, RedisProcess, drop_prefix, unique_prefix

# slow: Redis servers restarted under load (the default loop leaves it out).
pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("which", ["redis", "redis-cluster"])
async def test_a_waiter_on_another_server_wakes_on_release(which: str) -> None:
    url = SERVERS.standalone_url() if which == "redis" else SERVERS.cluster_url()
    prefix = unique_prefix()
    a = await start_lease_server(RedisBackend(url, prefix=prefix), "127.0.0.1:0")
    b = await start_lease_server(RedisBackend(url, prefix=prefix), "127.0.0.1:0")
    # Only Redis pub/sub can wake b's waiter before the 60 s lease expires: b's own
    # polling is slowed to that expiry, and the release goes through a.
    b.service.waiters.poll_interval = 60.0
    holder = LeaseClient(a.address, holder="holder")
    waiter = LeaseClient(b.address, holder="waiter")
    try:
        lease = await asyncio.to_thread(holder.acquire, "job", 60.0)
        waiting = asyncio.create_task(asyncio.to_thread(waiter.acquire, "job", 60.0, 30.0))
        for _ in range(500):  # until b has the waiter in line (hang guard: 5 s)
            if b.service.waiters.waiting("job"):
                break
            await asyncio.sleep(0.01)
        assert b.service.waiters.waiting("job") == 1
        await asyncio.sleep(0.1)  # the waiter is napping now
        released_at = time.perf_counter()
        await asyncio.to_thread(lease.release)
        got = await asyncio.wait_for(waiting, 20)
        latency_ms = (time.perf_counter() - released_at) * 1000
        print(
            f"\n[{which}] waiter on another server got the lease {latency_ms:.1f} ms after release"
        )
        assert got.token > lease.token and got.holder == "waiter"
        await asyncio.to_thread(got.release)
    finally:
        holder.close()
        waiter.close()
        await a.stop(0)
        await b.stop(0)
        await drop_prefix(url, prefix)


async def test_redis_restart_under_load(throwaway_redis: RedisProcess) -> None:
    """kill -9 Redis (persistence off) while clients acquire and release through two
    lease servers; start it again, empty. During the outage the SDK raises
    BackendUnavailableError; afterwards grants resume, and every token of a resource
    is unique and larger than every token before the restart (the clock floor)."""
    servers: list[LeaseServer] = []
    for _ in range(2):
        servers.append(await start_lease_server(RedisBackend(throwaway_redis.url), "127.0.0.1:0"))
    stop = threading.Event()
    lock = threading.Lock()
    grants: list[tuple[float, str, int]] = []  # (monotonic time, resource, token)
    errors: list[tuple[float, str]] = []

    def worker(i: int) -> None:
        resource = f"res-{i % 2}"
        with LeaseClient(servers[i % 2].address, holder=f"w{i}") as client:
            while not stop.is_set():
                try:
                    lease = client.acquire_nowait(resource, 5.0)
                except BackendUnavailableError:
                    with lock:
                        errors.append((time.monotonic(), "unavailable"))
                    time.sleep(0.05)
                    continue
                except LeaseHeldError:
                    time.sleep(0.005)
                    continue
                with lock:
                    grants.append((time.monotonic(), resource, lease.token))
                try:
                    lease.release()
                except (BackendUnavailableError, LeaseLost) as exc:
                    with lock:
                        errors.append((time.monotonic(), type(exc).__name__))

    loop = asyncio.get_running_loop()
    workers = [loop.run_in_executor(None, worker, i) for i in range(4)]
    try:
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        throwaway_redis.kill()
        await asyncio.sleep(3.0)  # longer than the SDK's retries (1.55 s)
        up_at = time.monotonic()
        await asyncio.to_thread(throwaway_redis.start)
        await asyncio.sleep(3.0)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        for server in servers:
            await server.stop(0)

    kinds = Counter(kind for _, kind in errors)
    before = [(r, t) for at, r, t in grants if at < killed_at]
    after = [(r, t) for at, r, t in grants if at > up_at]
    print(f"\nredis restart: {len(before)} grants before, {len(after)} after, errors {dict(kinds)}")
    assert before and after
    assert any(killed_at <= at <= up_at + 0.5 for at, kind in errors if kind == "unavailable")
    for resource in ("res-0", "res-1"):
        tokens = [t for _, r, t in grants if r == resource]
        assert len(set(tokens)) == len(tokens), "a token was granted twice"
        # One holder at a time per resource: grants were recorded in grant order.
        assert all(x < y for x, y in itertools.pairwise(tokens))
        old = [t for r, t in before if r == resource]
        new = [t for r, t in after if r == resource]
        if old and new:
            assert min(new) > max(old)


@pytest.mark.parametrize("which", ["redis", "redis-cluster"])
def test_strict_guard_and_lease_server_on_one_redis(which: str) -> None:
    """Over gRPC: a guard in strict mode on the lease server's Redis (same prefix) rejects
    the write of a holder whose lease expired, although nobody took it over."""
    url = SERVERS.standalone_url() if which == "redis" else SERVERS.cluster_url()
    prefix = unique_prefix()
    shared = f"{url}?prefix={prefix}"
    try:
        with (
            running_servers(shared, shared, mode=FenceMode.STRICT) as servers,
            LeaseClient(servers.lease_address, holder="a") as leases,
            GuardClient(servers.guard_address) as guard,
        ):
            lease = leases.acquire("ledger", 0.3)
            assert guard.put(lease, "k", b"live") == lease.token
            time.sleep(0.4)  # expired by Redis's clock; nobody acquired since
            with pytest.raises(LeaseLost, match="not the live lease") as lost:
                guard.put(lease, "k", b"late")
            assert lost.value.token == lease.token
            # A token nobody was granted cannot raise a strict guard's fence either.
            with pytest.raises(LeaseLost):
                guard.fence(Claim("ledger", 2**63 - 1))
            assert guard.describe_fence("ledger") == lease.token
            record = guard.read("ledger", "k")
            assert record is not None and record.value == b"live"
    finally:
        asyncio.run(drop_prefix(url, prefix))


async def test_close_ends_a_listener_whose_first_cancellation_was_swallowed(redis_url: str) -> None:
    """redis-py can swallow a cancellation that lands as its read timeout fires (its
    pub/sub read goes on). close() must still end the release listener and return (it
    is the last step of a lease server's drain), not wait for it forever."""
    prefix = unique_prefix()
    backend = RedisBackend(redis_url, prefix=prefix)
    await backend.open()
    backend.on_release(lambda resource: None)
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # as redis-py may: the cancellation is lost, the loop goes on
        await asyncio.Event().wait()

    listener = backend._listener
    assert listener is not None
    listener.cancel()
    backend._listener = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    closing = asyncio.create_task(backend.close())
    try:
        done, _ = await asyncio.wait({closing}, timeout=10)
        assert closing in done, "close() waits forever for a listener that ignored a cancel"
    finally:
        closing.cancel()
        await drop_prefix(redis_url, prefix)
    assert swallowed.is_set()
