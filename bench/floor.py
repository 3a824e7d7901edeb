"""The RPC floor and the embedded default: how far above an empty call do our calls cost?

Measures, against one lease server and one guard (separate processes, SQLite):
an empty gRPC call on the same server stack (``grpc.health.v1.Health/Check``),
Acquire+Release, and a one-op guarded Write, at each client count.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness import Result, measure, progress, server_process
from fencing.v1 import guard_pb2, guard_pb2_grpc, lease_pb2, lease_pb2_grpc

FLOOR = "empty gRPC call (floor)"


async def run_servers_bench(
    lease_addr: str,
    guard_addr: str,
    label: str,
    clients: Sequence[int],
    duration: float,
    *,
    floor: bool = True,
) -> list[Result]:
    """Acquire+Release and a one-op Write through running servers; optionally the floor."""
    results: list[Result] = []
    for n in clients:
        channels = [grpc.aio.insecure_channel(lease_addr) for _ in range(n)]
        gchannels = [grpc.aio.insecure_channel(guard_addr) for _ in range(n)]
        try:
            results += await _one_count(channels, gchannels, label, n, duration, floor)
        finally:
            for c in channels + gchannels:
                await c.close()
    return results


async def _one_count(
    channels: list[grpc.aio.Channel],
    gchannels: list[grpc.aio.Channel],
    label: str,
    n: int,
    duration: float,
    floor: bool,
) -> list[Result]:
    health = [health_pb2_grpc.HealthStub(c) for c in channels]
    leases = [lease_pb2_grpc.LeaseServiceStub(c) for c in channels]
    guards = [guard_pb2_grpc.GuardServiceStub(c) for c in gchannels]
    results: list[Result] = []

    async def empty(i: int) -> None:
        await health[i].Check(health_pb2.HealthCheckRequest(service=""))

    async def acquire_release(i: int) -> None:
        lease = await leases[i].Acquire(
            lease_pb2.AcquireRequest(resource=f"bench-{label}-{i}", holder=f"c{i}", ttl_ms=10_000)
        )
        await leases[i].Release(
            lease_pb2.ReleaseRequest(resource=lease.resource, token=lease.token, holder=f"c{i}")
        )

    async def write(i: int) -> None:
        await guards[i].Write(
            guard_pb2.WriteRequest(
                resource=f"bench-{label}-{i}",
                token=1,
                ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=b"v" * 64))],
            )
        )

    if floor:
        progress(f"{FLOOR}, {n} clients")
        results.append(await measure(FLOOR, empty, n, duration))
    progress(f"{label} acquire+release, {n} clients")
    results.append(
        await measure(f"{label}: Acquire+Release", acquire_release, n, duration, baseline=FLOOR)
    )
    progress(f"{label} guarded write, {n} clients")
    results.append(await measure(f"{label}: Write (1 op)", write, n, duration, baseline=FLOOR))
    return results


async def run(clients: Sequence[int], duration: float) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="fencing-bench-") as tmp:
        data = Path(tmp)
        with (
            server_process("lease_server", "--backend", f"sqlite:{data / 'leases.db'}") as la,
            server_process("guard", "--store", f"sqlite:{data / 'guard.db'}") as ga,
        ):
            return await run_servers_bench(la, ga, "sqlite", clients, duration)
