"""``fencing queue worker MODULE:HANDLER --queue Q [--concurrency N]``: run a worker.

Like procrastinate's ``worker`` or River's and Oban's runners: imports HANDLER from
MODULE (the current directory is on the import path, as ``python -m`` has it) and runs
:class:`fencing.worker.Worker` on queue Q with it, so the signals and the grace are
the SDK's own: SIGTERM or SIGINT stops claiming, gives the running handlers
``--grace`` seconds, then releases every job still held (ready again at once, the
attempt not counted). Exits 0 after such a stop.

HANDLER is a function ``handler(job)``, or a :class:`fencing.worker.tasks.Tasks`
registry, which runs the task each job names (deferred with ``task.defer(...)``).
With a guard address (``--guard-addr`` or ``FENCING_GUARD_ADDR``) each job's token is
promised to that guard before its handler starts (``Worker(fence=[guard])``), so a
paused former worker's late write is refused there; ``--no-fence`` skips that.

Exit 2 when HANDLER cannot be imported or is not callable (the message says which).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from fencing.errors import FencingError
from fencingctl import connect, flags
from serving import exits


def load_handler(spec: str) -> Callable[..., object]:
    """``module:attribute`` (dotted attribute allowed) imported; ValueError saying why not."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"HANDLER must be MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no {attribute!r}") from None
    if not callable(target):
        raise ValueError(f"{spec!r} is not callable")
    handler: Callable[..., object] = target
    return handler


def _run(args: argparse.Namespace) -> int:
    try:
        handler = load_handler(args.handler)
    except ValueError as exc:
        print(f"fencing queue worker: error: {exc}", file=sys.stderr)
        return exits.USAGE
    from fencing.worker import Worker  # only when a worker runs: the CLI starts lighter

    try:
        with ExitStack() as stack:
            client = stack.enter_context(connect.queue_client(args))
            fence = [] if args.no_fence else [stack.enter_context(connect.guard_client(args))]
            worker = Worker(
                client,
                args.queue,
                handler,
                concurrency=args.concurrency,
                ttl=args.ttl,
                poll=args.poll,
                grace=args.grace,
                fence=fence,
            )
            worker.run()
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return exits.fail(exc)
    return exits.OK


def register_action(qsub: Any) -> None:
    """Add ``worker`` to the ``fencing queue`` actions."""
    p = qsub.add_parser(
        "worker",
        help="run a worker: MODULE:HANDLER on --queue Q with N threads, until SIGTERM/SIGINT",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("handler", metavar="MODULE:HANDLER")
    p.add_argument("--queue", required=True, help="the queue to work on")
    p.add_argument(
        "--concurrency",
        type=flags.integer(1),
        default=1,
        help="jobs run at once (default %(default)s)",
    )
    p.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=30.0,
        help="each claim's lease (default 30s)",
    )
    p.add_argument(
        "--poll",
        type=flags.seconds,
        metavar="DURATION",
        default=1.0,
        help="how long one claim waits for work (1s)",
    )
    p.add_argument(
        "--grace",
        type=flags.seconds,
        metavar="DURATION",
        default=30.0,
        help="how long the running handlers get after SIGTERM/SIGINT (default 30s)",
    )
    connect.add_lease_address(p, "the lease server whose queue to work on")
    connect.add_guard_address(p, "the guard each job's token is promised to")
    p.add_argument("--no-fence", action="store_true", help="do not promise tokens to a guard")
    connect.add_options(p)
    p.set_defaults(run=_run)
