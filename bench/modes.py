"""What closing the monotonic window costs: the promise and the watch mode (docs/modes.md).

Against one lease server and guards in separate processes (SQLite), at each client
count, every row relative to plain Acquire+Release measured in the same run:

- ``promise``: Acquire, ``Fence`` on one guard, Release (what ``hold(fence=[guard])``
  adds to taking a lease);
- ``with a watch guard``: Acquire+Release again while a guard in watch mode follows
  the lease server (each grant and release costs it a fence transaction);
- ``until fenced``: Acquire, then ask the watch guard (``DescribeFence``, no sleep)
  until its fence reached the new token, then Release: the p50 difference to the
  row above is the event's delivery delay, the window watch mode leaves open.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc.aio

from bench.harness import Result, measure, progress, server_process
from fencing.v1 import guard_pb2, guard_pb2_grpc, lease_pb2, lease_pb2_grpc

BASE = "Acquire+Release"


async def _rows(
    lease_addr: str, guard_addr: str, watch_addr: str | None, n: int, duration: float
) -> list[Result]:
    channels = [grpc.aio.insecure_channel(lease_addr) for _ in range(n)]
    gchannels = [grpc.aio.insecure_channel(watch_addr or guard_addr) for _ in range(n)]
    leases = [lease_pb2_grpc.LeaseServiceStub(c) for c in channels]
    guards = [guard_pb2_grpc.GuardServiceStub(c) for c in gchannels]

    def resource(i: int) -> str:
        return f"bench-modes-{i}"

    async def acquire(i: int) -> lease_pb2.Lease:
        return await leases[i].Acquire(
            lease_pb2.AcquireRequest(resource=resource(i), holder=f"c{i}", ttl_ms=10_000)
        )

    async def release(i: int, lease: lease_pb2.Lease) -> None:
        await leases[i].Release(
            lease_pb2.ReleaseRequest(resource=lease.resource, token=lease.token, holder=f"c{i}")
        )

    async def acquire_release(i: int) -> None:
        await release(i, await acquire(i))

    async def promise(i: int) -> None:
        lease = await acquire(i)
        await guards[i].Fence(guard_pb2.FenceRequest(resource=lease.resource, token=lease.token))
        await release(i, lease)

    async def until_fenced(i: int) -> None:
        lease = await acquire(i)
        request = guard_pb2.DescribeFenceRequest(resource=lease.resource)
        while (await guards[i].DescribeFence(request)).fence < lease.token:
            pass
        await release(i, lease)

    results: list[Result] = []
    try:
        if watch_addr is None:
            progress(f"modes: {BASE}, {n} clients")
            results.append(await measure(BASE, acquire_release, n, duration))
            progress(f"modes: promise, {n} clients")
            name = "promise: Acquire+Fence(1 guard)+Release"
            results.append(await measure(name, promise, n, duration, baseline=BASE))
        else:
            progress(f"modes: with a watch guard, {n} clients")
            name = "watch: Acquire+Release, a guard following"
            results.append(await measure(name, acquire_release, n, duration, baseline=BASE))
            progress(f"modes: until the watch guard fenced, {n} clients")
            name = "watch: Acquire, until fenced, Release"
            results.append(await measure(name, until_fenced, n, duration, baseline=BASE))
    finally:
        for c in channels + gchannels:
            await c.close()
    return results


async def run(clients: Sequence[int], duration: float) -> list[Result]:
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="fencing-bench-") as tmp:
        data = Path(tmp)
        with (
            server_process("lease_server", "--backend", f"sqlite:{data / 'leases.db'}") as la,
            server_process("guard", "--store", f"sqlite:{data / 'guard.db'}") as ga,
        ):
            for n in clients:
                results += await _rows(la, ga, None, n, duration)
            watch = ("--fence-mode", "watch", "--lease-addr", la)
            with server_process("guard", "--store", f"sqlite:{data / 'watch.db'}", *watch) as wa:
                for n in clients:
                    results += await _rows(la, ga, wa, n, duration)
    # Rows in client order, each count's baseline first.
    return sorted(results, key=lambda r: r.concurrency)
