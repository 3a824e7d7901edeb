"""The RPC floor and the embedded default: how far above an empty call do our calls cost?

Measures, against one lease server and one guard (separate processes, SQLite):
an empty gRPC call on the same server stack (``grpc.health.v1.Health/Check``),
Acquire+Release as unary calls and through the lease stream (``Session``: one stream
per client, each call awaited by its id; :mod:`bench.stream_client`), and a one-op
guarded Write (a value that changes on every write), at each client count. The lease
rows note the server's CPU per operation over the measured period (from /proc; the
warm-up excluded), and the streamed row its ratio to the unary one: what a stream
saves per call. Two ``ping`` calls per client loop are the stream's own floor for
those two round trips: what is left above it is the lease service and its backend.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness import (
    Result,
    Server,
    fresh_value,
    measure,
    measure_server_cpu,
    progress,
    server,
)
from bench.stream_client import SessionStream
from fencing.v1 import guard_pb2, guard_pb2_grpc, lease_pb2, lease_pb2_grpc

FLOOR = "empty gRPC call (floor)"
#: The stream's own cost per Acquire+Release: the same two messages each way, answered
#: by the stream alone (no service, no backend).
PINGS = "two pings via Session (the stream's floor)"


def unary_name(label: str) -> str:
    return f"{label}: Acquire+Release"


def streamed_name(label: str) -> str:
    return f"{label}: Acquire+Release via Session"


async def run_servers_bench(
    lease: Server,
    guard_addr: str,
    label: str,
    clients: Sequence[int],
    duration: float,
    *,
    floor: bool = True,
) -> list[Result]:
    """Acquire+Release (unary and streamed) and a one-op Write through running servers;
    optionally the floor."""
    results: list[Result] = []
    for n in clients:
        channels = [grpc.aio.insecure_channel(lease.address) for _ in range(n)]
        gchannels = [grpc.aio.insecure_channel(guard_addr) for _ in range(n)]
        try:
            results += await _one_count(lease, channels, gchannels, label, n, duration, floor)
        finally:
            for c in channels + gchannels:
                await c.close()
    return results


def streamed_note(streamed: Result, unary: Result) -> str:
    """The streamed row's note: its rate and server CPU per op against the unary row's."""
    text = f"{streamed.rate / unary.rate:.2f}x unary" if unary.rate else "unary: no rate"
    if streamed.cpu_per_op and unary.cpu_per_op:
        text += (
            f"; server CPU {streamed.cpu_per_op * 1e6:,.0f} us/op vs unary "
            f"{unary.cpu_per_op * 1e6:,.0f} ({streamed.cpu_per_op / unary.cpu_per_op:.2f}x)"
        )
    return text


async def _one_count(
    lease: Server,
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
                ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=fresh_value()))],
            )
        )

    streams = [SessionStream(c) for c in channels]

    async def streamed(i: int) -> None:
        got = await streams[i].acquire(f"bench-{label}-s{i}", f"c{i}", 10_000)
        await streams[i].release(got.resource, got.token, f"c{i}")

    if floor:
        progress(f"{FLOOR}, {n} clients")
        results.append(await measure(FLOOR, empty, n, duration))
    progress(f"{label} acquire+release, {n} clients")
    unary = await measure_server_cpu(
        lease, unary_name(label), acquire_release, n, duration, baseline=FLOOR
    )

    async def pings(i: int) -> None:
        await streams[i].ping()
        await streams[i].ping()

    progress(f"{label} acquire+release via Session, {n} clients")
    try:
        through = await measure_server_cpu(
            lease, streamed_name(label), streamed, n, duration, baseline=FLOOR
        )
        progress(f"two pings via Session, {n} clients")
        stream_floor = await measure_server_cpu(lease, PINGS, pings, n, duration, baseline=FLOOR)
    finally:
        for stream in streams:
            await stream.close()
    through.note = streamed_note(through, unary)
    results += [unary, through]
    if floor:
        results.append(stream_floor)
    progress(f"{label} guarded write, {n} clients")
    results.append(await measure(f"{label}: Write (1 op)", write, n, duration, baseline=FLOOR))
    return results


async def run(clients: Sequence[int], duration: float) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="fencing-bench-") as tmp:
        data = Path(tmp)
        with (
            server("lease_server", "--backend", f"sqlite:{data / 'leases.db'}") as la,
            server("guard", "--store", f"sqlite:{data / 'guard.db'}") as ga,
        ):
            return await run_servers_bench(la, ga.address, "sqlite", clients, duration)
