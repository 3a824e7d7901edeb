"""``fencing console``: serve the web console (also ``python -m console``).

Settings come from flags, ``FENCING_*`` variables and an optional TOML file
(``--config``), as for the servers; the addresses, TLS and token options are the
client commands' own (:mod:`fencingctl.connect`): the console is a client of the
lease server and the guards, and needs the ``console`` extra
(``pip install 'fencing-guard[console]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fencing.tls import split_address
from fencingctl import connect
from serving import config, exits
from serving.logs import banner, configure_logging

COMMAND = "fencing console"
DEFAULT_LISTEN = "127.0.0.1:8080"

log = logging.getLogger(__name__)

LISTEN = config.Option(
    "console_listen",
    "FENCING_CONSOLE_LISTEN",
    DEFAULT_LISTEN,
    "host:port the console's HTTP server binds; port 0 picks one",
    check=config.address,
    metavar="HOST:PORT",
)
ALLOW_ACTIONS = config.Option(
    "allow_actions",
    "FENCING_CONSOLE_ALLOW_ACTIONS",
    False,
    "let logged-in operators retry, cancel and requeue jobs and pause and resume "
    "queues (off: the console is read-only and refuses them with 403)",
    bool,
)
OPERATORS = config.Option(
    "operators",
    "FENCING_CONSOLE_OPERATORS",
    None,
    "who may log in: NAME:sha256:<hex of the password's SHA-256>, comma-separated",
    metavar="NAME:sha256:HEX,...",
)
OPTIONS: tuple[config.Option, ...] = (
    LISTEN,
    ALLOW_ACTIONS,
    OPERATORS,
    config.LOG_LEVEL,
    config.LOG_FORMAT,
)


def add_client_options(p: argparse.ArgumentParser) -> None:
    """The console's upstream addresses, TLS and token (as every client command)."""
    connect.add_lease_address(p, "the lease server (and its queues) to show")
    connect.add_guard_address(p, "the guard(s) to show, comma-separated")
    connect.add_options(p)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "console",
        help="serve the web console (leases, fences, refused writes, queues)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    config.add_options(p, OPTIONS)
    add_client_options(p)
    p.set_defaults(run=run, parser=p)


def guard_addresses(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


def make_app(
    args: argparse.Namespace, allow_actions: bool = False, operators: str | None = None
) -> Any:
    """The console's app over the servers ``args`` name (the ``console`` extra needed)."""
    from console.app import Settings, build_app
    from console.operators import Operators, parse_operators
    from console.upstream import Upstream

    upstream = Upstream(
        args.lease_addr, guard_addresses(args.guard_addr), connect.client_options(args)
    )
    return build_app(upstream, Settings(allow_actions, Operators(parse_operators(operators))))


async def serve_console(
    app_factory: Callable[[], Any], listen: str, on_ready: Callable[[str], None]
) -> None:
    """Serve the app built by ``app_factory`` on ``listen`` until cancelled; call
    ``on_ready(url)`` once bound (a port 0 is replaced by the one picked)."""

    host, port = split_address(listen)
    # Bound here, so a taken port is an OSError for the caller (uvicorn would exit).
    sock = socket.create_server((host, int(port)))
    try:
        await _serve(app_factory(), sock, host, on_ready)
    finally:
        sock.close()


async def _serve(app: Any, sock: socket.socket, host: str, on_ready: Callable[[str], None]) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        # The caller owns the signals (fencing serve's own handlers, or run's).
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                try:
                    await task  # raises why it could not start
                except SystemExit as exc:  # uvicorn's way to say it
                    raise OSError(f"the console could not start (exit {exc.code})") from exc
                raise OSError("the console could not start")
            await asyncio.sleep(0.02)
        on_ready(f"http://{host}:{sock.getsockname()[1]}/")
        await asyncio.shield(task)
    finally:
        # Event streams never end on their own: end them, or shutdown waits for them.
        app.state.console.feed.close_streams()
        server.should_exit = True
        with contextlib.suppress(SystemExit):
            await task


def run(args: argparse.Namespace) -> int:
    try:
        sources = config.resolve(args, OPTIONS)
        from console.operators import parse_operators

        operators = parse_operators(args.operators)
        if args.allow_actions and not operators:
            raise config.ConfigError(
                "allow_actions needs operators who may log in (--operators, "
                "FENCING_CONSOLE_OPERATORS or operators in the TOML file)"
            )
    except ImportError as exc:
        return exits.fail(
            RuntimeError(f"{exc}: install the console extra: pip install 'fencing-guard[console]'")
        )
    except ValueError as exc:
        args.parser.exit(2, f"{args.parser.prog}: error: {exc}\n")
    if args.check_config:
        print(config.describe(args, sources))
        print(f"{COMMAND}: configuration OK", flush=True)
        return 0
    configure_logging(args.log_level, args.log_format)

    def ready(url: str) -> None:
        banner(f"console on {url}", url=url)

    async def serve() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve_console(
                lambda: make_app(args, args.allow_actions, args.operators),
                args.console_listen,
                ready,
            )
        banner("console stopped")

    try:
        asyncio.run(serve())
    except (OSError, ValueError) as exc:
        return exits.fail(exc)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m console", description=__doc__)
    config.add_options(p, OPTIONS)
    add_client_options(p)
    p.set_defaults(parser=p)
    args = p.parse_args(argv)
    return run(args)
