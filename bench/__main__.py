"""``python -m bench``: every benchmark in one run, each printed with its ratios.

python -m bench                 # the RPC floor and the embedded default
python -m bench --duration 5    # longer measurements
python -m bench --clients 1,16  # client counts
"""

from __future__ import annotations

import argparse
import asyncio
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
    return p


async def _main(args: argparse.Namespace) -> list[Result]:
    clients = [int(c) for c in args.clients.split(",") if c]
    return await floor.run(clients, args.duration)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(
        f"fencing bench on {platform.node()} ({platform.python_implementation()} "
        f"{platform.python_version()}), {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flush=True,
    )
    results = asyncio.run(_main(args))
    print(table(results, "RPC floor and the embedded default (SQLite)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
