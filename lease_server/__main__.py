"""``lease-server`` / ``python -m lease_server``: run the lease server alone."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from fencing._server import configure_logging, wait_for_signal
from lease_server.queue_service import QueueOptions
from lease_server.server import start_lease_server


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lease-server", description="Run the fencing lease server.")
    p.add_argument(
        "--listen",
        default=os.environ.get("FENCING_LISTEN", "127.0.0.1:50051"),
        help="host:port to serve on (env FENCING_LISTEN; default %(default)s)",
    )
    p.add_argument(
        "--backend",
        default=os.environ.get("FENCING_BACKEND", "sqlite:fencing-data/leases.db"),
        help=(
            "memory://, sqlite:///path, postgresql://user@host/db?schema=fencing, "
            "redis://host:6379 (env FENCING_BACKEND; default %(default)s)"
        ),
    )
    QueueOptions.add_arguments(p)
    p.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to drain on SIGTERM")
    p.add_argument("--log-level", default=os.environ.get("FENCING_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=["console", "json"],
        default=os.environ.get("FENCING_LOG_FORMAT", "console"),
    )
    return p


async def _run(args: argparse.Namespace) -> None:
    server = await start_lease_server(
        args.backend,
        args.listen,
        reflection=args.reflection,
        queue=args.queue,
        queue_options=QueueOptions.from_args(args),
    )
    queue = server.queue.name if server.queue is not None else "off"
    print(
        f"lease server listening on {server.address} (backend {server.backend.name}, "
        f"queue {queue})",
        flush=True,
    )
    await wait_for_signal()
    await server.stop(args.grace)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
