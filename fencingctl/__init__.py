"""The ``fencing`` command: run the embedded servers, operate leases and guards, demo, chaos.

It stands above both servers (it starts them); ``python -m fencingctl`` runs it too.

Each subcommand lives in its own module and registers itself with :func:`main`'s
parser through a ``register(subparsers)`` function. Only the module of the command
being run is imported (:data:`COMMANDS`): a client command does not pay for the
servers' imports, and ``--version`` for none (every module only for ``--help`` or a
command line naming no known command, so argparse can list them all).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

Command = Callable[[argparse.Namespace], int]

#: The command modules, in the order ``fencing --help`` lists their commands.
MODULES = (
    "serve",
    "console",
    "ops",
    "records",
    "lock",
    "elect",
    "watch",
    "queue",
    "outbox",
    "migrate",
    "healthcheck",
    "demo",
    "chaos",
)

#: Command modules that live outside this package (the console is a process of its own).
_MODULE_PATHS = {"console": "console.command"}

#: Each command and the module (of :data:`MODULES`) that registers it.
COMMANDS = {
    "serve": "serve",
    "console": "console",
    "lease": "ops",
    "put": "ops",
    "get": "ops",
    "fence": "ops",
    "delete": "records",
    "lock": "lock",
    "elect": "elect",
    "leader": "elect",
    "watch": "watch",
    "queue": "queue",
    "outbox": "outbox",
    "migrate": "migrate",
    "healthcheck": "healthcheck",
    "demo": "demo",
    "chaos": "chaos",
}


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from fencing._version import VERSION

        print(f"{parser.prog} {VERSION}")  # on stdout, as argparse's own action
        parser.exit()


def _modules_for(argv: Sequence[str]) -> list[str]:
    """The modules to register for ``argv``: the named command's, else all of them."""
    words = list(argv)
    first = next((w for w in words if not w.startswith("-")), None)
    before = set(words if first is None else words[: words.index(first)])
    if {"-h", "--help"} & before:
        return list(MODULES)
    if "--version" in before:
        return []
    if first in COMMANDS:
        return [COMMANDS[first]]
    return list(MODULES)


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``fencing`` parser: with ``argv``, only the modules it needs registered."""
    names = MODULES if argv is None else _modules_for(argv)
    epilog = None
    if len(names) == len(MODULES):  # the top-level help may be shown: the exit codes
        from serving import exits

        epilog = exits.table_text()
    p = argparse.ArgumentParser(
        prog="fencing",
        description="Fencing tokens for distributed ownership: lease server, guard, tools.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
        importlib.import_module(_MODULE_PATHS.get(name, f"fencingctl.{name}")).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs a failed handshake at INFO on stderr, ahead of the command's own
    # error line that already says it: keep the core to errors unless the user chose.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
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
        return FAILURE
    return code


#: ``main``'s code for a closed stdout (``serving.exits.FAILURE``, not imported here).
FAILURE = 1
