"""``python -m bench``: every benchmark in one run, each printed with its ratios.

python -m bench                 # the RPC floor and the embedded default
python -m bench --duration 5    # longer measurements
python -m bench --clients 1,16  # client counts
python -m bench --postgres postgresql://postgres@127.0.0.1:5432/test   # and PostgreSQL
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time

from bench import floor
from bench.harness import Result, table


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument(
        "--postgres",
        default=os.environ.get("FENCING_BENCH_POSTGRES_DSN", ""),
        metavar="DSN",
        help="also measure PostgreSQL (direct SQL and servers) in a scratch schema there",
    )
    return p


async def _main(args: argparse.Namespace) -> tuple[list[Result], list[Result]]:
    clients = [int(c) for c in args.clients.split(",") if c]
    embedded = await floor.run(clients, args.duration)
    pg: list[Result] = []
    if args.postgres:
        from bench import postgres

        pg = await postgres.run(clients, args.duration, args.postgres, servers=True)
    return embedded, pg


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(
        f"fencing bench on {platform.node()} ({platform.python_implementation()} "
        f"{platform.python_version()}), {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flush=True,
    )
    embedded, pg = asyncio.run(_main(args))
    print(table(embedded, "RPC floor and the embedded default (SQLite)"))
    if pg:
        print()
        print(
            table(
                [r for r in embedded if r.name == floor.FLOOR] + pg,
                "PostgreSQL: direct SQL against SELECT 1, servers against the RPC floor",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
