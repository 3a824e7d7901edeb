"""``fencing outbox run``: publish the outbox through a guard.

The outbox itself (the ``outbox`` view your transactions write) is installed with the
rest of the PostgreSQL schema by ``fencing migrate`` (or by a lease server on start).
``outbox run`` claims events of queue ``outbox`` from the lease server (whose queue
backend is the PostgreSQL database your transactions write ``fencing.outbox`` in) in
batches with attempt tokens, and writes each through the guard, fenced by its token
and idempotent by its event id (see :mod:`fencing.outbox`). It runs until SIGTERM or
SIGINT, then finishes the deliveries in flight within ``--grace`` and gives the rest back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from fencing.errors import FencingError
from fencingctl import connect, flags, hints
from serving.logs import configure_logging


async def _publish(args: argparse.Namespace) -> int:
    from fencing.client.async_queue import AsyncQueueClient
    from fencing.outbox import GuardSink, OutboxPublisher

    options = connect.client_options(args)
    sink = GuardSink(args.guard_addr, key_prefix=args.key_prefix, **options)
    publisher = OutboxPublisher(
        AsyncQueueClient(args.lease_addr, **options),
        sink,
        queue_name=args.queue,
        batch=args.batch,
        ttl=args.ttl,
        grace=args.grace,
    )
    print(
        f"publishing queue {args.queue!r} from {args.lease_addr} to the guard at {args.guard_addr}",
        flush=True,
    )
    try:
        await publisher.run()
    finally:
        await sink.aclose()
        await publisher.worker.client.aclose()
    counts = publisher.counts
    print(
        " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing published",
        flush=True,
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    try:
        return asyncio.run(_publish(args))
    except (FencingError, ValueError) as exc:
        return hints.fail(args, exc)


def register(sub: Any) -> None:
    outbox = sub.add_parser("outbox", help="publish the transactional outbox")
    osub = outbox.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    p = osub.add_parser("run", help="deliver outbox events through the guard until SIGTERM")
    connect.add_lease_address(
        p,
        "the lease server serving the outbox queue",
        old_flags=["--addr"],
        old_envs=["FENCING_QUEUE_ADDR"],
    )
    connect.add_guard_address(p, "the guard to deliver to")
    p.add_argument("--queue", default="outbox", help="queue name (default %(default)s)")
    p.add_argument(
        "--batch",
        type=flags.integer(1, 1000),
        default=100,
        help="events claimed and in flight at most (default 100)",
    )
    p.add_argument(
        "--ttl", type=flags.ttl, metavar="DURATION", default=30.0, help="claim lease (default 30s)"
    )
    p.add_argument(
        "--grace",
        type=flags.seconds,
        metavar="DURATION",
        default=10.0,
        help="time to finish on SIGTERM (default 10s)",
    )
    p.add_argument("--key-prefix", default="events/", help="guard key prefix (default events/)")
    p.add_argument("--log-level", default=os.environ.get("FENCING_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=["console", "json"],
        default=os.environ.get("FENCING_LOG_FORMAT", "console"),
    )
    connect.add_options(p)
    p.set_defaults(run=_run)
