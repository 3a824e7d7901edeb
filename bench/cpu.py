"""CPU per operation, server and client, against the floor of the messages it carries.

Time alone says little on a shared machine; CPU per operation is what a change moves.
Against a lease server and a guard on SQLite (separate processes) and a bare grpc.aio
echo server (:mod:`bench.echo`), from this one process, ``n`` clients each with its own
channel (the largest client count), every row is measured as CPU per operation of the
server process (from /proc) and of this process (the client: every thread of it, the
SDK, asyncio and gRPC's own, from ``time.process_time()``), warm-up left out.

Floors (one message each way per operation):

* **echo unary** / **echo stream message**: the bare transport, nothing of ours;
* **lease server: unary empty call** (``Health.Check``) and **guard: unary empty call**:
  our server stack (interceptors, admission, metrics) around no work;
* **lease server: stream ping**: one ``Ping`` on a Session stream (the bench's minimal
  stream client, :mod:`bench.stream_client`; the SDK's stream has no ping of its own).

Operations, each over the floor of the messages it carries:

* **SDK Acquire+Release, stream**: ``AsyncLeaseClient(transport="stream")``: two stream
  pings;
* **SDK Acquire+Release, unary**: two unary empty calls on the lease server;
* **guard Write (1 op), unary**: one unary empty call on the guard (a value that changes
  on every write).

* **SDK Acquire+Release, one shared stream**: as many tasks on one
  ``AsyncLeaseClient``: calls queued together share messages, so no floor divides it.

Beside them, in the same rounds: the same servers on ``memory://`` (the difference is
what the storage costs) and, when etcd is installed, etcd's lock+unlock (its server's
CPU and its client's, :func:`bench.peers.etcd_op`): our streamed rows next to it, then
again with every server pinned to CPU 0 and this process to CPU 1 (one core each).

Rounds alternate (every row, then every row again, ``ROUNDS`` times) and each figure
is the median of its rounds, so a change in the machine's load hits every row alike.
With ``old=REF`` (``python -m bench --only cpu --old REF``) the lease server and the
guard of that git ref run beside this tree's, each round measuring both sides in turn
(the client is this tree's SDK for both): a change's before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import echo
from bench.harness import Server, fresh_value, measure, progress, server
from bench.stream_client import SessionStream
from fencing import AsyncLeaseClient
from fencing.v1 import guard_pb2, guard_pb2_grpc

ROUNDS = 3
WARMUP = 0.3

ECHO_UNARY = "echo unary (bare grpc.aio)"
ECHO_STREAM = "echo stream message (bare grpc.aio)"
LEASE_EMPTY = "lease server: unary empty call"
LEASE_PING = "lease server: stream ping"
GUARD_EMPTY = "guard: unary empty call"
STREAMED = "SDK Acquire+Release, stream"
UNARY = "SDK Acquire+Release, unary"
WRITE = "guard Write (1 op), unary"
SHARED = "SDK Acquire+Release, one shared stream"
ETCD = "etcd lock+unlock (lease per client)"

#: Each operation's floor: (floor row, how many of its messages the operation carries).
FLOORS: dict[str, tuple[str, int]] = {
    STREAMED: (LEASE_PING, 2),
    UNARY: (LEASE_EMPTY, 2),
    WRITE: (GUARD_EMPTY, 1),
    LEASE_EMPTY: (ECHO_UNARY, 1),
    GUARD_EMPTY: (ECHO_UNARY, 1),
    LEASE_PING: (ECHO_STREAM, 1),
}
#: The side whose servers run on uvloop (``--event-loop uvloop``).
UVLOOP_SIDE = "new, uvloop"
#: The side whose servers keep nothing (``memory://``): what is left is the transport,
#: the service and the server's edge; the difference from "new" is the storage's.
MEMORY_SIDE = "new, memory://"
#: The rows measured again with every server on CPU 0 and this process on CPU 1.
PINNED_SIDE = "pinned"
#: The rows of the etcd comparison, shared cores and pinned.
VERSUS = (STREAMED, SHARED)
#: The targets: an operation's CPU at most this many times its floor's, server and client.
BOUND = 1.5


@dataclass
class Row:
    """One row's rounds: ops/s, server and client CPU seconds per operation."""

    name: str
    side: str
    rates: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    client: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def server_us(self) -> float:
        return statistics.median(self.server) * 1e6 if self.server else 0.0

    @property
    def client_us(self) -> float:
        return statistics.median(self.client) * 1e6 if self.client else 0.0


Op = Callable[[int], Awaitable[None]]


async def _round(row: Row, op: Op, n: int, duration: float, srv: Server) -> None:
    await measure(row.name, op, n, WARMUP, warmup=0)  # not counted, its CPU neither
    server0, client0 = srv.cpu_seconds(), time.process_time()
    result = await measure(row.name, op, n, duration, warmup=0)
    ops = result.ops or 1
    row.rates.append(result.rate)
    row.server.append((srv.cpu_seconds() - server0) / ops)
    row.client.append((time.process_time() - client0) / ops)


@dataclass
class Side:
    """One side's servers and the operations measured through them."""

    name: str
    lease: Server
    guard: Server


async def _ops(
    side: Side, n: int, stack: contextlib.AsyncExitStack
) -> list[tuple[str, Op, Server]]:
    lease_ch = [grpc.aio.insecure_channel(side.lease.address) for _ in range(n)]
    guard_ch = [grpc.aio.insecure_channel(side.guard.address) for _ in range(n)]
    for c in lease_ch + guard_ch:
        stack.push_async_callback(c.close)
    lease_health = [health_pb2_grpc.HealthStub(c) for c in lease_ch]
    guard_health = [health_pb2_grpc.HealthStub(c) for c in guard_ch]
    guards = [guard_pb2_grpc.GuardServiceStub(c) for c in guard_ch]
    streams = [SessionStream(c) for c in lease_ch]
    for s in streams:
        stack.push_async_callback(s.close)
    sdk_stream = [
        AsyncLeaseClient(side.lease.address, holder=f"s{i}", transport="stream") for i in range(n)
    ]
    sdk_unary = [
        AsyncLeaseClient(side.lease.address, holder=f"u{i}", transport="unary") for i in range(n)
    ]
    sdk_shared = AsyncLeaseClient(side.lease.address, holder="t", transport="stream")
    for client in [*sdk_stream, *sdk_unary, sdk_shared]:
        stack.push_async_callback(client.aclose)
    writes = [
        guard_pb2.WriteRequest(
            resource=f"cpu-{side.name}-{i}", token=1, ops=[guard_pb2.Op(put=guard_pb2.Put(key="k"))]
        )
        for i in range(n)
    ]
    check = health_pb2.HealthCheckRequest(service="")

    async def lease_empty(i: int) -> None:
        await lease_health[i].Check(check)

    async def guard_empty(i: int) -> None:
        await guard_health[i].Check(check)

    async def ping(i: int) -> None:
        await streams[i].ping()

    def cycle(clients: list[AsyncLeaseClient], tag: str) -> Op:
        async def op(i: int) -> None:
            taken = await clients[i].acquire(f"cpu-{side.name}-{tag}-{i}", ttl=10)
            await taken.release()

        return op

    async def shared(i: int) -> None:
        taken = await sdk_shared.acquire(f"cpu-{side.name}-t-{i}", ttl=10)
        await taken.release()

    async def write(i: int) -> None:
        request = writes[i]
        request.ops[0].put.value = fresh_value()
        await guards[i].Write(request)

    return [
        (LEASE_EMPTY, lease_empty, side.lease),
        (LEASE_PING, ping, side.lease),
        (GUARD_EMPTY, guard_empty, side.guard),
        (STREAMED, cycle(sdk_stream, "s"), side.lease),
        (UNARY, cycle(sdk_unary, "u"), side.lease),
        (SHARED, shared, side.lease),
        (WRITE, write, side.guard),
    ]


async def _echo_ops(address: str, n: int, stack: contextlib.AsyncExitStack) -> list[tuple[str, Op]]:
    channels = [grpc.aio.insecure_channel(address) for _ in range(n)]
    for c in channels:
        stack.push_async_callback(c.close)
    unary: list[Any] = [c.unary_unary(echo.UNARY) for c in channels]
    calls: list[Any] = [c.stream_stream(echo.STREAM)() for c in channels]
    for call in calls:
        stack.callback(call.cancel)
    payload = b"x" * 16

    async def echo_unary(i: int) -> None:
        await unary[i](payload)

    async def echo_stream(i: int) -> None:
        await calls[i].write(payload)
        await calls[i].read()

    return [(ECHO_UNARY, echo_unary), (ECHO_STREAM, echo_stream)]


@contextlib.contextmanager
def _servers(
    tree: Path | None, data: Path, side: str, *extra: str, memory: bool = False
) -> Iterator[tuple[Server, Server]]:
    from bench.pglog import code_from

    leases = "memory://" if memory else f"sqlite:{data / f'{side}-leases.db'}"
    store = "memory://" if memory else f"sqlite:{data / f'{side}-guard.db'}"
    with (
        code_from(tree),
        server("lease_server", "--backend", leases, *extra, cwd=tree) as la,
        server("guard", "--store", store, *extra, cwd=tree) as ga,
    ):
        yield la, ga


def _has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


async def run(
    clients: Sequence[int],
    duration: float,
    old: str = "",
    *,
    rounds: int = ROUNDS,
    uvloop: bool | None = None,
    etcd: bool | None = None,
) -> list[Row]:
    """Every row of the module doc, ``rounds`` alternating rounds, at ``max(clients)``.

    ``uvloop`` (default: when it is installed) adds a side whose servers run
    ``--event-loop uvloop``, measured in the same rounds as the standard loop's; a side
    on ``memory://`` runs beside them. ``etcd`` (default: when it is installed) adds
    etcd's lock+unlock to the rounds, then measures it and our streamed rows again with
    the servers on CPU 0 and this process on CPU 1 (one core each)."""
    if uvloop is None:
        uvloop = _has_uvloop()
    if etcd is None:
        etcd = shutil.which("etcd") is not None
    from bench.peers import etcd_op, etcd_process
    from bench.pglog import checkout

    n = max(clients)
    with contextlib.ExitStack() as procs, tempfile.TemporaryDirectory(prefix="fencing-cpu-") as tmp:
        data = Path(tmp)
        echo_srv = procs.enter_context(server("bench.echo"))
        lease, guard = procs.enter_context(_servers(None, data, "new"))
        sides = [Side("new", lease, guard)]
        lease, guard = procs.enter_context(_servers(None, data, "memory", memory=True))
        sides.append(Side(MEMORY_SIDE, lease, guard))
        if uvloop:
            lease, guard = procs.enter_context(
                _servers(None, data, "uvloop", "--event-loop", "uvloop")
            )
            sides.append(Side(UVLOOP_SIDE, lease, guard))
        if old:
            tree = procs.enter_context(checkout(old))
            lease, guard = procs.enter_context(_servers(tree, data, "old"))
            sides.append(Side(f"old {old}", lease, guard))
        async with contextlib.AsyncExitStack() as stack:
            plan: list[tuple[Row, Op, Server]] = [
                (Row(name, ""), op, echo_srv)
                for name, op in await _echo_ops(echo_srv.address, n, stack)
            ]
            versus: list[tuple[Row, Op, Server]] = []
            if etcd:
                host, port, pid = procs.enter_context(etcd_process())
                etcd_srv = Server(f"{host}:{port}", [pid])
                op = await etcd_op(host, port, n, stack)
                plan.append((Row(ETCD, ""), op, etcd_srv))
                versus.append((Row(ETCD, PINNED_SIDE), op, etcd_srv))
            for side in sides:
                for name, op, srv in await _ops(side, n, stack):
                    plan.append((Row(name, side.name), op, srv))
                    if etcd and side.name == "new" and name in VERSUS:
                        versus.append((Row(name, PINNED_SIDE), op, srv))
            await _rounds(plan, n, duration, rounds)
            if versus:
                with _pinned([srv for _, _, srv in versus]):
                    await _rounds(versus, n, duration, rounds)
    return [row for row, _, _ in plan + versus]


async def _rounds(plan: list[tuple[Row, Op, Server]], n: int, duration: float, rounds: int) -> None:
    for r in range(rounds):
        for row, op, srv in plan:
            tag = f" ({row.side})" if row.side else ""
            progress(f"cpu: {row.name}{tag}, {n} clients, round {r + 1}/{rounds}")
            await _round(row, op, n, duration, srv)


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def _pinned(servers: Sequence[Server]) -> Iterator[None]:
    """``servers`` on CPU 0 and this process on CPU 1, then every CPU again."""
    everywhere = set(range(os.cpu_count() or 1))
    pids = {pid for srv in servers for pid in srv.pids}
    for pid in pids:
        _pin(pid, {0})
    _pin(os.getpid(), {1 % len(everywhere)})
    try:
        yield
    finally:
        for pid in [*pids, os.getpid()]:
            _pin(pid, everywhere)


def _floor_of(row: Row, rows: Sequence[Row]) -> tuple[Row, int] | None:
    floor = FLOORS.get(row.name)
    if floor is None:
        return None
    name, count = floor
    side = "" if name.startswith("echo") else row.side
    match = next((r for r in rows if r.name == name and r.side == side), None)
    return (match, count) if match is not None else None


def ratios(row: Row, rows: Sequence[Row]) -> tuple[float, float] | None:
    """Server and client CPU per operation over ``count`` times its floor's."""
    found = _floor_of(row, rows)
    if found is None:
        return None
    floor, count = found
    if not floor.server_us or not floor.client_us:
        return None
    return row.server_us / (count * floor.server_us), row.client_us / (count * floor.client_us)


def markdown(rows: Sequence[Row], n: int) -> str:
    lines = [
        f"{n} clients, median of {ROUNDS} alternating rounds. CPU per operation, "
        "server process and client (this process); ratio: over the floor row times the "
        "messages the operation carries.",
        "",
        "| row | side | ops/s | server us/op | client us/op | floor | server / floor "
        "| client / floor |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for row in rows:
        found = _floor_of(row, rows)
        both = ratios(row, rows)
        is_floor = any(row.name == name for name, _ in FLOORS.values())
        floor = f"{found[1]} x {found[0].name}" if found else "(floor)" if is_floor else "-"
        lines.append(
            f"| {row.name} | {row.side or '-'} | {row.rate:,.0f} | {row.server_us:,.0f} | "
            f"{row.client_us:,.0f} | {floor} | "
            + (f"{both[0]:.2f}x | {both[1]:.2f}x |" if both else "- | - |")
        )
    return "\n".join(lines)


def loops(rows: Sequence[Row]) -> str:
    """Server CPU per operation on uvloop over the standard loop's, row by row."""
    pairs = [
        (row, next(r for r in rows if r.name == row.name and r.side == "new"))
        for row in rows
        if row.side == UVLOOP_SIDE
    ]
    if not pairs:
        return ""
    lines = [
        "| row | server us/op, asyncio | server us/op, uvloop | uvloop / asyncio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for fast, std in pairs:
        ratio = fast.server_us / std.server_us if std.server_us else float("nan")
        lines.append(
            f"| {fast.name} | {std.server_us:,.0f} | {fast.server_us:,.0f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def storage(rows: Sequence[Row]) -> str:
    """Server CPU per operation on SQLite against the same servers on ``memory://``:
    what the storage costs, and what is left of the floor's ratio without it."""
    lines = [
        "| row | server us/op, sqlite | server us/op, memory:// | storage's share "
        "| memory:// / floor |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if row.side != MEMORY_SIDE or row.name not in (STREAMED, UNARY, SHARED, WRITE):
            continue
        std = next((r for r in rows if r.name == row.name and r.side == "new"), None)
        if std is None or not std.server_us:
            continue
        both = ratios(row, rows)
        lines.append(
            f"| {row.name} | {std.server_us:,.0f} | {row.server_us:,.0f} | "
            f"{1 - row.server_us / std.server_us:.0%} | " + (f"{both[0]:.2f}x |" if both else "- |")
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def _etcd(rows: Sequence[Row], side: str) -> Row | None:
    etcd_side = "" if side == "new" else side
    return next((r for r in rows if r.name == ETCD and r.side == etcd_side and r.rates), None)


def versus(rows: Sequence[Row]) -> list[tuple[str, Row, Row]]:
    """(how, ours, etcd's) for each streamed row next to etcd's, shared cores and pinned."""
    out: list[tuple[str, Row, Row]] = []
    for side, how in (("new", "2 shared cores"), (PINNED_SIDE, "pinned, a core each")):
        etcd = _etcd(rows, side)
        if etcd is None:
            continue
        out += [
            (how, row, etcd)
            for row in rows
            if row.name in VERSUS and row.side == side and row.rates
        ]
    return out


def versus_markdown(rows: Sequence[Row]) -> str:
    """Our streamed rows next to etcd's lock+unlock: rate, and server + client CPU."""
    pairs = versus(rows)
    if not pairs:
        return ""
    lines = [
        "| cores | row | ops/s | / etcd | server + client us/op | etcd's | CPU / etcd |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for how, ours, etcd in pairs:
        mine, theirs = ours.server_us + ours.client_us, etcd.server_us + etcd.client_us
        lines.append(
            f"| {how} | {ours.name} | {ours.rate:,.0f} | {ours.rate / etcd.rate:.2f}x | "
            f"{ours.server_us:,.0f} + {ours.client_us:,.0f} = {mine:,.0f} | "
            f"{etcd.server_us:,.0f} + {etcd.client_us:,.0f} = {theirs:,.0f} | "
            f"{mine / theirs:.2f}x |"
        )
    return "\n".join(lines)


#: Each streamed row's rate over etcd's at least this, by where the processes run.
VERSUS_BOUND = {
    ("2 shared cores", STREAMED): 1.0,
    ("2 shared cores", SHARED): 2.0,
    ("pinned, a core each", STREAMED): 1.5,
}


def targets(rows: Sequence[Row]) -> list[tuple[str, str, bool]]:
    """(target, figure, met) per operation row of this tree."""
    out: list[tuple[str, str, bool]] = []
    for row in rows:
        if row.name not in (STREAMED, UNARY, WRITE) or row.side != "new":
            continue
        both = ratios(row, rows)
        found = _floor_of(row, rows)
        if both is None or found is None:
            continue
        floor, count = found
        out.append(
            (
                f"cpu: {row.name}, server and client CPU per op <= {BOUND}x {count} x {floor.name}",
                f"server {row.server_us:,.0f} us = {both[0]:.2f}x, client "
                f"{row.client_us:,.0f} us = {both[1]:.2f}x",
                both[0] <= BOUND and both[1] <= BOUND,
            )
        )
    for how, ours, etcd in versus(rows):
        bound = VERSUS_BOUND.get((how, ours.name))
        if bound is not None:
            ratio = ours.rate / etcd.rate
            out.append(
                (
                    f"cpu: {ours.name} / {ETCD}, {how}, ops/s >= {bound:.1f}x",
                    f"{ours.rate:,.0f} ops/s = {ratio:.2f}x ({etcd.rate:,.0f})",
                    ratio >= bound,
                )
            )
        if how == "2 shared cores" and ours.name == STREAMED:
            mine, theirs = ours.server_us + ours.client_us, etcd.server_us + etcd.client_us
            out.append(
                (
                    f"cpu: {ours.name}, server + client CPU per op <= 1.0x etcd's, {how}",
                    f"{mine:,.0f} us = {mine / theirs:.2f}x ({theirs:,.0f} us)",
                    mine <= theirs,
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per round of a row")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--old", default="", help="a git ref whose servers to measure beside")
    args = p.parse_args(argv)
    rows = asyncio.run(run([args.clients], args.duration, args.old))
    print(markdown(rows, args.clients))
    if table := loops(rows):
        print("\nThe servers' event loop (same rounds):\n\n" + table)
    if table := storage(rows):
        print("\nWithout storage (same rounds):\n\n" + table)
    if table := versus_markdown(rows):
        print("\nNext to etcd (same rounds; pinned: measured after, servers on CPU 0):\n\n" + table)
    for target, figure, met in targets(rows):
        print(f"  target: {target}: {figure} (met: {'yes' if met else 'no'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
