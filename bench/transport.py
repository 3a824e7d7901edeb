"""The SDK's Acquire+Release on its two transports: the lease stream against unary calls.

Through a lease server process on SQLite, from this one Python process, at each
client count: each client an ``AsyncLeaseClient`` of its own (its own channel, its
own lease stream) taking and releasing its own lock in a loop
(``await client.acquire(...)`` then ``await lease.release()``: the SDK's whole path,
steps, handles and all). Rows:

* **unary empty call**: ``Health.Check`` on a raw stub, the per-RPC floor of this stack;
* **SDK unary**: ``transport="unary"``, one RPC per call (the baseline of the stream rows);
* **SDK stream**: ``transport="stream"``, the calls as messages on one Session stream
  per client;
* **SDK stream, one client shared**: the same count of tasks sharing a single client,
  so their calls share one stream and its messages.

The rounds alternate (unary, stream, unary, stream...) and each row keeps its median
round, so a change in the machine's load hits both transports alike. Each row notes
the CPU per operation over its measured round (the warm-up left out) of the server
process and of the client: this bench process, every thread of it (the SDK, asyncio,
gRPC's own), from ``time.process_time()``; the empty call's client figure is what a
bare RPC costs this process.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness import Result, Server, measure, progress, server
from fencing import AsyncLeaseClient

FLOOR = "unary empty call (Health.Check)"
UNARY = "SDK Acquire+Release, unary"
STREAM = "SDK Acquire+Release, stream"
SHARED = "SDK Acquire+Release, stream, one client shared"
#: Alternating rounds per row (the median is kept).
ROUNDS = 3
#: Seconds each round runs before it is measured.
WARMUP = 0.3


async def _round(
    name: str,
    op: Callable[[int], Awaitable[None]],
    n: int,
    duration: float,
    lease: Server,
    baseline: str,
) -> Result:
    await measure(name, op, n, WARMUP, warmup=0)  # not counted, its CPU neither
    server, client = lease.cpu_seconds(), time.process_time()
    result = await measure(name, op, n, duration, warmup=0, baseline=baseline)
    server, client = lease.cpu_seconds() - server, time.process_time() - client
    ops = result.ops or 1
    result.note = f"server {server / ops * 1e6:.0f} us CPU/op, client {client / ops * 1e6:.0f}"
    return result


async def _count(lease: Server, n: int, duration: float) -> list[Result]:
    channels = [grpc.aio.insecure_channel(lease.address) for _ in range(n)]
    health = [health_pb2_grpc.HealthStub(c) for c in channels]
    unary = [AsyncLeaseClient(lease.address, holder=f"u{i}", transport="unary") for i in range(n)]
    stream = [AsyncLeaseClient(lease.address, holder=f"s{i}", transport="stream") for i in range(n)]
    shared = AsyncLeaseClient(lease.address, holder="shared", transport="stream")

    async def empty(i: int) -> None:
        await health[i].Check(health_pb2.HealthCheckRequest(service=""))

    def cycle(
        clients: Callable[[int], AsyncLeaseClient], tag: str
    ) -> Callable[[int], Awaitable[None]]:
        async def op(i: int) -> None:
            taken = await clients(i).acquire(f"bench-{tag}-{n}-{i}", ttl=10)
            await taken.release()

        return op

    ops: dict[str, tuple[Callable[[int], Awaitable[None]], str]] = {
        FLOOR: (empty, ""),
        UNARY: (cycle(lambda i: unary[i], "u"), FLOOR),
        STREAM: (cycle(lambda i: stream[i], "s"), UNARY),
        SHARED: (cycle(lambda i: shared, "x"), UNARY),
    }
    rounds: dict[str, list[Result]] = {name: [] for name in ops}
    try:
        for r in range(ROUNDS):
            for name, (op, baseline) in ops.items():
                progress(f"transport: {name}, {n} clients, round {r + 1}/{ROUNDS}")
                rounds[name].append(await _round(name, op, n, duration, lease, baseline))
    finally:
        for client in [*unary, *stream, shared]:
            await client.aclose()
        for channel in channels:
            await channel.close()
    return [_median(rs) for rs in rounds.values()]


def _median(results: list[Result]) -> Result:
    middle = statistics.median_low(r.rate for r in results)
    return next(r for r in results if r.rate == middle)


async def run(clients: Sequence[int], duration: float) -> list[Result]:
    """The rows above at each client count (1 and 16 by default, see ``python -m bench``)."""
    with tempfile.TemporaryDirectory(prefix="fencing-bench-transport-") as tmp:
        db = Path(tmp) / "leases.db"
        with server("lease_server", "--backend", f"sqlite:{db}") as lease:
            results: list[Result] = []
            for n in clients:
                results += await _count(lease, n, duration)
            return results
