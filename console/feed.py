"""One ``Watch`` stream per console process, shared by every open tab.

:class:`LeaseFeed` follows every lease event of the lease server (one stream, prefix
''), whatever the number of tabs: an idle console costs the lease server that one
stream. Each tab's server-sent-events connection is a :class:`Subscriber` with a
prefix; an event under its prefix sets its ``changed`` flag, and the tab re-reads
its page of ``List`` at most a few times a second (events coalesce: a tab never
queues events, so a burst of renewals costs it one refresh). When the stream fails
the feed marks the lease server down (the banner every tab shows), retries with
backoff, and on reconnecting wakes every subscriber (it may have missed events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from console.upstream import Upstream
from fencing.client import EventKind
from fencing.errors import FencingError

log = logging.getLogger(__name__)

#: Backoff between reconnection attempts (seconds): doubled from the first to the last.
RETRY_FIRST = 0.2
RETRY_MAX = 1.0


class Subscriber:
    """One tab's interest: lease events under ``prefix``, and the lease server's health."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.changed = asyncio.Event()
        #: Set whenever the lease server goes down or comes back.
        self.health = asyncio.Event()


class LeaseFeed:
    """The shared Watch stream and the subscribers it wakes."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.subscribers: set[Subscriber] = set()
        #: The newest revision seen (0: none yet).
        self.revision = 0
        #: Watch streams this process opened in all (one while it stays connected).
        self.streams_opened = 0
        self.connected = False
        #: Set when the console stops: every event stream ends.
        self.closed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="console-lease-feed")

    def close_streams(self) -> None:
        """End every tab's event stream (the console is stopping)."""
        self.closed.set()
        for sub in self.subscribers:
            sub.changed.set()

    async def stop(self) -> None:
        self.close_streams()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def subscribe(self, prefix: str) -> Subscriber:
        sub = Subscriber(prefix)
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def _health_changed(self, connected: bool, error: str | None) -> None:
        self.upstream.mark("lease server", self.upstream.lease_addr, error)
        if connected == self.connected and error is None:
            return
        self.connected = connected
        for sub in self.subscribers:
            sub.health.set()
            sub.changed.set()  # re-read: events may have been missed meanwhile

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while True:
            try:
                stream = await self.upstream.leases.watch_stream("", prefix="")
                self.streams_opened += 1
                async with stream:
                    self._health_changed(True, None)
                    delay = RETRY_FIRST
                    async for event in stream:
                        self.revision = max(self.revision, event.revision)
                        for sub in self.subscribers:
                            if event.kind is EventKind.RESYNC or event.resource.startswith(
                                sub.prefix
                            ):
                                sub.changed.set()
                raise FencingError("the watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("console watch stream failed (%s); again in %.1f s", exc, delay)
                self._health_changed(False, str(exc) or type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
