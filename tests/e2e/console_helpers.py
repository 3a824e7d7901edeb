"""Run the web console in process (its own loop thread) against real servers, and a
real browser (Debian's chromium, driven by Playwright) for the console's tests."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Iterator

from console.command import make_app, serve_console

CHROMIUM = "/usr/bin/chromium"
OPERATOR = "alice"
PASSWORD = "correct horse"
OPERATORS = f"{OPERATOR}:sha256:{hashlib.sha256(PASSWORD.encode()).hexdigest()}"


@contextlib.contextmanager
def running_console(
    lease_addr: str, guard_addr: str, *, allow_actions: bool = False
) -> Iterator[str]:
    """Serve a console on a free port; yield its base URL (``http://127.0.0.1:PORT``)."""
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
            lambda: make_app(args, allow_actions, OPERATORS if allow_actions else None),
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
