"""``fencing-guard`` / ``python -m guard``: run the guard alone.

Settings come from flags, ``FENCING_*`` variables and an optional TOML file, in that
order of precedence (see :mod:`serving.config` and docs/configuration.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from fencing._version import VERSION
from fencing.errors import InvalidArgumentError
from fencing.tls import TLSConfig
from guard.fence import FenceMode
from guard.server import DEFAULT_IDEMPOTENCY_RETENTION_S, check_mode, start_guard
from guard.stores import GuardStore, open_store
from serving import config, exits
from serving.command import ServerCommand, run_server_command
from serving.logs import banner
from serving.server import ServerOptions, serve_until_signal

COMMAND = "fencing-guard"

OPTIONS: tuple[config.Option, ...] = (
    config.Option(
        "listen",
        "FENCING_GUARD_LISTEN",
        "127.0.0.1:50052",
        "host:port to serve on; port 0 picks one",
        check=config.address,
        metavar="HOST:PORT",
    ),
    config.Option(
        "store",
        "FENCING_STORE",
        "sqlite:fencing-data/guard.db",
        "fenced store URL: memory://, sqlite:PATH, postgresql://user@host/db?schema=fencing, "
        "redis://host:6379, mysql://user@host/db, or a scheme an installed store package adds",
        metavar="URL",
    ),
    config.Option(
        "fence_mode",
        "FENCING_FENCE_MODE",
        FenceMode.MONOTONIC.value,
        "how writes are judged; watch also follows --lease-addr's events (docs/modes.md); "
        "strict also requires the live lease (a postgres or redis store where the lease "
        "server keeps its leases); off accepts stale tokens: chaos control only",
        choices=tuple(m.value for m in FenceMode),
    ),
    config.Option(
        "lease_addr",
        "FENCING_LEASE_ADDR",
        "",
        "in watch mode, the lease server whose events the guard follows (connects to)",
        metavar="HOST:PORT",
        old_keys=("lease_server",),
        old_envs=("FENCING_LEASE_SERVER",),
    ),
    config.Option(
        "lease_token",
        "FENCING_LEASE_TOKEN",
        None,
        "in watch mode, the bearer token the guard sends to the lease server (auth on there; "
        "sent only over TLS or to loopback)",
        metavar="TOKEN",
    ),
    config.Option(
        "lease_tls_ca",
        "FENCING_LEASE_TLS_CA",
        None,
        "in watch mode, PEM CA of the lease server's certificate: connect to it with TLS",
        metavar="PATH",
    ),
    config.Option(
        "lease_tls_cert",
        "FENCING_LEASE_TLS_CERT",
        None,
        "in watch mode, the guard's PEM client certificate to the lease server (mTLS)",
        metavar="PATH",
    ),
    config.Option(
        "lease_tls_key",
        "FENCING_LEASE_TLS_KEY",
        None,
        "in watch mode, the PEM private key of lease_tls_cert",
        metavar="PATH",
    ),
    config.Option(
        "watch_prefix",
        "FENCING_WATCH_PREFIX",
        "",
        "in watch mode, follow only resources whose name starts with this (empty: all)",
        metavar="PREFIX",
    ),
    config.Option(
        "idempotency_retention",
        "FENCING_IDEMPOTENCY_RETENTION_S",
        float(DEFAULT_IDEMPOTENCY_RETENTION_S),
        "seconds a write's idempotency key is remembered",
        float,
        check=config.positive,
        metavar="SECONDS",
    ),
    config.CREATE,
    config.WORKERS,
    *config.SERVER_OPTIONS,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND,
        description="Run the fencing guard.",
        epilog=exits.table_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    config.add_options(p, OPTIONS)
    # Set by the --workers supervisor on the processes it starts (serving.supervisor).
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    return p


def _lease_tls(args: argparse.Namespace) -> TLSConfig | None:
    """The guard's TLS to the lease server it follows (None: plaintext), files checked."""
    if not (args.lease_tls_ca or args.lease_tls_cert or args.lease_tls_key):
        return None
    try:
        tls = TLSConfig(ca=args.lease_tls_ca, cert=args.lease_tls_cert, key=args.lease_tls_key)
        tls.check(server=False)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"{exc} [--lease-tls-ca/--lease-tls-cert/--lease-tls-key or FENCING_LEASE_TLS_CA/"
            "FENCING_LEASE_TLS_CERT/FENCING_LEASE_TLS_KEY]: name readable PEM files",
            field="lease_tls",
        ) from None
    return tls


def _store(args: argparse.Namespace) -> GuardStore:
    if args.fence_mode == FenceMode.WATCH.value and not args.lease_addr:
        raise InvalidArgumentError(
            "--fence-mode watch needs --lease-addr HOST:PORT to follow", field="lease_addr"
        )
    _lease_tls(args)
    store = open_store(args.store)
    check_mode(store, FenceMode(args.fence_mode))
    return store


async def _run(args: argparse.Namespace, store: GuardStore, options: ServerOptions) -> None:
    server = await start_guard(
        store,
        args.listen,
        mode=FenceMode(args.fence_mode),
        retention_s=args.idempotency_retention,
        reflection=args.reflection,
        require_durable=args.require_durable,
        options=dataclasses.replace(options, reuse_port=args.reuse_port),
        lease_server=args.lease_addr,
        watch_prefix=args.watch_prefix,
        lease_tls=_lease_tls(args),
        lease_token=args.lease_token or None,
    )

    def ready() -> None:
        banner(
            f"guard listening on {server.address} (store {server.store.name}, "
            f"fence mode {args.fence_mode})",
            address=server.address,
            store=server.store.name,
            fence_mode=args.fence_mode,
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
        ServerCommand(COMMAND, "guard", "guard", "store", "FENCING_STORE", "FENCING_GUARD_LISTEN"),
        parser(),
        argv,
        OPTIONS,
        _store,
        _run,
    )


if __name__ == "__main__":
    sys.exit(main())
