"""Does the state's size show in latency? 1,000 resources against 1,000,000, in one run.

For each backend (PostgreSQL, Redis, SQLite; an unreachable one is skipped), two
separate namespaces are filled directly in the backend (bulk SQL, server-side Lua;
never through RPC): one with 1,000 resources, one with 1,000,000, each resource with
a counter (its last token), a fence and one stored value. A lease server and a guard
are started on each, and one client measures, on resources drawn uniformly at random:

* ``Acquire`` latency (the lease is released after, untimed);
* a one-op guarded ``Write`` latency (token = the populated fence: accepted).

One client alternates between the two sizes call by call, so that changes in the
machine's load hit both alike. The note of each large row gives its p50 and p99
latency against the small row's (the ratio column compares ops/s, as everywhere);
the target is at most 1.3x for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import psycopg
from psycopg import sql

from bench import postgres as pg_bench
from bench import redis as redis_bench
from bench.harness import Result, Server, fresh_value, progress, server
from fencing.v1 import guard_pb2, guard_pb2_grpc, lease_pb2, lease_pb2_grpc
from serving import redis_db

SMALL = 1_000
LARGE = 1_000_000
FENCE = 5  # every populated resource: counter 5, fence 5, data written by token 5
VALUE = b"v" * 64


def name(i: int) -> str:
    return f"r{i}"


@dataclass
class Target:
    """One populated namespace: its size and the URLs its servers use."""

    size: int
    backend: str
    store: str


# -- populating, directly in each backend ----------------------------------------------------


async def populate_postgres(dsn: str, schema: str, size: int) -> None:
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in (
            "INSERT INTO {}.leases (resource, counter) SELECT 'r' || g, %s"
            " FROM generate_series(1, %s) AS g",
            "INSERT INTO {}.fences (resource, fence) SELECT 'r' || g, %s"
            " FROM generate_series(1, %s) AS g",
        ):
            await conn.execute(sql.SQL(statement).format(s), (FENCE, size))
        await conn.execute(
            sql.SQL(
                "INSERT INTO {}.data (resource, key, value, token)"
                " SELECT 'r' || g, 'k', %s, %s FROM generate_series(1, %s) AS g"
            ).format(s),
            (VALUE, FENCE, size),
        )
        for table in ("leases", "fences", "data"):
            await conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(table)))


#: Creates or deletes the keys of resources r<first>..r<last> (names without braces, so
#: each resource's hash tag is its name: the layout of serving.redis_db).
_FILL_LUA = """
local p, first, last, fence, value = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
for i = first, last do
  local base = p .. ':{r' .. i .. '}'
  if fence == '' then
    redis.call('UNLINK', base .. ':counter', base .. ':fence', base .. ':data')
  else
    redis.call('SET', base .. ':counter', fence)
    redis.call('SET', base .. ':fence', fence)
    redis.call('HSET', base .. ':data', 'k', fence .. ':' .. value)
  end
end
return last - first + 1
"""
_CHUNK = 20_000


async def fill_redis(url: str, prefix: str, size: int, *, delete: bool = False) -> None:
    """Populate (or delete) ``size`` resources with server-side Lua, 20,000 per call.

    The script names keys it was not given, so it runs on one Redis, not a cluster.
    """
    client = await redis_db.connect(redis_db.parse_url(url))
    try:
        script = client.register_script(_FILL_LUA)
        for first in range(1, size + 1, _CHUNK):
            last = min(size, first + _CHUNK - 1)
            fence = "" if delete else str(FENCE)
            await script(args=[prefix, first, last, fence, VALUE])
    finally:
        await client.aclose()


def populate_sqlite(leases_db: Path, guard_db: Path, size: int) -> None:
    """Create the schemas through the real backends' migrations, then bulk-insert."""
    from guard.stores.sqlite import MIGRATIONS as GUARD
    from lease_server.backends.sqlite import MIGRATIONS as LEASES

    for path, migrations, rows in (
        (leases_db, LEASES, [("leases (resource, counter)", (FENCE,))]),
        (
            guard_db,
            GUARD,
            [("fences (resource, fence)", (FENCE,)), ("data (resource, key, value, token)", ())],
        ),
    ):
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN")
            for number, script in enumerate(migrations, start=1):
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")
            for table, extra in rows:
                if table.startswith("data"):
                    conn.executemany(
                        f"INSERT INTO {table} VALUES (?, 'k', ?, ?)",
                        ((name(i), VALUE, FENCE) for i in range(1, size + 1)),
                    )
                else:
                    conn.executemany(
                        f"INSERT INTO {table} VALUES (?, ?)",
                        ((name(i), *extra) for i in range(1, size + 1)),
                    )
            conn.execute("COMMIT")
        finally:
            conn.close()


# -- measuring -------------------------------------------------------------------------------


@contextmanager
def servers(target: Target) -> Iterator[tuple[Server, Server]]:
    with (
        server("lease_server", "--backend", target.backend) as lease,
        server("guard", "--store", target.store) as guard,
    ):
        yield lease, guard


class Client:
    """Stubs on one namespace's servers."""

    def __init__(self, lease: Server, guard: Server, size: int) -> None:
        self.size = size
        self._channels = [
            grpc.aio.insecure_channel(lease.address),
            grpc.aio.insecure_channel(guard.address),
        ]
        self.leases = lease_pb2_grpc.LeaseServiceStub(self._channels[0])
        self.guards = guard_pb2_grpc.GuardServiceStub(self._channels[1])

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def acquire(self, rng: random.Random) -> float:
        """Acquire a random resource (timed), then release it (untimed)."""
        resource = name(rng.randint(1, self.size))
        started = time.perf_counter()
        granted = await self.leases.Acquire(
            lease_pb2.AcquireRequest(resource=resource, holder="scale", ttl_ms=10_000)
        )
        took = time.perf_counter() - started
        await self.leases.Release(
            lease_pb2.ReleaseRequest(resource=resource, token=granted.token, holder="scale")
        )
        return took

    async def write(self, rng: random.Random) -> float:
        request = guard_pb2.WriteRequest(
            resource=name(rng.randint(1, self.size)),
            token=FENCE,
            ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=fresh_value()))],
        )
        started = time.perf_counter()
        await self.guards.Write(request)
        return time.perf_counter() - started


async def compare(label: str, small: Target, large: Target, seconds: float) -> list[Result]:
    """One client alternates between the two sizes call by call (so load changes on the
    machine hit both alike): Acquire for half of ``seconds``, then Write."""
    samples: dict[tuple[int, str], list[float]] = {}
    rng = random.Random(1)
    with servers(small) as (sl, sg), servers(large) as (ll, lg):
        clients = [Client(sl, sg, small.size), Client(ll, lg, large.size)]
        try:
            for op in ("acquire", "write"):
                for warm in (True, False):  # an untimed pass warms connections and caches
                    until = time.perf_counter() + (0.3 if warm else seconds / 2)
                    while time.perf_counter() < until:
                        for client in clients:
                            took = await (client.acquire if op == "acquire" else client.write)(rng)
                            if not warm:
                                samples.setdefault((client.size, op), []).append(took)
        finally:
            for client in clients:
                await client.close()
    results = []
    for op, what in (("acquire", "Acquire"), ("write", "Write (1 op)")):
        base = f"{label}: {what}, {small.size:,} resources"
        for size in (small.size, large.size):
            lat = samples[(size, op)]
            results.append(
                Result(
                    f"{label}: {what}, {size:,} resources",
                    1,
                    len(lat),
                    sum(lat),
                    lat,
                    baseline="" if size == small.size else base,
                )
            )
    for name_, p50, p99 in p50_ratio(results):
        row = next(r for r in results if r.name == name_)
        row.note = f"latency p50 {p50:.2f}x, p99 {p99:.2f}x"
    return results


def p50_ratio(results: Sequence[Result]) -> list[tuple[str, float, float]]:
    """(row, p50 ratio, p99 ratio) of each large row against its small baseline."""
    out = []
    for r in results:
        base = next((b for b in results if b.name == r.baseline), None)
        if base is not None:
            out.append(
                (
                    r.name,
                    r.percentile(0.5) / base.percentile(0.5),
                    r.percentile(0.99) / base.percentile(0.99),
                )
            )
    return out


# -- per backend -------------------------------------------------------------------------------


async def postgres(seconds: float, dsn: str, large: int = LARGE) -> list[Result]:
    try:
        await (await psycopg.AsyncConnection.connect(dsn, connect_timeout=3)).close()
    except psycopg.OperationalError as exc:
        raise ConnectionError(f"no PostgreSQL to measure: {exc}") from exc
    async with pg_bench.bench_schema(dsn) as s_small, pg_bench.bench_schema(dsn) as s_large:
        started = time.perf_counter()
        progress(f"postgres: populating {SMALL:,} and {large:,} resources (bulk SQL)")
        await populate_postgres(dsn, s_small, SMALL)
        await populate_postgres(dsn, s_large, large)
        progress(f"postgres: populated in {time.perf_counter() - started:.0f} s; measuring")
        sep = "&" if "?" in dsn else "?"
        small_url, large_url = f"{dsn}{sep}schema={s_small}", f"{dsn}{sep}schema={s_large}"
        return await compare(
            "postgres",
            Target(SMALL, small_url, small_url),
            Target(large, large_url, large_url),
            seconds,
        )


async def redis(seconds: float, url: str, large: int = LARGE) -> list[Result]:
    small_prefix, large_prefix = f"scale{os.getpid()}s", f"scale{os.getpid()}l"
    try:
        started = time.perf_counter()
        progress(f"redis: populating {SMALL:,} and {large:,} resources (server-side Lua)")
        await fill_redis(url, small_prefix, SMALL)
        await fill_redis(url, large_prefix, large)
        progress(f"redis: populated in {time.perf_counter() - started:.0f} s; measuring")
        sep = "&" if "?" in url else "?"
        small_url = f"{url}{sep}prefix={small_prefix}"
        large_url = f"{url}{sep}prefix={large_prefix}"
        return await compare(
            "redis",
            Target(SMALL, small_url, small_url),
            Target(large, large_url, large_url),
            seconds,
        )
    except OSError as exc:
        raise ConnectionError(f"no Redis to measure: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await fill_redis(url, small_prefix, SMALL, delete=True)
            await fill_redis(url, large_prefix, large, delete=True)
            await redis_bench.drop(url, small_prefix)
            await redis_bench.drop(url, large_prefix)


@asynccontextmanager
async def _sqlite_dirs() -> AsyncIterator[tuple[Path, Path]]:
    with (
        tempfile.TemporaryDirectory(prefix="fencing-scale-") as a,
        tempfile.TemporaryDirectory(prefix="fencing-scale-") as b,
    ):
        yield Path(a), Path(b)


async def sqlite(seconds: float, large: int = LARGE) -> list[Result]:
    async with _sqlite_dirs() as (small_dir, large_dir):
        started = time.perf_counter()
        progress(f"sqlite: populating {SMALL:,} and {large:,} resources (bulk inserts)")
        for directory, size in ((small_dir, SMALL), (large_dir, large)):
            await asyncio.to_thread(
                populate_sqlite, directory / "leases.db", directory / "guard.db", size
            )
        progress(f"sqlite: populated in {time.perf_counter() - started:.0f} s; measuring")
        return await compare(
            "sqlite",
            Target(SMALL, f"sqlite:{small_dir / 'leases.db'}", f"sqlite:{small_dir / 'guard.db'}"),
            Target(large, f"sqlite:{large_dir / 'leases.db'}", f"sqlite:{large_dir / 'guard.db'}"),
            seconds,
        )


async def run(
    seconds: float,
    *,
    dsn: str | None = None,
    url: str | None = None,
    large: int = LARGE,
    only: Sequence[str] = ("postgres", "redis", "sqlite"),
) -> list[Result]:
    """Every backend in ``only``; ``seconds`` of sampling per size and backend."""
    results: list[Result] = []
    if "postgres" in only:
        results += await postgres(seconds, dsn or pg_bench.default_dsn(), large)
    if "redis" in only:
        results += await redis(seconds, url or redis_bench.default_url(), large)
    if "sqlite" in only:
        results += await sqlite(seconds, large)
    return results
