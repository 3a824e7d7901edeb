"""The main of a server process (``lease-server``, ``fencing-guard``), written once.

Both commands settle their settings the same way (:func:`serving.config.settle`), may
answer ``--check-config``, become a supervisor under ``--workers N``
(:mod:`serving.supervisor`), and otherwise run one server until a signal, turning a
failure to start into one line and its exit code (:func:`serving.exits.startup_exit`).
Only what they serve differs: the storage option and how to open and run it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from serving import config, exits, loop
from serving.logs import configure_logging
from serving.server import ServerOptions
from serving.sqlite_db import new_database, warn_new
from serving.supervisor import run_workers

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServerCommand:
    """What tells one server command from the other."""

    #: The console script's name (``lease-server``), as messages and exits name it.
    name: str
    #: The package ``--workers`` runs as ``python -m <module>``.
    module: str
    #: What the supervisor calls its workers in its log lines (``lease server``).
    label: str
    #: The option holding the storage URL (``backend``, ``store``) and its variable.
    storage: str
    storage_env: str
    #: The variable of ``--listen``.
    listen_env: str


def run_server_command(
    command: ServerCommand,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    options: Sequence[config.Option],
    prepare: Callable[[argparse.Namespace], T],
    run: Callable[[argparse.Namespace, T, ServerOptions], Coroutine[Any, Any, None]],
) -> int:
    """Settle ``parser``'s arguments (``argv``, else the process's) and run the server:
    ``prepare(args)`` builds its storage without I/O, ``run(args, storage, options)``
    serves until a signal. Returns the process's exit code."""
    settled = config.settle(parser, parser.parse_args(argv), options, ["listen"], prepare)
    args = settled.args
    if args.check_config:
        return settled.report(command.name)
    url = str(getattr(args, command.storage))
    configure_logging(args.log_level, args.log_format)
    # Under --workers the supervisor checks, once, before any worker opens the file.
    if not args.reuse_port:
        try:
            check_new_database(command, args, url)
        except exits.StartupError as exc:
            return exits.startup_exit(
                command.name,
                exc,
                debug=False,
                listen=[exits.Setting("--listen", command.listen_env, args.listen)],
                backend=exits.Setting(f"--{command.storage}", command.storage_env, url),
            )
    if args.workers > 1:
        if url.startswith("memory:"):
            parser.error(
                f"--workers needs a {command.storage} the workers can share (not memory://)"
            )
        return run_workers(
            command.module,
            sys.argv[1:] if argv is None else list(argv),
            args.listen,
            args.workers,
            command.label,
            metrics_port=args.metrics_port,
        )
    try:
        loop.run(run(args, settled.extra, settled.server), args.event_loop)
    except Exception as exc:
        return exits.startup_exit(
            command.name,
            exc,
            debug=args.log_level == "DEBUG",
            listen=[exits.Setting("--listen", command.listen_env, args.listen)],
            backend=exits.Setting(f"--{command.storage}", command.storage_env, url),
        )
    return exits.OK


def check_new_database(command: ServerCommand, args: argparse.Namespace, url: str) -> None:
    """Warn when ``url`` names a SQLite file that is not there yet (the server would
    create it, every counter at 1); with ``--no-create`` or ``--require-durable`` refuse
    to start instead, before anything (its directories included) is created."""
    path = new_database(url)
    if path is None:
        return
    if args.create and not args.require_durable:
        warn_new("sqlite database", path)
        return
    if not args.create:
        reason, flag, env = "BACKEND_UNREACHABLE", "--no-create", f"{config.CREATE.env}=false"
    else:
        reason, flag, env = "NOT_DURABLE", "--require-durable", config.REQUIRE_DURABLE.env
    raise exits.StartupError(
        reason,
        f"sqlite database {path} does not exist",
        f"{flag} / {env}",
        f"check the --{command.storage} path (a new database starts every counter at 1); "
        f"to create it, start once without {flag}",
    )


__all__ = ["ServerCommand", "check_new_database", "run_server_command"]
