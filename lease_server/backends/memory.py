"""In-memory lease backend: the honest fake for unit tests (no durability)."""

from __future__ import annotations

from collections.abc import Callable

from lease_server import leases
from lease_server.clock import Clock, SystemClock
from lease_server.leases import Grant, Held, LeaseInfo, LeaseRecord


class MemoryBackend:
    """Keeps records in a dict; every call is atomic because it never awaits inside."""

    name = "memory"
    #: Nothing here survives a restart: tokens would start over at 1.
    durability_warning = "in-memory state is lost on restart"

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._records: dict[str, LeaseRecord] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        """Always: memory does not go away (see ``HealthProbe``)."""
        return True

    def _get(self, resource: str) -> LeaseRecord:
        return self._records.get(resource) or LeaseRecord(resource)

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        record, outcome = leases.acquire(
            self._get(resource), holder, ttl_ms, request_id, self._clock.now_ms()
        )
        self._records[resource] = record
        return outcome

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        record, grant = leases.renew(
            self._get(resource), token, holder, ttl_ms, self._clock.now_ms()
        )
        self._records[resource] = record
        return grant

    async def release(self, resource: str, token: int, holder: str) -> None:
        self._records[resource] = leases.release(
            self._get(resource), token, holder, self._clock.now_ms()
        )

    async def describe(self, resource: str) -> LeaseInfo:
        return leases.describe(self._get(resource), self._clock.now_ms())

    def on_release(self, callback: Callable[[str], None]) -> None:
        # Only this process changes this state: the service already wakes its own waiters.
        return None
