"""Both servers in one process: real servers on free ports, in a background thread.

The SDK's documented test helper (:mod:`fencing.testing`) hands this module on; it
lives here, above the servers it starts, so the SDK itself never imports a server.

::

    from fencing.testing import running_servers

    with running_servers() as servers:              # in-memory lease server + guard
        leases = LeaseClient(servers.lease_address)
        guard = GuardClient(servers.guard_address)
        queue = QueueClient(servers.queue_address)  # hosted by the lease server

The servers are the real gRPC servers on 127.0.0.1 with port 0; only their storage
is in memory unless you pass ``sqlite:`` URLs (or any other backend URL).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from guard.fence import FenceMode
from guard.server import GuardServer, start_guard
from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.service import QueueOptions
from lease_server.server import LeaseServer, start_lease_server
from serving.server import ServerOptions

T = TypeVar("T")


@dataclass
class RunningServers:
    """Addresses of the started servers, and their loop for in-process inspection."""

    lease: LeaseServer
    guard: GuardServer
    loop: asyncio.AbstractEventLoop
    _thread: threading.Thread = field(repr=False)

    @property
    def lease_address(self) -> str:
        return self.lease.address

    @property
    def guard_address(self) -> str:
        return self.guard.address

    @property
    def queue_address(self) -> str:
        """The queue service's address: the lease server hosts it."""
        return self.lease.address

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the servers' loop (e.g. to inspect a backend) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextmanager
def running_servers(
    backend: LeaseBackend | str = "memory://",
    store: GuardStore | str = "memory://",
    *,
    mode: FenceMode = FenceMode.MONOTONIC,
    host: str = "127.0.0.1",
    options: ServerOptions | None = None,
    queue: QueueBackend | str | None = None,
    queue_options: QueueOptions | None = None,
) -> Iterator[RunningServers]:
    """Start a lease server and a guard on free ports in a daemon thread; stop them after.

    ``options`` (TLS, auth, per-client caps, metrics...) apply to both servers. The
    lease server hosts the queue service, on ``queue`` (default: beside the leases,
    see :func:`lease_server.queue.backends.queue_url_for`).
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    thread = threading.Thread(
        target=_run_loop, args=(loop, started), daemon=True, name="fencing-test-servers"
    )
    thread.start()
    started.wait()

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    lease = call(
        start_lease_server(
            backend, f"{host}:0", options=options, queue=queue, queue_options=queue_options
        )
    )
    try:
        # In watch mode the guard follows this lease server.
        follow = lease.address if mode is FenceMode.WATCH else ""
        guard = call(
            start_guard(store, f"{host}:0", mode=mode, options=options, lease_server=follow)
        )
    except BaseException:
        call(lease.stop(0))
        raise
    try:
        yield RunningServers(lease, guard, loop, thread)
    finally:
        call(guard.stop(0.5))
        call(lease.stop(0.5))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _run_loop(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()
