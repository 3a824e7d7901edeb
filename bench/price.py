"""The price of fencing, per store: a guarded write against the same write done directly.

For SQLite, PostgreSQL and Redis (a store whose server is unreachable is skipped with a
note), at the largest client count, every writer on its own resource and every write a
64-byte value that changes on every write (:func:`bench.harness.fresh_value`: a
rewritten constant can leave a store nothing to commit):

* **direct** (the baseline): the same upsert an application would do with no fencing,
  one transaction each, from this process: SQLite, ``BEGIN IMMEDIATE``; upsert;
  ``COMMIT`` on one connection opened as the store opens its own (WAL,
  ``synchronous=FULL``) and driven from its own thread, as the store drives it;
  PostgreSQL, one autocommitted ``INSERT ... ON CONFLICT DO UPDATE`` per call on a
  connection per client; Redis, one ``HSET`` of the key in the resource's hash, as
  the store keeps it (a command is its own transaction);
* **guard Write**: unary ``Write`` (one op) through a guard process on that store;
* **guard WriteStream**: the SDK's :class:`AsyncWriteStream`, S streams x W writers, one
  op per write (the guard's group commit packs what arrives together).

The ratio is the guarded rate over the direct one: the share of the backend's own
write that reaches a client through the guard, check included. Each row notes the CPU
per write of the guard process and of this process (the client; for the direct SQLite
row that includes SQLite itself, which runs in this process). The memory store has no
direct write to compare with and is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc.aio
import psycopg
from psycopg import sql

from bench import postgres as pg_bench
from bench import redis as redis_bench
from bench.harness import Result, Server, fresh_value, measure, progress, server
from fencing.client.async_write_stream import AsyncWriteStream
from fencing.types import Claim, Put
from fencing.v1 import guard_pb2, guard_pb2_grpc
from serving import redis_db
from serving.sqlite_db import BUSY_TIMEOUT_MS

STREAMS = 4
WRITERS = 64


def direct_name(store: str) -> str:
    return f"{store}: direct upsert, one transaction each"


def unary_name(store: str) -> str:
    return f"{store}: guard Write (1 op)"


def stream_name(store: str) -> str:
    return f"{store}: guard WriteStream {STREAMS}x{WRITERS} (SDK)"


async def _cpu(measuring: Awaitable[Result], guard: Server | None = None) -> Result:
    """Run a measurement; note the guard's and this process's CPU per write."""
    guard0 = guard.cpu_seconds() if guard else 0.0
    own0 = time.process_time()
    result = await measuring
    own = time.process_time() - own0
    parts = []
    if guard is not None:
        result.server_cpu = guard.cpu_seconds() - guard0
        parts.append(f"guard CPU {result.cpu_per_op * 1e6:,.0f} us/write")
    if result.ops:
        parts.append(f"client CPU {own / result.ops * 1e6:,.0f} us/write")
    result.note = ", ".join(parts)
    return result


async def _through_guard(guard: Server, store: str, clients: int, duration: float) -> list[Result]:
    channels = [grpc.aio.insecure_channel(guard.address) for _ in range(max(clients, STREAMS))]
    stubs = [guard_pb2_grpc.GuardServiceStub(c) for c in channels]
    base = direct_name(store)
    results: list[Result] = []
    try:
        requests = [
            guard_pb2.WriteRequest(
                resource=f"price-u{i}", token=1, ops=[guard_pb2.Op(put=guard_pb2.Put(key="k"))]
            )
            for i in range(clients)
        ]

        async def write(i: int) -> None:
            request = requests[i]
            request.ops[0].put.value = fresh_value()
            await stubs[i].Write(request)

        progress(f"{unary_name(store)}, {clients} clients")
        results.append(
            await _cpu(measure(unary_name(store), write, clients, duration, baseline=base), guard)
        )
        streams = [AsyncWriteStream(c) for c in channels[:STREAMS]]
        async with contextlib.AsyncExitStack() as stack:
            for stream in streams:
                await stack.enter_async_context(stream)
            claims = [Claim(f"price-s{i}", 1) for i in range(STREAMS * WRITERS)]

            async def streamed(i: int) -> None:
                await streams[i % STREAMS].write(claims[i], Put("k", fresh_value()))

            progress(f"{stream_name(store)} writers")
            measuring = measure(stream_name(store), streamed, len(claims), duration, baseline=base)
            results.append(await _cpu(measuring, guard))
    finally:
        for c in channels:
            await c.close()
    return results


# -- SQLite -------------------------------------------------------------------------------------

SQLITE_TABLE = (
    "CREATE TABLE data (resource TEXT, key TEXT, value BLOB, PRIMARY KEY (resource, key))"
)
SQLITE_UPSERT = (
    "INSERT INTO data (resource, key, value) VALUES (?, 'k', ?)"
    " ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value"
)


async def sqlite(clients: int, duration: float) -> list[Result]:
    store = "sqlite"
    with tempfile.TemporaryDirectory(prefix="fencing-price-") as tmp:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct-sqlite")
        loop = asyncio.get_running_loop()

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(
                Path(tmp) / "direct.db", isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(SQLITE_TABLE)
            return conn

        conn = await loop.run_in_executor(executor, connect)

        def upsert(resource: str, value: bytes) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(SQLITE_UPSERT, (resource, value))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        resources = [f"price-d{i}" for i in range(clients)]

        async def direct(i: int) -> None:
            await loop.run_in_executor(executor, upsert, resources[i], fresh_value())

        try:
            progress(f"{direct_name(store)}, {clients} clients")
            results = [await _cpu(measure(direct_name(store), direct, clients, duration))]
        finally:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown()
        with server("guard", "--store", f"sqlite:{Path(tmp) / 'guard.db'}") as guard:
            results += await _through_guard(guard, store, clients, duration)
    return results


# -- PostgreSQL ---------------------------------------------------------------------------------


async def postgres(clients: int, duration: float, dsn: str) -> list[Result]:
    store = "postgres"
    try:
        await (await psycopg.AsyncConnection.connect(dsn, connect_timeout=3)).close()
    except psycopg.OperationalError as exc:
        raise ConnectionError(f"no PostgreSQL to measure: {exc}") from exc
    async with pg_bench.bench_schema(dsn) as schema:
        upsert = sql.SQL(
            "INSERT INTO {}.data (resource, key, value, token) VALUES (%s, 'k', %s, 0)"
            " ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value"
        ).format(sql.Identifier(schema))
        async with pg_bench.connections(dsn, clients) as conns:

            async def direct(i: int) -> None:
                await conns[i].execute(upsert, (f"price-d{i}", fresh_value()))

            progress(f"{direct_name(store)}, {clients} connections")
            results = [await _cpu(measure(direct_name(store), direct, clients, duration))]
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
        with server("guard", "--store", url) as guard:
            results += await _through_guard(guard, store, clients, duration)
    return results


# -- Redis --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _redis_prefix(url: str) -> AsyncIterator[str]:
    prefix = f"price{os.getpid()}"
    try:
        yield prefix
    finally:
        with contextlib.suppress(Exception):
            await redis_bench.drop(url, prefix)


async def redis(clients: int, duration: float, url: str) -> list[Result]:
    store = "redis"
    try:
        client = await redis_db.connect(redis_db.parse_url(url))
        await client.ping()
    except OSError as exc:
        raise ConnectionError(f"no Redis to measure: {exc}") from exc
    async with _redis_prefix(url) as prefix:
        try:
            keys = [redis_db.ResourceKeys(prefix, f"price-d{i}").data for i in range(clients)]

            async def direct(i: int) -> None:
                await client.hset(keys[i], "k", fresh_value())

            progress(f"{direct_name(store)}, {clients} clients")
            results = [await _cpu(measure(direct_name(store), direct, clients, duration))]
        finally:
            await client.aclose()
        store_url = f"{url}{'&' if '?' in url else '?'}prefix={prefix}"
        with server("guard", "--store", store_url) as guard:
            results += await _through_guard(guard, store, clients, duration)
    return results


STORES: dict[str, Callable[[int, float], Awaitable[list[Result]]]] = {
    "sqlite": sqlite,
    "postgres": lambda n, d: postgres(n, d, pg_bench.default_dsn()),
    "redis": lambda n, d: redis(n, d, redis_bench.default_url()),
}


async def run(
    clients: Sequence[int], duration: float, notes: list[str] | None = None
) -> list[Result]:
    """Every store (each skipped with a note when unreachable), at the largest client count."""
    results: list[Result] = []
    for name, one in STORES.items():
        try:
            results += await one(max(clients), duration)
        except (OSError, ConnectionError) as exc:
            if notes is None:
                raise
            notes.append(f"{name}: skipped ({type(exc).__name__}: {exc})")
    return results


def prices(results: Sequence[Result]) -> list[tuple[str, str]]:
    """(row, figure) per guarded row: its rate over the same store's direct write."""
    rows: list[tuple[str, str]] = []
    by_name: dict[str, Any] = {r.name: r for r in results}
    for r in results:
        base = by_name.get(r.baseline)
        if base is None or not base.rate:
            continue
        rows.append(
            (
                f"price of fencing, {r.name} / {r.baseline} ({r.concurrency} writers)",
                f"{r.rate:,.0f} / {base.rate:,.0f} writes/s = {r.rate / base.rate:.2f}x; {r.note}",
            )
        )
    return rows
