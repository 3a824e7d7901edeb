"""The ``fencing`` command: run the embedded servers, operate leases and guards, demo, chaos.

It stands above both servers (it starts them); ``python -m fencingctl`` runs it too.

Each subcommand lives in its own module and registers itself with :func:`main`'s
parser through a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from console import command as console
from fencing._version import VERSION
from fencingctl import (
    chaos,
    demo,
    elect,
    healthcheck,
    lock,
    migrate,
    ops,
    outbox,
    queue,
    records,
    serve,
    watch,
)
from serving import exits

Command = Callable[[argparse.Namespace], int]

MODULES = [
    serve,
    console,
    ops,
    records,
    lock,
    elect,
    watch,
    queue,
    outbox,
    migrate,
    healthcheck,
    demo,
    chaos,
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fencing",
        description="Fencing tokens for distributed ownership: lease server, guard, tools.",
        epilog=exits.table_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in MODULES:
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run: Command = args.run
    return run(args)
