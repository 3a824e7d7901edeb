"""``fencing serve``: the lease server and the guard in one process on the embedded default.

Both servers share the process's settings (TLS, auth, caps, one metrics endpoint);
settings come from flags, ``FENCING_*`` variables and an optional TOML file, in that
order of precedence (see :mod:`serving.config` and docs/configuration.md).

Once both listen, the web console (:mod:`console`) starts on 127.0.0.1 at
``--console-port`` (8080; 0: off) as a client of the two, with the servers' TLS
settings and ``FENCING_AUTH_TOKEN``. It is a convenience, not the product: if it
cannot start (the port is taken; the ``console`` extra is not installed, said at INFO
unless ``--console-port`` was set) a WARNING says why and the servers go on without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from guard.fence import FenceMode
from guard.server import start_guard
from lease_server.queue.backends import queue_url_for
from lease_server.queue.service import QUEUE_OPTIONS, QueueOptions
from lease_server.server import start_lease_server
from serving import config, exits, loop
from serving.auth import Action, Grant
from serving.logs import banner, configure_logging
from serving.server import ServerOptions, serve_until_signal
from serving.sqlite_db import warn_new

COMMAND = "fencing serve"
#: The files whose absence makes a data directory new (nothing was ever granted there).
DATA_FILES = ("leases.db", "guard.db")

log = logging.getLogger(__name__)

OPTIONS: tuple[config.Option, ...] = (
    config.Option(
        "data_dir",
        "FENCING_DATA_DIR",
        "./fencing-data",
        "where leases.db, leases-queue.db and guard.db live",
        metavar="PATH",
    ),
    config.Option(
        "lease_listen",
        "FENCING_LEASE_LISTEN",
        "127.0.0.1:50051",
        "host:port the lease server binds; port 0 picks one",
        check=config.address,
        metavar="HOST:PORT",
        # Not FENCING_LEASE_ADDR: that is where clients connect, exported for the CLI.
        old_keys=("lease_addr",),
    ),
    config.Option(
        "guard_listen",
        "FENCING_GUARD_LISTEN",
        "127.0.0.1:50052",
        "host:port the guard binds; port 0 picks one",
        check=config.address,
        metavar="HOST:PORT",
        old_keys=("guard_addr",),
    ),
    config.Option(
        "fence_mode",
        "FENCING_FENCE_MODE",
        FenceMode.MONOTONIC.value,
        "monotonic; watch: the guard also follows the lease server's events (docs/modes.md); "
        "off disables fencing (demo/chaos control only)",
        choices=(FenceMode.MONOTONIC.value, FenceMode.WATCH.value, FenceMode.OFF.value),
    ),
    *(
        dataclasses.replace(
            o,
            help="queue backend URL (memory://, sqlite:PATH, postgresql://...); unset: "
            "leases-queue.db in the data directory, as lease-server keeps it beside leases.db; "
            "off: no queue service",
        )
        if o.key == "queue"
        else o
        for o in QUEUE_OPTIONS
    ),
    config.Option(
        "console_port",
        "FENCING_CONSOLE_PORT",
        8080,
        "port of the web console on 127.0.0.1 (fencing console); 0 turns it off",
        int,
        check=config.port_range,
        metavar="PORT",
    ),
    *config.LEASE_LIMIT_OPTIONS,
    # Quieter by default than the standalone servers: this is the interactive command.
    *(
        dataclasses.replace(o, default="WARNING") if o is config.LOG_LEVEL else o
        for o in config.SERVER_OPTIONS
    ),
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the lease server and the guard (SQLite, nothing else needed)",
        description="Run the lease server and the guard in one process, state in --data-dir.",
    )
    config.add_options(p, OPTIONS)
    p.set_defaults(run=run, parser=p)


#: The principal ``serve``'s own watch guard is on its lease server when auth is on.
OWN_GUARD = "fencing-serve-guard"


def _with_own_guard(options: ServerOptions) -> tuple[ServerOptions, str | None]:
    """With auth on, the lease server's options letting ``serve``'s own watch guard in:
    a principal allowed only to watch and describe, named by a token minted now and
    held only in this process; and that token (None with auth off)."""
    policy = options.auth_policy
    if policy is None:
        return options, None
    token = secrets.token_urlsafe(32)
    grant = Grant("", frozenset({Action.WATCH, Action.DESCRIBE}))
    name = OWN_GUARD
    while name in policy.principals:  # never take over a principal of the user's
        name += "-"
    own = policy.with_token_principal(name, token, [grant])
    return dataclasses.replace(options, auth=own), token


async def _serve(args: argparse.Namespace, options: ServerOptions) -> None:
    # Over TLS, serve's own clients (the watch guard's follower, the console) could not
    # verify the servers' certificate (its CA is not known here): they reach the servers
    # over Unix sockets in a directory only this user may enter, removed on the way out.
    local = tempfile.mkdtemp(prefix="fencing-serve-") if options.tls else ""
    try:
        await _serve_both(args, options, local)
    finally:
        if local:
            shutil.rmtree(local, ignore_errors=True)


async def _serve_both(args: argparse.Namespace, options: ServerOptions, local: str) -> None:
    local_socket = os.path.join(local, "lease.sock") if local else ""
    guard_socket = os.path.join(local, "guard.sock") if local else ""
    data: Path = args.data_path
    lease_url = f"sqlite:{data / 'leases.db'}"
    watch = args.fence_mode == FenceMode.WATCH.value
    lease_options, guard_token = _with_own_guard(options) if watch else (options, None)
    leases = await start_lease_server(
        lease_url,
        args.lease_listen,
        reflection=args.reflection,
        options=lease_options,
        require_durable=args.require_durable,
        # The lease server's own file beside leases.db: the two commands share the jobs.
        queue=args.queue or queue_url_for(lease_url),
        queue_options=QueueOptions.from_args(args),
        local_socket=local_socket,
    )
    try:
        guard = await start_guard(
            f"sqlite:{data / 'guard.db'}",
            args.guard_listen,
            mode=FenceMode(args.fence_mode),
            reflection=args.reflection,
            options=options,
            require_durable=args.require_durable,
            # In watch mode the guard follows the lease server next to it.
            lease_server=(f"unix:{local_socket}" if local_socket else leases.address)
            if watch
            else "",
            lease_token=guard_token,
            local_socket=guard_socket,
        )
    except BaseException:
        await leases.stop(0)
        raise

    def ready() -> None:
        banner(f"lease server listening on {leases.address}", address=leases.address)
        banner(
            f"guard listening on {guard.address} (fence mode {args.fence_mode})",
            address=guard.address,
            fence_mode=args.fence_mode,
        )
        if leases.queue is not None:
            banner(
                f"queue service on {leases.address} ({leases.queue.name})",
                address=leases.address,
                queue_backend=leases.queue.name,
            )
        banner(f"data in {data}; stop with Ctrl-C or SIGTERM", data_dir=str(data))
        if args.console_port:
            # Started after the banners above, so they stay the first lines of stdout.
            own = (f"unix:{local_socket}", f"unix:{guard_socket}") if local else None
            consoles.append(asyncio.create_task(_console(args, leases.address, guard.address, own)))

    consoles: list[asyncio.Task[None]] = []
    try:
        signal_name = await serve_until_signal(
            [guard, leases],
            grace=args.grace,
            metrics=options.metrics,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            on_ready=ready,
        )
    finally:
        for task in consoles:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    banner(f"{signal_name}: stopped", signal=signal_name)


async def _console(
    args: argparse.Namespace, lease_addr: str, guard_addr: str, own: tuple[str, str] | None
) -> None:
    """Serve the web console over the two servers until cancelled; a WARNING (and no
    console) if it cannot start. ``own``: the servers' Unix sockets, when TLS is on."""
    try:
        from console.command import make_app, serve_console

        client = argparse.Namespace(
            lease_addr=own[0] if own else lease_addr,
            guard_addr=own[1] if own else guard_addr,
            tls_ca=None,
            tls_cert=None,
            tls_key=None,
            tls_server_name=None,
            auth_token=os.environ.get("FENCING_AUTH_TOKEN") or None,
        )

        def ready(url: str) -> None:
            banner(f"console on {url}", url=url)

        await serve_console(lambda: make_app(client), f"127.0.0.1:{args.console_port}", ready)
    except ImportError as exc:
        # Quiet unless asked for: an image without the extra starts this way every time.
        log.log(
            logging.WARNING if args.console_port_given else logging.INFO,
            "console not started: %s (pip install 'fencing-guard[console]'; "
            "--console-port 0 turns it off)",
            exc,
        )
    except OSError as exc:
        log.warning(
            "console not started on port %d: %s (--console-port picks another, 0 turns it off)",
            args.console_port,
            exc,
        )


def warn_if_new(data: Path) -> bool:
    """Log a WARNING if ``data`` holds no earlier state: a fresh start, which must be
    visible in the logs, since a server whose data was lost (a container replaced
    without its volume) also starts fresh, with every counter back at 1."""
    if any((data / name).exists() for name in DATA_FILES):
        return False
    warn_new("data directory", data)
    return True


def run(args: argparse.Namespace) -> int:
    settled = config.settle(
        args.parser, args, OPTIONS, ["lease_listen", "guard_listen"], lambda a: Path(a.data_dir)
    )
    if args.check_config:
        return settled.report(COMMAND)
    configure_logging(args.log_level, args.log_format)
    args.data_path = settled.extra.resolve()
    args.console_port_given = settled.sources.get("console_port") != "default"
    try:
        warn_if_new(args.data_path)
        args.data_path.mkdir(parents=True, exist_ok=True)
        loop.run(_serve(args, settled.server), args.event_loop)
    except Exception as exc:
        return exits.startup_exit(
            COMMAND,
            exc,
            debug=args.log_level == "DEBUG",
            listen=[
                exits.Setting("--lease-listen", "FENCING_LEASE_LISTEN", args.lease_listen),
                exits.Setting("--guard-listen", "FENCING_GUARD_LISTEN", args.guard_listen),
            ],
            # Leases and fences are files in the data directory; only a queue URL
            # names a server to reach.
            backend=exits.Setting("--queue", "FENCING_QUEUE", args.queue)
            if args.queue and not args.queue.startswith("sqlite:")
            else exits.Setting("--data-dir", "FENCING_DATA_DIR", str(args.data_path)),
        )
    return 0
