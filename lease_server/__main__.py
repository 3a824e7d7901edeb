"""``lease-server`` / ``python -m lease_server``: run the lease server alone.

Settings come from flags, ``FENCING_*`` variables and an optional TOML file, in that
order of precedence (see :mod:`serving.config` and docs/configuration.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from fencing._version import VERSION
from lease_server.backends import LeaseBackend, open_backend
from lease_server.expiry import DEFAULT_EVENT_RETENTION
from lease_server.queue.backends import queue_url_for
from lease_server.queue.service import QUEUE_OPTIONS, QueueOptions
from lease_server.server import QUEUE_OFF, start_lease_server
from serving import config, exits
from serving.command import ServerCommand, run_server_command
from serving.logs import banner
from serving.server import ServerOptions, serve_until_signal

COMMAND = "lease-server"

OPTIONS: tuple[config.Option, ...] = (
    config.Option(
        "listen",
        "FENCING_LEASE_LISTEN",
        "127.0.0.1:50051",
        "host:port to serve on; port 0 picks one",
        check=config.address,
        metavar="HOST:PORT",
        old_envs=("FENCING_LISTEN",),
    ),
    config.Option(
        "backend",
        "FENCING_BACKEND",
        "sqlite:fencing-data/leases.db",
        "lease backend URL: memory://, sqlite:PATH, postgresql://user@host/db?schema=fencing, "
        "redis://host:6379",
        metavar="URL",
    ),
    config.Option(
        "event_retention",
        "FENCING_EVENT_RETENTION",
        DEFAULT_EVENT_RETENTION,
        "events the log keeps for Watch streams to resume from; an older cursor gets RESYNC "
        "(on a Redis Cluster each resource's own log keeps its newest 100 instead)",
        int,
        check=config.positive,
        metavar="EVENTS",
    ),
    *QUEUE_OPTIONS,
    *config.LEASE_LIMIT_OPTIONS,
    config.CREATE,
    config.WORKERS,
    *config.SERVER_OPTIONS,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND,
        description="Run the fencing lease server.",
        epilog=exits.table_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    config.add_options(p, OPTIONS)
    # Set by the --workers supervisor on the processes it starts (serving.supervisor).
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    return p


async def _run(args: argparse.Namespace, backend: LeaseBackend, options: ServerOptions) -> None:
    server = await start_lease_server(
        backend,
        args.listen,
        reflection=args.reflection,
        options=dataclasses.replace(options, reuse_port=args.reuse_port),
        require_durable=args.require_durable,
        event_retention=args.event_retention,
        # The backend arrives opened, as an object: derive the queue from its URL here.
        queue=args.queue or queue_url_for(args.backend) or QUEUE_OFF,
        queue_options=QueueOptions.from_args(args),
    )

    def ready() -> None:
        banner(
            f"lease server listening on {server.address} (backend {server.backend.name})",
            address=server.address,
            backend=server.backend.name,
        )
        if server.queue is not None:
            banner(
                f"queue service on {server.address} ({server.queue.name})",
                address=server.address,
                queue_backend=server.queue.name,
            )

    await serve_until_signal(
        [server],
        grace=args.grace,
        metrics=options.metrics,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        on_ready=ready,
    )


def main(argv: list[str] | None = None) -> int:
    return run_server_command(
        ServerCommand(
            COMMAND,
            "lease_server",
            "lease server",
            "backend",
            "FENCING_BACKEND",
            "FENCING_LEASE_LISTEN",
        ),
        parser(),
        argv,
        OPTIONS,
        lambda args: open_backend(args.backend),
        _run,
    )


if __name__ == "__main__":
    sys.exit(main())
