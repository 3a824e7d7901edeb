"""What a server puts around its storage seam: a deadline on every call, a health probe.

:func:`with_deadline` wraps a lease backend or a guard store (any object with async
methods) so each call gets at most ``timeout`` seconds; a call that runs out raises
``BackendUnavailableError`` (gRPC ``UNAVAILABLE``), so a hung database never holds a
handler forever. The call may still take effect after its deadline: the caller
sees "unknown", which is why Acquire carries a request id and writes an
idempotency key. ``open`` is not bounded (migrations may take a while), nor are
async generator methods (streams) or the names a backend lists in its optional
``unbounded_methods``.

:func:`healthy` asks the object's optional ``async def healthy(self) -> bool`` (a
cheap round trip to the database), bounded the same way; an object without one is
assumed healthy while it answers. Servers call it periodically and report
``NOT_SERVING`` on ``grpc.health.v1`` while it says False.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from fencing.errors import BackendUnavailableError
from serving import deadlines

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Default seconds a single backend or store call may take.
DEFAULT_BACKEND_TIMEOUT = 5.0
#: Default seconds between health probes of the backend or store.
DEFAULT_HEALTH_INTERVAL = 2.0


class HealthProbe(Protocol):
    """The optional health method of a lease backend or guard store.

    ``healthy()`` makes one cheap round trip to the database (``SELECT 1``, ``PING``)
    and returns whether it answered; it should not raise (an exception counts as
    unhealthy) and need not bound itself (the server does). Memory and SQLite
    implement it trivially, Redis with PING; a PostgreSQL backend would run
    ``SELECT 1`` on a pooled connection. Without it a server stays SERVING while
    its database is down (calls then fail UNAVAILABLE one by one).
    """

    async def healthy(self) -> bool: ...


class StorageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "fencing_backend_up",
            "1 while the server's backend or store answers its health probe, else 0.",
            ("server",),
            registry=registry,
        )
        self.timeouts = Counter(
            "fencing_backend_timeouts_total",
            "Backend or store calls that ran past --backend-timeout.",
            ("server",),
            registry=registry,
        )


class _Deadlined:
    """A proxy bounding every coroutine method of ``inner`` (see :func:`with_deadline`)."""

    def __init__(
        self, inner: object, timeout: float, what: str, on_timeout: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._timeout = timeout
        self._what = what
        self._on_timeout = on_timeout
        self._unbounded = {"open", *getattr(inner, "unbounded_methods", ())}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in self._unbounded or not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        async def bounded(*args: Any, **kwargs: Any) -> Any:
            window = deadlines.within(self._timeout)
            try:
                with window:
                    return await attr(*args, **kwargs)
            except TimeoutError as exc:
                if not window.expired():
                    raise  # the backend's own TimeoutError, not our deadline
                self._on_timeout()
                raise BackendUnavailableError(
                    f"{self._what}.{name} took longer than {self._timeout:g} s; "
                    f"its effect is unknown"
                ) from exc

        # Built once per method: every later lookup finds it on the proxy itself, not
        # through __getattr__ (wrapping anew per call cost more than some backend calls).
        self.__dict__[name] = bounded
        return bounded

    def __repr__(self) -> str:
        return f"<{self._inner!r} with a {self._timeout:g} s deadline per call>"


def with_deadline(
    inner: T, timeout: float, what: str = "backend", on_timeout: Callable[[], None] = lambda: None
) -> T:
    """``inner`` with each async method call bounded by ``timeout`` seconds."""
    proxy: Any = _Deadlined(inner, timeout, what, on_timeout)
    wrapped: T = proxy
    return wrapped


async def healthy(inner: object, within: float) -> bool:
    """Ask ``inner.healthy()`` for at most ``within`` seconds; True if it has no such method."""
    probe = getattr(inner, "healthy", None)
    if probe is None:
        return True
    try:
        async with asyncio.timeout(within):
            return bool(await probe())
    except Exception as exc:
        log.debug("health probe of %r failed: %r", inner, exc)
        return False


__all__ = [
    "DEFAULT_BACKEND_TIMEOUT",
    "DEFAULT_HEALTH_INTERVAL",
    "HealthProbe",
    "StorageMetrics",
    "healthy",
    "with_deadline",
]
