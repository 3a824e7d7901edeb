"""In-memory lease backend: the honest fake for unit tests (no durability).

The event log is a list of the retained events in revision order, trimmed from
the front by ``prune_events``. Listeners are called synchronously after each append.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Callable, Sequence

from fencing.errors import LeaseLost
from fencing.types import LeaseState
from lease_server import leases
from lease_server.clock import Clock, SystemClock
from lease_server.leases import (
    EventPage,
    Grant,
    Held,
    LeaseRecord,
    LeaseStep,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    Transition,
)


class MemoryBackend:
    """Keeps records in a dict; every call is atomic because it never awaits inside."""

    name = "memory"
    #: Nothing here survives a restart: tokens would start over at 1.
    durability_warning = "in-memory state is lost on restart"

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._records: dict[str, LeaseRecord] = {}
        self._events: list[LoggedEvent] = []
        self._head = 0
        self._compacted_through = 0
        self._listeners: list[Callable[[int], None]] = []
        #: Drawn per object: the log lives and dies with it.
        self._log_id = uuid.uuid4().hex

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        """Always: memory does not go away (see ``HealthProbe``)."""
        return True

    def _get(self, resource: str) -> LeaseRecord:
        return self._records.get(resource) or LeaseRecord(resource)

    def _put(self, old: LeaseRecord, new: LeaseRecord, now_ms: int) -> list[LoggedEvent]:
        """Store ``new`` and append its transitions: one atomic step (no await)."""
        self._records[new.resource] = new
        return self._append(leases.transitions(old, new, now_ms))

    def append(self, changes: list[Transition]) -> list[LoggedEvent]:
        """Number and append ``changes`` (job events of the memory queue backend, in the
        same atomic step as its change), and tell the listeners."""
        return self._append(changes)

    def _append(self, changes: list[Transition]) -> list[LoggedEvent]:
        appended = []
        for change in changes:
            self._head += 1
            appended.append(change.numbered(self._head))
        self._events.extend(appended)
        if appended:
            for listener in self._listeners:
                listener(self._head)
        return appended

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        now = self._clock.now_ms()
        old = self._get(resource)
        record, outcome = leases.acquire(old, holder, ttl_ms, request_id, now)
        self._put(old, record, now)
        return outcome

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        now = self._clock.now_ms()
        old = self._get(resource)
        record, grant = leases.renew(old, token, holder, ttl_ms, now)
        self._put(old, record, now)
        return grant

    async def release(self, resource: str, token: int, holder: str) -> None:
        now = self._clock.now_ms()
        old = self._get(resource)
        self._put(old, leases.release(old, token, holder, now), now)

    async def describe(self, resource: str) -> LeaseState:
        return leases.describe(self._get(resource), self._clock.now_ms())

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        now = self._clock.now_ms()
        return leases.list_held(self._records.values(), prefix, after, limit, now)

    # -- many at once (no await inside: each is one atomic step) ----------------------------

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        now = self._clock.now_ms()
        old = [self._get(r) for r in resources]
        new, outcome = leases.acquire_all(old, holder, ttl_ms, request_id, now)
        for before, after in zip(old, new, strict=True):
            self._put(before, after, now)
        return outcome

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        now = self._clock.now_ms()
        outcomes: list[Grant | LeaseLost] = []
        for item in items:
            old = self._get(item.resource)
            try:
                new, grant = leases.renew(old, item.token, item.holder, item.ttl_ms, now)
            except LeaseLost as exc:
                outcomes.append(exc)
                continue
            self._put(old, new, now)
            outcomes.append(grant)
        return outcomes

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        now = self._clock.now_ms()
        outcomes: list[LeaseLost | None] = []
        for item in items:
            old = self._get(item.resource)
            try:
                new = leases.release(old, item.token, item.holder, now)
            except LeaseLost as exc:
                outcomes.append(exc)
                continue
            self._put(old, new, now)
            outcomes.append(None)
        return outcomes

    #: Every call is atomic and instant: nothing to overlap.
    step_concurrency = 1

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        now = self._clock.now_ms()
        outcomes: list[StepOutcome] = []
        for op in steps:
            old = self._get(op.resource)
            new, outcome = leases.step(old, op, now)
            self._put(old, new, now)
            outcomes.append(outcome)
        return outcomes

    def on_release(self, callback: Callable[[str], None]) -> None:
        # Only this process changes this state: the service already wakes its own waiters.
        return None

    # -- the event log -----------------------------------------------------------------------

    async def head_revision(self) -> int:
        return self._head

    async def log_id(self) -> str:
        return self._log_id

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        start = bisect.bisect_right(self._events, revision, key=lambda e: e.revision)
        found: list[LoggedEvent] = []
        for event in self._events[start:]:
            if scope.matches(event.resource):
                found.append(event)
                if len(found) >= limit:
                    break
        return EventPage(tuple(found), self._head, self._compacted_through)

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        now = self._clock.now_ms()
        due = [r for r in self._records.values() if r.token and not r.live(now)]
        due.sort(key=lambda r: (r.expires_at_ms, r.resource))
        appended: list[LoggedEvent] = []
        for old in due[:limit]:
            appended += self._put(old, leases.expire(old, now), now)
        return appended

    async def prune_events(self, keep: int) -> int:
        drop = max(0, len(self._events) - max(0, keep))
        if drop:
            self._compacted_through = self._events[drop - 1].revision
            del self._events[:drop]
        return drop

    def on_events(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)
