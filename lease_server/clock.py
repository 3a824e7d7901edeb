"""The lease server's clock: expiry is decided by the backend's clock alone (G7).

Embedded backends use this host's wall clock in milliseconds, because expiries are
stored and must mean the same after a restart (a monotonic clock restarts at boot).
A wall-clock step forward expires leases early (the guard keeps that safe); a step
back lengthens them. Tests inject :class:`ManualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        self._now += ms
