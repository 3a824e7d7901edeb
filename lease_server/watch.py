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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from fencing.errors import FencingError
from lease_server.backends.base import EventLog

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
