"""Listing held leases: what does ``List`` cost next to describing each resource?

Before ``LeaseService.List`` an operator who wanted the held leases under a prefix had
to know the names and ``Describe`` each one. For each backend (memory, SQLite, and
PostgreSQL / Redis when reachable), this takes ``--leases`` leases under one prefix
(plus as many under another prefix, which a listing must skip), then measures, in the
same run against the same servers (in-process, real gRPC on loopback):

* baseline: one ``Describe`` per held resource (the names known in advance);
* ``list_held(prefix)`` with pages of 1,000 and of 100 (the default).

Each row is the time to enumerate every held lease once (best of ``--repeat``), and its
ratio is the baseline's time over the row's (higher: faster than describing each).

    python -m bench.listing [--leases 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fencing import LeaseClient
from fencing.testing import running_servers

POSTGRES_DSN = os.environ.get("FENCING_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1/test")
REDIS_URL = os.environ.get("FENCING_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@contextmanager
def backend_url(name: str) -> Iterator[str]:
    """A fresh, isolated backend of ``name``; dropped after (PostgreSQL schema, Redis keys)."""
    tag = uuid.uuid4().hex[:10]
    if name == "memory":
        yield "memory://"
    elif name == "sqlite":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:{tmp}/leases.db"
    elif name == "postgres":
        import psycopg

        schema = f"bench_list_{tag}"
        try:
            yield f"{POSTGRES_DSN}?schema={schema}"
        finally:
            with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    else:
        import redis

        prefix = f"bench-list-{tag}"
        try:
            yield f"{REDIS_URL}?prefix={prefix}"
        finally:
            client = redis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
            client.close()


def reachable(name: str) -> bool:
    try:
        if name == "postgres":
            import psycopg

            psycopg.connect(POSTGRES_DSN, connect_timeout=2).close()
        elif name == "redis":
            import redis

            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception:
        return False
    return True


def measure(name: str, leases: int, repeat: int) -> list[tuple[str, float]]:
    with (
        backend_url(name) as url,
        running_servers(url) as servers,
        LeaseClient(servers.lease_address, holder="bench") as client,
    ):
        names = [f"jobs/{i:06d}" for i in range(leases)]
        for start in range(0, leases, 1000):
            client.acquire_many(names[start : start + 1000], ttl=600)
            client.acquire_many([f"other/{i:06d}" for i in range(start, start + 1000)], 600)

        def describe_each() -> None:
            for resource in names:
                client.describe(resource)

        def listing(page: int) -> Callable[[], None]:
            def run() -> None:
                found = sum(1 for _ in client.list_held("jobs/", page_size=page))
                assert found == leases, found

            return run

        return [
            ("Describe each (baseline)", best(describe_each, repeat)),
            ("list_held, pages of 1,000", best(listing(1000), repeat)),
            ("list_held, pages of 100", best(listing(100), repeat)),
        ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leases", type=int, default=2000, help="held under the listed prefix")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"Enumerating {args.leases:,} held leases (and skipping {args.leases:,} others)\n")
    print("| backend | how | seconds | ratio |")
    print("| --- | --- | ---: | --- |")
    for name in ("memory", "sqlite", "postgres", "redis"):
        if not reachable(name):
            print(f"| {name} | (skipped: not reachable) | | |")
            continue
        rows = measure(name, args.leases, args.repeat)
        base = rows[0][1]
        for how, seconds in rows:
            ratio = "(baseline)" if how.endswith("(baseline)") else f"{base / seconds:.1f}x"
            print(f"| {name} | {how} | {seconds:.3f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
