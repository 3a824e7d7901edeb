"""The seam between the lease service and storage: one small Protocol.

A backend makes each of acquire, renew and release one atomic step on its own
clock, keeps a per-resource counter that is never deleted (so tokens only grow,
G1), and wraps its driver's errors once into ``BackendUnavailableError`` with the
cause chained. Waiting, validation and the wire live above it, in the service.
To add a backend, add a file beside this one and a branch in ``open_backend``.

Optional, and expected of every networked backend: ``async def healthy(self) ->
bool`` (:class:`fencing._storage.HealthProbe`), one cheap round trip to the database.
The server calls it every ``--health-interval`` seconds and reports NOT_SERVING on
``grpc.health.v1`` while it says False. Every other coroutine method is called with
a deadline (``--backend-timeout``) that ends it with ``BackendUnavailableError``;
list methods that must not be bounded in a class attribute ``unbounded_methods``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from lease_server.leases import Grant, Held, LeaseInfo


class LeaseBackend(Protocol):
    """Durable lease state for many resources."""

    #: Short name for logs and metrics ("memory", "sqlite", ...).
    name: str

    async def open(self) -> None:
        """Connect and create or upgrade the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        """Grant ``resource`` to ``holder`` if it is free or expired, in one atomic step.

        A retry with the current lease's non-empty ``request_id`` and holder returns
        that lease (``Grant.replayed``). Otherwise returns :class:`Held`.
        """

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        """Extend the current unexpired lease to now + ttl_ms, or raise ``LeaseLost``."""

    async def release(self, resource: str, token: int, holder: str) -> None:
        """Free the resource now, or raise ``LeaseLost``."""

    async def describe(self, resource: str) -> LeaseInfo:
        """Current state; an unknown resource is free with ``last_token == 0``."""

    def on_release(self, callback: Callable[[str], None]) -> None:
        """Register ``callback(resource)`` for releases made through *other* processes.

        Backends that can observe them (PostgreSQL LISTEN/NOTIFY, Redis pub/sub) call
        it from the event loop so waiters wake promptly; embedded backends, which only
        see their own process, keep the callback and never call it.
        """
