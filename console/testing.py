"""Run the web console in process, for tests and benchmarks (as
:func:`fencing.testing.running_servers` runs the servers)::

    with running_servers() as servers, running_console(
        servers.lease_address, servers.guard_address
    ) as url:
        ...  # GET f"{url}/leases"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
from collections.abc import Iterator

from console.command import make_app, serve_console


@contextlib.contextmanager
def running_console(
    lease_addr: str,
    guard_addr: str,
    *,
    allow_actions: bool = False,
    operators: str | None = None,
) -> Iterator[str]:
    """Serve a console on a free port of 127.0.0.1 in a thread of its own (its own
    loop); yield its base URL (``http://127.0.0.1:PORT``); stop it after.

    ``guard_addr`` may name several guards, comma-separated; ``operators`` as
    ``--operators`` (``NAME:sha256:HEX,...``).
    """
    args = argparse.Namespace(
        lease_addr=lease_addr,
        guard_addr=guard_addr,
        tls_ca=None,
        tls_cert=None,
        tls_key=None,
        tls_server_name=None,
        auth_token=None,
    )
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    urls: list[str] = []

    def on_ready(url: str) -> None:
        urls.append(url.rstrip("/"))
        ready.set()

    task: asyncio.Task[None] | None = None

    async def main() -> None:
        nonlocal task
        task = asyncio.current_task()
        await serve_console(
            lambda: make_app(args, allow_actions, operators),
            "127.0.0.1:0",
            on_ready,
        )

    def run() -> None:
        asyncio.set_event_loop(loop)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True, name="console")
    thread.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the console did not start")
        yield urls[0]
    finally:
        if task is not None:
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        loop.close()
