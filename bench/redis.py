"""Redis: what do our Lua scripts cost next to redis-py's own Lock and a bare round trip?

Measured from this one Python process against one Redis (``FENCING_BENCH_REDIS_URL``,
default ``redis://127.0.0.1:6379/0``), under a private key prefix removed afterwards:

* ``PING`` round trip: the floor every other row is compared with;
* redis-py's ``Lock``: acquire (``SET NX PX``) + release (its Lua script);
* :class:`~lease_server.backends.redis.RedisBackend` acquire + release (two scripts);
* the guard's ``write.lua`` as a raw ``EVALSHA`` (one put), one call per round trip;
* the same ``EVALSHA`` pipelined, ``depth`` calls per round trip (rate counts calls).

Optionally (``servers=True``) the lease server and the guard on this Redis, through
gRPC, as :mod:`bench.floor` measures them on SQLite.

``python -m bench.redis [--duration S] [--clients 1,16] [--url URL] [--servers]``;
:func:`run` plugs into ``python -m bench`` like :func:`bench.floor.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from redis.asyncio.lock import Lock
from redis.typing import EncodableT

from bench.harness import Result, fresh_value, measure, progress, server, server_process, table
from guard.stores.redis import WRITE_LUA
from lease_server.backends.redis import RedisBackend
from lease_server.leases import Grant
from serving import redis_db, urls

FLOOR = "redis PING (floor)"
LOCK = "redis-py Lock acquire+release"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def default_url() -> str:
    return os.environ.get("FENCING_BENCH_REDIS_URL", DEFAULT_URL)


async def ping(url: str, clients: int, duration: float) -> Result:
    """The round-trip floor: ``PING`` from ``clients`` concurrent tasks."""
    client = await redis_db.connect(redis_db.parse_url(url))
    try:

        async def op(i: int) -> None:
            await client.ping()

        return await measure(FLOOR, op, clients, duration)
    finally:
        await client.aclose()


async def redis_py_lock(url: str, clients: int, duration: float, prefix: str) -> Result:
    """redis-py's ``Lock``: acquire + release of an uncontended lock per task."""
    client = await redis_db.connect(redis_db.parse_url(url))
    locks = [Lock(client, f"{prefix}:lock:{i}", timeout=10, blocking=False) for i in range(clients)]
    try:

        async def op(i: int) -> None:
            if not await locks[i].acquire():
                raise RuntimeError("uncontended lock refused")
            await locks[i].release()

        return await measure(LOCK, op, clients, duration, baseline=FLOOR)
    finally:
        await client.aclose()


async def backend_acquire_release(url: str, clients: int, duration: float, prefix: str) -> Result:
    """Our lease backend: acquire.lua + release.lua on an uncontended resource per task."""
    backend = RedisBackend(url, prefix=prefix)
    await backend.open()
    try:

        async def op(i: int) -> None:
            grant = await backend.acquire(f"bench-{i}", f"c{i}", 10_000, "")
            assert isinstance(grant, Grant)
            await backend.release(grant.resource, grant.token, grant.holder)

        return await measure(
            "RedisBackend acquire+release (Lua)", op, clients, duration, baseline=LOCK
        )
    finally:
        await backend.close()


async def write_script(
    url: str, clients: int, duration: float, prefix: str, *, depth: int = 1
) -> Result:
    """``write.lua`` (check the fence, put one 64-byte value that changes on every call,
    advance) as raw EVALSHA.

    ``depth`` > 1 pipelines that many calls per round trip; the rate counts calls, the
    latencies are per round trip.
    """
    client = await redis_db.connect(redis_db.parse_url(url))
    try:
        sha = await client.script_load(WRITE_LUA)

        def call_args(i: int) -> list[EncodableT]:
            keys = redis_db.ResourceKeys(prefix, f"bench-{i}")
            return [
                *(keys.fence, keys.data, keys.idempotency(""), keys.lease),
                *("1", "monotonic", "0", 1000, 1, "P", "k", b""),
            ]

        per_task = [call_args(i) for i in range(clients)]

        async def single(i: int) -> None:
            per_task[i][-1] = fresh_value()
            outcome = await client.evalsha(sha, 4, *per_task[i])
            assert outcome[0] == b"ok"

        async def pipelined(i: int) -> None:
            pipe = client.pipeline(transaction=False)
            for _ in range(depth):
                per_task[i][-1] = fresh_value()
                pipe.evalsha(sha, 4, *per_task[i])
            await pipe.execute()

        if depth == 1:
            return await measure(
                "write.lua EVALSHA (1 op)", single, clients, duration, baseline=FLOOR
            )
        return await measure(
            f"write.lua EVALSHA pipelined x{depth}",
            pipelined,
            clients,
            duration,
            per_call=depth,
            baseline=FLOOR,
        )
    finally:
        await client.aclose()


async def run(
    clients: Sequence[int],
    duration: float,
    url: str | None = None,
    *,
    depth: int = 32,
    servers: bool = False,
) -> list[Result]:
    """Every Redis measurement at each client count (see the module doc)."""
    url = url or default_url()
    prefix = f"bench{os.getpid()}"
    results: list[Result] = []
    try:
        for n in clients:
            progress(f"redis floor / Lock / backend / write.lua, {n} clients")
            results.append(await ping(url, n, duration))
            results.append(await redis_py_lock(url, n, duration, prefix))
            results.append(await backend_acquire_release(url, n, duration, prefix))
            results.append(await write_script(url, n, duration, prefix))
            results.append(await write_script(url, n, duration, prefix, depth=depth))
        if servers:
            results += await through_servers(url, clients, duration, prefix)
    finally:
        await drop(url, prefix)
    return results


async def through_servers(
    url: str, clients: Sequence[int], duration: float, prefix: str
) -> list[Result]:
    """The lease server and the guard on this Redis, measured like bench.floor does."""
    from bench.floor import run_servers_bench

    sep = "&" if "?" in url else "?"
    with (
        server("lease_server", "--backend", f"{url}{sep}prefix={prefix}") as la,
        server_process("guard", "--store", f"{url}{sep}prefix={prefix}") as ga,
    ):
        return await run_servers_bench(la, ga, "redis", clients, duration)


async def drop(url: str, prefix: str) -> None:
    client = await redis_db.connect(redis_db.parse_url(url))
    try:
        for key in await redis_db.scan_keys(client, f"{redis_db.glob_escape(prefix)}:*"):
            await client.delete(key)
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.redis", description=__doc__)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument("--url", default=default_url(), help="Redis URL (default %(default)s)")
    p.add_argument("--depth", type=int, default=32, help="EVALSHA calls per pipeline")
    p.add_argument("--servers", action="store_true", help="also through gRPC servers")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c]
    results = asyncio.run(
        run(clients, args.duration, args.url, depth=args.depth, servers=args.servers)
    )
    print(table(results, f"Redis at {urls.redact(args.url)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
