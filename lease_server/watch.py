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
                known = self.head
                head = await self.backend.head_revision()
                if head < known:
                    # Every head the feed knew was committed before this read began: the
                    # log went back (a Redis that forgot, a restored database). Follow it,
                    # or streams below the old head would never wait again.
                    log.warning(
                        "event log head went back from %d to %d: the backend lost or "
                        "replaced its log; watchers resync",
                        known,
                        head,
                    )
                    self.head = head
                else:
                    self.advance(head)
            except FencingError as exc:
                log.warning("watch feed cannot read the event log: %s", exc)
            await asyncio.sleep(self.poll_interval)


class ResourceFeed:
    """News of watched resources' own logs, and a way to wait for it.

    A stream takes :meth:`version` of its resource *before* it reads, then waits in
    :meth:`wait_changed` until news arrived since (during the read included) or
    ``poll_interval`` passed. News is counted, not compared by revision, so a log
    that starts over (a Redis that forgot) cannot leave a stream spinning.
    """

    def __init__(self, backend: ResourceEventLog, poll_interval: float = POLL_INTERVAL) -> None:
        self.backend = backend
        self.poll_interval = poll_interval
        self.closed = False
        #: watched resource -> [news heard so far, streams watching it]
        self._watched: dict[str, list[int]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        backend.on_resource_events(self.advance)

    @property
    def watchers(self) -> int:
        return sum(count for _, count in self._watched.values())

    def advance(self, resource: str, head: int) -> None:
        """``resource``'s log reached ``head``: wake its streams (unwatched: ignored)."""
        entry = self._watched.get(resource)
        if entry is not None:
            entry[0] += 1
            changed = self._changed.pop(resource, None)
            if changed is not None:
                changed.set()

    def close(self) -> None:
        """The server is stopping: every waiting stream returns False."""
        self.closed = True
        for changed in self._changed.values():
            changed.set()
        self._changed.clear()

    @contextlib.contextmanager
    def watching(self, resource: str) -> Iterator[None]:
        entry = self._watched.setdefault(resource, [0, 0])
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._watched[resource]
                self._changed.pop(resource, None)

    def version(self, resource: str) -> int:
        """How much news of ``resource`` was heard so far (take it before reading)."""
        entry = self._watched.get(resource)
        return entry[0] if entry is not None else 0

    async def wait_changed(self, resource: str, version: int) -> bool:
        """Sleep until news of ``resource`` newer than ``version`` or ``poll_interval``
        (then the caller reads anyway); False if the feed closed first."""
        if self.closed:
            return False
        if self.version(resource) != version:
            return True
        changed = self._changed.setdefault(resource, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.poll_interval):
                await changed.wait()
        return not self.closed
