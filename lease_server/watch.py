"""Following the backend's event log for ``Watch`` streams.

Every stream keeps its own cursor (a revision) and scope, and reads its events
from the backend (``events_after``), so a stream that falls behind catches up from
the durable log and a slow client never holds back the others. What the streams
share is the :class:`EventFeed`: the newest revision this process knows of. It
learns it from the backend's ``on_events`` callback (this process's appends at
once; other processes' where the backend can notify) and, while anyone watches,
by polling ``head_revision`` every ``poll_interval`` (other processes sharing a
backend that cannot notify, e.g. SQLite). A stream sleeps until the feed passes
its cursor, then reads.

A backend with one log per resource (:class:`~lease_server.backends.base.ResourceEventLog`,
a Redis Cluster) has no global head: its streams watch one resource each and share a
:class:`ResourceFeed`, which knows the newest revision of each watched resource from
``on_resource_events``; a stream also re-reads every ``poll_interval`` anyway (other
processes' appends whose message was lost, and an expiry, which such a backend logs
when the resource's log is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from fencing.errors import FencingError
from lease_server.backends.base import EventLog, ResourceEventLog

log = logging.getLogger(__name__)

#: How often the feed asks the backend for its head while someone watches (seconds).
POLL_INTERVAL = 0.1


class EventFeed:
    """The newest revision of the log, and a way to wait until it passes a cursor."""

    def __init__(self, backend: EventLog, poll_interval: float = POLL_INTERVAL) -> None:
        self.backend = backend
        self.poll_interval = poll_interval
        self.head = 0
        self.closed = False
        self._watchers = 0
        self._changed = asyncio.Event()
        self._someone_watches = asyncio.Event()
        backend.on_events(self.advance)

    @property
    def watchers(self) -> int:
        return self._watchers

    def advance(self, head: int) -> None:
        """The log reached ``head``: wake every stream waiting below it."""
        if head > self.head:
            self.head = head
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """The server is stopping: every waiting stream returns False."""
        self.closed = True
        self._wake()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Count one stream for as long as the block runs (polling runs only while > 0)."""
        self._watchers += 1
        self._someone_watches.set()
        try:
            yield
        finally:
            self._watchers -= 1
            if self._watchers == 0:
                self._someone_watches.clear()

    async def wait_beyond(self, cursor: int) -> bool:
        """Sleep until the log passes ``cursor``; False if the feed closed first."""
        while self.head <= cursor:
            if self.closed:
                return False
            changed = self._changed
            await changed.wait()
        return True

    async def run(self) -> None:
        """Poll the backend's head while anyone watches. Runs until cancelled."""
        while not self.closed:
            await self._someone_watches.wait()
            try:
                self.advance(await self.backend.head_revision())
            except FencingError as exc:
                log.warning("watch feed cannot read the event log: %s", exc)
            await asyncio.sleep(self.poll_interval)


class ResourceFeed:
    """The newest revision of each watched resource's own log, and a way to wait for it."""

    def __init__(self, backend: ResourceEventLog, poll_interval: float = POLL_INTERVAL) -> None:
        self.backend = backend
        self.poll_interval = poll_interval
        self.closed = False
        #: resource -> (newest revision known, number of streams watching it).
        self._heads: dict[str, list[int]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        backend.on_resource_events(self.advance)

    @property
    def watchers(self) -> int:
        return sum(count for _, count in self._heads.values())

    def advance(self, resource: str, head: int) -> None:
        """``resource``'s log reached ``head``: wake its streams (unwatched: ignored)."""
        entry = self._heads.get(resource)
        if entry is not None and head > entry[0]:
            entry[0] = head
            self._wake(resource)

    def _wake(self, resource: str) -> None:
        changed = self._changed.pop(resource, None)
        if changed is not None:
            changed.set()

    def close(self) -> None:
        """The server is stopping: every waiting stream returns False."""
        self.closed = True
        for resource in list(self._changed):
            self._wake(resource)

    @contextlib.contextmanager
    def watching(self, resource: str) -> Iterator[None]:
        entry = self._heads.setdefault(resource, [0, 0])
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._heads[resource]
                self._changed.pop(resource, None)

    async def wait_beyond(self, resource: str, cursor: int) -> bool:
        """Sleep until ``resource``'s log passes ``cursor`` or ``poll_interval`` ran out
        (then the caller reads anyway); False if the feed closed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.poll_interval
        while not self.closed:
            entry = self._heads.get(resource)
            if entry is None or entry[0] > cursor:
                return True
            left = deadline - loop.time()
            if left <= 0:
                return True
            changed = self._changed.setdefault(resource, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await changed.wait()
        return False
