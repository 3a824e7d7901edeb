"""The ``fencing`` command: run the embedded servers, operate leases and guards, demo, chaos.

It stands above both servers (it starts them); ``python -m fencingctl`` runs it too.

Each subcommand lives in its own module and registers itself with :func:`main`'s
parser through a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

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
    serve,
    watch,
)
from serving import exits

Command = Callable[[argparse.Namespace], int]

MODULES = [serve, ops, lock, elect, watch, queue, outbox, migrate, healthcheck, demo, chaos]


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
    try:
        code = run(args)
        sys.stdout.flush()  # here, not at exit, where a closed pipe cannot be caught
    except BrokenPipeError:
        # The reader went away (``fencing watch | head``): stop quietly, as the Python
        # docs recommend for SIGPIPE. stdout goes to devnull so that the interpreter's
        # own flush on exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exits.FAILURE
    return code
