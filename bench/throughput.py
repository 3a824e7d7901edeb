"""Guarded writes per second against the backend's own check-and-write, in one run.

For PostgreSQL and for Redis (each skipped when unreachable), every row one op per
write unless it says otherwise, each writer on its own resource, every write a value
that changes (a rewritten constant can leave a store nothing to commit):

* **direct** (the baseline): the guard's own check-and-write sent straight from this
  process: psycopg calling ``guard_write`` on N connections; redis-py pipelines of
  ``write.lua`` (32 calls per round trip) from N tasks;
* **Write**: the guard (another process) answering unary ``Write`` calls from N clients;
* **WriteStream**: S streams with W writers each (:class:`AsyncWriteStream`, the SDK);
  the guard's group commit packs what arrives together into shared transactions
  (:mod:`guard.commit`), so one round trip and one commit serve many writes;
* **WriteStream pipelined**: S streams each keeping D pre-built messages of 64 writes
  in flight, as the direct Redis row keeps pipelines of pre-built calls in flight
  (the client's own cost out of the way: this process shares the two cores);
* the same with ``--workers 2`` (two guard processes on one port, SO_REUSEPORT);
* **100 ops per call**: one write of 100 puts, direct and through ``Write``.

Each guard row also says how much CPU the guard used, and this process (the client),
in cores (CPU seconds per second). The direct Redis rows and the guard use the same
redis-py client setup (:mod:`serving.redis_db`: commands packed by hiredis), and each
direct baseline is measured before and after the guard rows, the better run kept, so
the ratios err against the guard.
The question the ratios answer: what share of what the backend itself does for the
same check-and-write reaches a client through the guard?
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import grpc.aio
import psycopg
from psycopg import sql

from bench import postgres as pg_bench
from bench import redis as redis_bench
from bench.harness import Result, Server, fresh_value, measure, progress, server
from fencing.client.async_write_stream import AsyncWriteStream
from fencing.types import Claim, Put
from fencing.v1 import guard_pb2, guard_pb2_grpc
from guard.stores.redis import WRITE_LUA
from serving import redis_db

T = TypeVar("T")
BIG = 100  # ops in one write of the "100 ops per call" rows
#: WriteStream shape: streams x writers per stream (through the SDK), and for the
#: pipelined client: messages in flight per stream x writes per message.
STREAMS = 4
WRITERS = 64
DEPTH = 4
PER_MESSAGE = 64


def _put(key: str = "k") -> guard_pb2.Op:
    return guard_pb2.Op(put=guard_pb2.Put(key=key, value=fresh_value()))


def _two(build: Callable[[int], T], i: int) -> Callable[[], T]:
    """Two pre-built variants of ``build(i)``, handed out in turn: a re-sent pre-built
    call still changes every value it writes (each variant's values differ from the
    other's, :func:`fresh_value` giving each a new one)."""
    variants, turn = (build(i), build(i)), itertools.count()
    return lambda: variants[next(turn) % 2]


async def through_guard(
    guard: Server,
    label: str,
    direct: str,
    clients: int,
    duration: float,
    *,
    streams: int = STREAMS,
    writers: int = WRITERS,
    unary: bool = True,
    big: str = "",
) -> list[Result]:
    """Unary Write (N clients), WriteStream (S x W) and, with ``big``, Write of 100 ops."""
    results: list[Result] = []
    channels = [grpc.aio.insecure_channel(guard.address) for _ in range(max(clients, streams))]
    stubs = [guard_pb2_grpc.GuardServiceStub(c) for c in channels]
    try:
        if unary:
            requests = [
                guard_pb2.WriteRequest(resource=f"tp-{label}-{i}", token=1, ops=[_put()])
                for i in range(clients)
            ]

            async def write(i: int) -> None:
                request = requests[i]
                request.ops[0].put.value = fresh_value()
                await stubs[i].Write(request)

            progress(f"{label}: Write, {clients} clients")
            results.append(
                await _with_cpu(
                    guard, measure(f"{label}: Write", write, clients, duration, baseline=direct)
                )
            )
        opened = [AsyncWriteStream(c) for c in channels[:streams]]
        async with contextlib.AsyncExitStack() as stack:
            for stream in opened:
                await stack.enter_async_context(stream)
            n = streams * writers
            claims = [Claim(f"ts-{label}-{i}", 1) for i in range(n)]

            async def streamed(i: int) -> None:
                await opened[i % streams].write(claims[i], Put("k", fresh_value()))

            name = f"{label}: WriteStream {streams}x{writers} (SDK)"
            progress(f"{name} writers")
            results.append(
                await _with_cpu(guard, measure(name, streamed, n, duration, baseline=direct))
            )
        name = f"{label}: WriteStream {streams}x{DEPTH}x{PER_MESSAGE} (pipelined)"
        progress(name)
        results.append(
            await _with_cpu(guard, pipelined(channels[:streams], label, name, direct, duration))
        )
        if big:

            def big_request(i: int) -> guard_pb2.WriteRequest:
                ops = [_put(f"k{j}") for j in range(BIG)]
                return guard_pb2.WriteRequest(resource=f"tb-{label}-{i}", token=1, ops=ops)

            bigs = [_two(big_request, i) for i in range(clients)]

            async def write_big(i: int) -> None:
                await stubs[i].Write(bigs[i]())

            progress(f"{label}: Write of {BIG} ops, {clients} clients")
            results.append(
                await _with_cpu(
                    guard,
                    measure(
                        f"{label}: Write, {BIG} ops per call",
                        write_big,
                        clients,
                        duration,
                        per_call=BIG,
                        baseline=big,
                    ),
                )
            )
    finally:
        for c in channels:
            await c.close()
    return results


async def pipelined(
    channels: Sequence[grpc.aio.Channel], label: str, name: str, direct: str, duration: float
) -> Result:
    """Each stream keeps DEPTH messages of PER_MESSAGE one-op writes in flight, pre-built,
    as the direct Redis baseline keeps pipelines of pre-built calls: what a client that
    pipelines its writes gets. Latencies are per message (PER_MESSAGE writes each)."""
    latencies: list[float] = []
    written = 0

    async def one(s: int, channel: grpc.aio.Channel) -> None:
        nonlocal written
        stub = guard_pb2_grpc.GuardServiceStub(channel)
        call = stub.WriteStream()

        def message(m: int) -> guard_pb2.WriteStreamRequest:
            return guard_pb2.WriteStreamRequest(
                writes=[
                    guard_pb2.StreamedWrite(
                        id=m * PER_MESSAGE + j,
                        write=guard_pb2.WriteRequest(
                            resource=f"tp-{label}-{s}-{m}-{j}", token=1, ops=[_put()]
                        ),
                    )
                    for j in range(PER_MESSAGE)
                ]
            )

        messages = [_two(message, m) for m in range(DEPTH)]
        sent: dict[int, float] = {}
        until = time.perf_counter() + duration
        for m, next_message in enumerate(messages):
            sent[m] = time.perf_counter()
            await call.write(next_message())
        while True:
            response: Any = await call.read()
            if response is grpc.aio.EOF:
                break
            verdicts = response.verdicts  # a WriteStreamResponse (aio's read() is untyped)
            m = verdicts[0].id // PER_MESSAGE
            if any(v.WhichOneof("outcome") != "ok" for v in verdicts):
                raise RuntimeError(f"a pipelined write was refused: {verdicts[0]}")
            latencies.append(time.perf_counter() - sent.pop(m))
            written += len(verdicts)
            if time.perf_counter() < until:
                sent[m] = time.perf_counter()
                await call.write(messages[m]())
            elif not sent:
                await call.done_writing()

    started = time.perf_counter()
    await asyncio.gather(*(one(s, c) for s, c in enumerate(channels)))
    return Result(
        name,
        len(channels) * DEPTH * PER_MESSAGE,
        written,
        time.perf_counter() - started,
        latencies,
        baseline=direct,
    )


def _runs(first: Result, again: Result) -> str:
    rates = f"{first.rate:,.0f} and {again.rate:,.0f}"
    return f"the better of two runs, before and after the guard rows: {rates}"


async def _with_cpu(guard: Server, measuring: Any) -> Result:
    """Run a measurement and note the guard's CPU use (cores) during it."""
    cpu0, own0, t0 = guard.cpu_seconds(), time.process_time(), time.perf_counter()
    result: Result = await measuring
    took = time.perf_counter() - t0
    cores = (guard.cpu_seconds() - cpu0) / took
    client = (time.process_time() - own0) / took
    return replace(result, note=f"guard {cores:.2f} cores, client {client:.2f}")


# -- PostgreSQL ---------------------------------------------------------------------------------

PG_DIRECT = "pg direct: guard_write (psycopg)"
PG_DIRECT_BIG = f"pg direct: guard_write, {BIG} ops per call"


async def postgres(clients: int, duration: float, dsn: str, workers: Sequence[int]) -> list[Result]:
    try:
        await (await psycopg.AsyncConnection.connect(dsn, connect_timeout=3)).close()
    except psycopg.OperationalError as exc:
        raise ConnectionError(f"no PostgreSQL to measure: {exc}") from exc
    results: list[Result] = []
    async with pg_bench.bench_schema(dsn) as schema:
        call = sql.SQL("SELECT * FROM {}.guard_write(%s, %s, %s, %s, '', 'monotonic')").format(
            sql.Identifier(schema)
        )
        async with pg_bench.connections(dsn, clients) as conns:

            async def direct(i: int) -> None:
                await conns[i].execute(call, (f"pd-{i}", 1, ["k"], [fresh_value()]))

            keys = [f"k{j}" for j in range(BIG)]
            values = _two(lambda _: [fresh_value() for _ in range(BIG)], 0)

            async def direct_big(i: int) -> None:
                await conns[i].execute(call, (f"pb-{i}", 1, keys, values()))

            progress(f"{PG_DIRECT}, {clients} connections")
            first = await measure(PG_DIRECT, direct, clients, duration)
            progress(f"{PG_DIRECT_BIG}, {clients} connections")
            results.append(
                await measure(PG_DIRECT_BIG, direct_big, clients, duration, per_call=BIG)
            )
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
        for n in workers:
            label = "pg guard" if n == 1 else f"pg guard x{n} workers"
            with server("guard", "--store", url, "--workers", str(n)) as guard:
                results += await through_guard(
                    guard,
                    label,
                    PG_DIRECT,
                    clients,
                    duration,
                    unary=n == 1,
                    big=PG_DIRECT_BIG if n == 1 else "",
                )
        # The baseline again after the guard rows; the better run is kept (see redis()).
        async with pg_bench.connections(dsn, clients) as conns:
            progress(f"{PG_DIRECT} again, {clients} connections")
            again = await measure(PG_DIRECT, direct, clients, duration)
        best = max(first, again, key=lambda r: r.rate)
        results.insert(0, replace(best, note=_runs(first, again)))
    return results


# -- Redis --------------------------------------------------------------------------------------

REDIS_DIRECT = "redis direct: write.lua pipelined x32 (redis-py)"
REDIS_DIRECT_BIG = f"redis direct: write.lua, {BIG} ops per call"


async def _redis_big(url: str, clients: int, duration: float, prefix: str) -> Result:
    client = await redis_db.connect(redis_db.parse_url(url))
    try:
        sha = await client.script_load(WRITE_LUA)

        def ops() -> list[Any]:
            return [x for j in range(BIG) for x in ("P", f"k{j}", fresh_value())]

        def call_args(i: int) -> list[Any]:
            keys = redis_db.ResourceKeys(prefix, f"rb-{i}")
            return [keys.fence, keys.data, keys.idempotency(""), keys.lease]

        def task_args(i: int) -> list[Any]:
            return [*call_args(i), "1", "monotonic", "0", 1000, BIG, *ops()]

        per_task = [_two(task_args, i) for i in range(clients)]

        async def op(i: int) -> None:
            await client.evalsha(sha, 4, *per_task[i]())

        return await measure(REDIS_DIRECT_BIG, op, clients, duration, per_call=BIG)
    finally:
        await client.aclose()


async def redis(clients: int, duration: float, url: str, workers: Sequence[int]) -> list[Result]:
    prefix = f"tput{os.getpid()}"
    results: list[Result] = []
    try:
        progress(f"{REDIS_DIRECT}, {clients} clients")
        direct = await redis_bench.write_script(url, clients, duration, prefix, depth=32)
        progress(f"{REDIS_DIRECT_BIG}, {clients} clients")
        big = await _redis_big(url, clients, duration, prefix)
        store_url = f"{url}{'&' if '?' in url else '?'}prefix={prefix}"
        guarded: list[Result] = []
        for n in workers:
            label = "redis guard" if n == 1 else f"redis guard x{n} workers"
            with server("guard", "--store", store_url, "--workers", str(n)) as guard:
                guarded += await through_guard(
                    guard,
                    label,
                    REDIS_DIRECT,
                    clients,
                    duration,
                    unary=n == 1,
                    big=REDIS_DIRECT_BIG if n == 1 else "",
                )
        # The machine's load moves: measure the baseline again after the guard rows and
        # keep the better run (the ratios are then conservative).
        progress(f"{REDIS_DIRECT} again, {clients} clients")
        again = await redis_bench.write_script(url, clients, duration, prefix, depth=32)
        best = max(direct, again, key=lambda r: r.rate)
        results.append(replace(best, name=REDIS_DIRECT, baseline="", note=_runs(direct, again)))
        results.append(big)
        results += guarded
    except OSError as exc:
        raise ConnectionError(f"no Redis to measure: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await redis_bench.drop(url, prefix)
    return results


async def run(
    clients: Sequence[int],
    duration: float,
    *,
    dsn: str | None = None,
    url: str | None = None,
    workers: Sequence[int] = (1, 2),
    only: Sequence[str] = ("postgres", "redis"),
) -> list[Result]:
    """Both backends (each skipped with a note if unreachable), at the largest client count."""
    n = max(clients)
    results: list[Result] = []
    if "postgres" in only:
        results += await postgres(n, duration, dsn or pg_bench.default_dsn(), workers)
    if "redis" in only:
        results += await redis(n, duration, url or redis_bench.default_url(), workers)
    return results
