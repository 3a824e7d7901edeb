"""What does a fenced write cost on PostgreSQL, and where does the time go?

Measured from this one process against a fresh schema (migrated, dropped after),
every worker on its own resource and connection:

* ``SELECT 1``: the round-trip floor of the connection (the baseline);
* the guard's check-and-write as the store runs it: one ``guard_write`` call, one
  round trip, its own transaction;
* the same check-and-write as a client-side transaction (BEGIN; lock the fence
  row; the pure rule in Python; upsert the data; COMMIT), five round trips: what
  the plpgsql function saves;
* ``guard_write`` batched: 100 calls pipelined in one transaction (one commit);
* ``PostgresStore.write``: the function behind the pool, its connection check
  and the timeout (what the guard service pays per write);
* with ``servers=True``, Acquire+Release and a one-op Write through real lease
  server and guard processes on the same schema, against the empty gRPC call
  measured on the lease server's stack (as :mod:`bench.floor` does).

``direct_write(dsn, concurrency, duration)`` gives the headline figure alone.
``python -m bench.postgres [--duration S] [--clients 1,16] [--dsn URL] [--servers]``
(``FENCING_BENCH_POSTGRES_DSN``, default the local test database); :func:`run`
plugs into ``python -m bench`` like :func:`bench.floor.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import Result, fresh_value, measure, progress, server, server_process, table
from fencing.types import Put
from guard.fence import admit
from guard.stores.postgres import PostgresStore
from serving.postgres_db import migrate

FLOOR = "postgres: SELECT 1 (floor)"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BATCH = 100


@asynccontextmanager
async def bench_schema(dsn: str) -> AsyncIterator[str]:
    """A freshly migrated schema, dropped on exit."""
    schema = f"bench_{secrets.token_hex(4)}"
    await migrate(dsn, schema)
    try:
        yield schema
    finally:
        await _drop(dsn, schema)


async def _drop(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


@asynccontextmanager
async def connections(dsn: str, n: int) -> AsyncIterator[list[psycopg.AsyncConnection[Any]]]:
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(n)]
    try:
        yield conns
    finally:
        for conn in conns:
            await conn.close()


def _queries(schema: str) -> dict[str, sql.Composed]:
    s = sql.Identifier(schema)
    return {
        "write": sql.SQL("SELECT * FROM {}.guard_write(%s, %s, %s, %s, '', 'monotonic')").format(s),
        "insert_fence": sql.SQL(
            "INSERT INTO {}.fences (resource, fence) VALUES (%s, 0) ON CONFLICT DO NOTHING"
        ).format(s),
        "lock_fence": sql.SQL("SELECT fence FROM {}.fences WHERE resource = %s FOR UPDATE").format(
            s
        ),
        "upsert": sql.SQL(
            "INSERT INTO {}.data (resource, key, value, token) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (resource, key) DO UPDATE SET value = excluded.value,"
            " token = excluded.token"
        ).format(s),
        "advance": sql.SQL("UPDATE {}.fences SET fence = %s WHERE resource = %s").format(s),
    }


async def _direct(
    dsn: str, schema: str, n: int, duration: float, variants: Sequence[str]
) -> list[Result]:
    q = _queries(schema)
    results: list[Result] = []
    async with connections(dsn, n) as conns:

        async def floor(i: int) -> None:
            await conns[i].execute("SELECT 1")

        async def function(i: int) -> None:
            await conns[i].execute(q["write"], (f"bench-{i}", 1, ["k"], [fresh_value()]))

        async def client_side(i: int) -> None:
            conn, resource = conns[i], f"bench-{i}"
            async with conn.transaction():
                await conn.execute(q["insert_fence"], (resource,))
                cur = await conn.execute(q["lock_fence"], (resource,))
                row = await cur.fetchone()
                assert row is not None
                fence = admit(resource, 1, row[0])
                await conn.execute(q["upsert"], (resource, "k", fresh_value(), 1))
                if fence != row[0]:
                    await conn.execute(q["advance"], (fence, resource))

        async def batched(i: int) -> None:
            conn, resource = conns[i], f"bench-{i}"
            async with conn.transaction(), conn.pipeline():
                for j in range(BATCH):
                    await conn.execute(q["write"], (resource, 1, [f"k{j}"], [fresh_value()]))

        ops = {
            "floor": (FLOOR, floor, 1),
            "function": ("postgres: guard_write (1 round trip)", function, 1),
            "client": ("postgres: client-side txn, 5 round trips", client_side, 1),
            "batched": (f"postgres: guard_write x{BATCH} per transaction", batched, BATCH),
        }
        for key in ("floor", *variants):
            name, op, per_call = ops[key]
            progress(f"{name}, {n} connections")
            results.append(
                await measure(
                    name,
                    op,
                    n,
                    duration,
                    per_call=per_call,
                    baseline="" if key == "floor" else FLOOR,
                )
            )
    return results


async def _through_store(dsn: str, schema: str, n: int, duration: float) -> Result:
    store = PostgresStore(dsn, schema)
    await store.open()
    try:

        async def write(i: int) -> None:
            await store.write(f"bench-{i}", 1, [Put("k", fresh_value())])

        name = "postgres: PostgresStore.write (pool+check)"
        progress(f"{name}, {n} tasks")
        return await measure(name, write, n, duration, baseline=FLOOR)
    finally:
        await store.close()


async def direct_write(
    dsn: str, concurrency: int, duration: float, *, batch: bool = False
) -> dict[str, float]:
    """Check-and-write ops/s of ``guard_write`` run directly with psycopg (p50/p99 in ms).

    ``batch=True`` pipelines 100 writes per transaction; ops counts every write.
    """
    async with bench_schema(dsn) as schema:
        floor, result = await _direct(
            dsn, schema, concurrency, duration, ["batched" if batch else "function"]
        )
    return {
        "ops_per_s": result.rate,
        "p50_ms": result.percentile(0.5) * 1000,
        "p99_ms": result.percentile(0.99) * 1000,
        "floor_ops_per_s": floor.rate,
        "concurrency": concurrency,
    }


async def run(
    clients: Sequence[int],
    duration: float,
    dsn: str | None = None,
    *,
    servers: bool = False,
) -> list[Result]:
    """Every measurement above at each client count (see the module doc)."""
    dsn = dsn or default_dsn()
    results: list[Result] = []
    try:
        await (await psycopg.AsyncConnection.connect(dsn, connect_timeout=3)).close()
    except psycopg.OperationalError as exc:  # python -m bench skips the section
        raise ConnectionError(f"no PostgreSQL to measure: {exc}") from exc
    async with bench_schema(dsn) as schema:
        for n in clients:
            results += await _direct(dsn, schema, n, duration, ["function", "client", "batched"])
            results.append(await _through_store(dsn, schema, n, duration))
        if servers:
            from bench.floor import run_servers_bench

            url = _with_schema(dsn, schema)
            with (
                server("lease_server", "--backend", url) as lease,
                server_process("guard", "--store", url) as guard_addr,
            ):
                results += await run_servers_bench(lease, guard_addr, "postgres", clients, duration)
    return results


def default_dsn() -> str:
    return os.environ.get("FENCING_BENCH_POSTGRES_DSN", DEFAULT_DSN)


def _with_schema(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument("--dsn", default=default_dsn(), help="PostgreSQL URL (default %(default)s)")
    p.add_argument("--servers", action="store_true", help="also through gRPC servers")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c]
    results = asyncio.run(run(clients, args.duration, args.dsn, servers=args.servers))
    print(table(results, "PostgreSQL: check-and-write against SELECT 1"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
