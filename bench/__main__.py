"""``python -m bench``: every benchmark in one run, each table printed with its ratios.

    python -m bench                      # every section whose server is reachable
    python -m bench --only floor,redis   # some sections
    python -m bench --duration 5         # longer measurements
    python -m bench --clients 1,16       # client counts

Sections: ``floor`` (the empty gRPC call, and the embedded SQLite servers against it),
``redis`` (redis-py Lock, raw EVALSHA, our servers on Redis), ``postgres`` (the guard's
check-and-write SQL one call, client-side and batched, the store, our servers on
PostgreSQL; ``FENCING_BENCH_POSTGRES_DSN``), ``modes`` (what the promise and a watch
guard add to taking a lease, and the watch delivery delay), and the others as they land. A section
whose server is unreachable is skipped with a note, never faked.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from bench.harness import Result, table

Section = Callable[[Sequence[int], float], Awaitable[list[Result]]]


async def _floor(clients: Sequence[int], duration: float) -> list[Result]:
    from bench import floor

    return await floor.run(clients, duration)


async def _redis(clients: Sequence[int], duration: float) -> list[Result]:
    from bench import redis

    return await redis.run(clients, duration, servers=True)


async def _modes(clients: Sequence[int], duration: float) -> list[Result]:
    from bench import modes

    return await modes.run(clients, duration)


async def _postgres(clients: Sequence[int], duration: float) -> list[Result]:
    from bench import postgres

    return await postgres.run(clients, duration, servers=True)


SECTIONS: dict[str, tuple[str, Section]] = {
    "floor": ("RPC floor and the embedded default (SQLite)", _floor),
    "redis": ("Redis: our scripts and servers next to redis-py Lock and raw EVALSHA", _redis),
    "postgres": ("PostgreSQL: check-and-write SQL against SELECT 1, and our servers", _postgres),
    "modes": ("Closing the monotonic window: promise and watch (SQLite)", _modes),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument(
        "--only", default=",".join(SECTIONS), help="comma-separated sections (default: %(default)s)"
    )
    return p


async def _run(names: list[str], clients: list[int], duration: float) -> int:
    failed = 0
    for name in names:
        title, section = SECTIONS[name]
        try:
            results = await section(clients, duration)
        except (OSError, RuntimeError, ConnectionError) as exc:
            print(f"\n{title}: skipped ({type(exc).__name__}: {exc})", flush=True)
            failed += 1
            continue
        print("\n" + table(results, title), flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(
            f"unknown section(s): {', '.join(unknown)}; known: {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    clients = [int(c) for c in args.clients.split(",") if c]
    print(
        f"fencing bench on {platform.node()} ({platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        flush=True,
    )
    asyncio.run(_run(names, clients, args.duration))
    return 0


if __name__ == "__main__":
    sys.exit(main())
