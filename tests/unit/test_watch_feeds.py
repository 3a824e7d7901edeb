"""The feeds Watch streams wait on (lease_server/watch.py), against fake logs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from lease_server.leases import EventPage, LoggedEvent, Scope
from lease_server.watch import EventFeed, ResourceFeed


class FakeLog:
    """Both logs' shapes; the feeds use a head to poll and the callbacks."""

    def __init__(self) -> None:
        self.head = 0
        self.on_head: list[Callable[[int], None]] = []
        self.on_resource: list[Callable[[str, int], None]] = []

    async def head_revision(self) -> int:
        return self.head

    async def log_id(self) -> str:
        return "fake"

    def on_events(self, callback: Callable[[int], None]) -> None:
        self.on_head.append(callback)

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        return EventPage((), self.head, 0)

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        return []

    async def prune_events(self, keep: int) -> int:
        return 0

    async def resource_head(self, resource: str) -> int:
        return 0

    async def resource_events_after(self, resource: str, revision: int, limit: int) -> EventPage:
        return EventPage((), 0, 0)

    def on_resource_events(self, callback: Callable[[str, int], None]) -> None:
        self.on_resource.append(callback)


async def test_the_event_feed_follows_a_log_that_went_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backend that lost its log (a Redis restarted without persistence) starts over
    at 0: the poll follows it down, so a stream below the old head waits again instead
    of re-reading in a loop."""
    log = FakeLog()
    feed = EventFeed(log, poll_interval=0.01)
    log.head = 50
    for callback in log.on_head:
        callback(50)
    assert feed.head == 50
    assert await asyncio.wait_for(feed.wait_beyond(10), 1)  # news beyond 10: at once
    log.head = 2  # the log starts over
    runner = asyncio.create_task(feed.run())
    try:
        with feed.watching():
            for _ in range(100):
                if feed.head == 2:
                    break
                await asyncio.sleep(0.01)
        assert feed.head == 2
        assert "went back from 50 to 2" in caplog.text
        waiting = asyncio.create_task(feed.wait_beyond(2))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # waits for news, does not spin
        for callback in log.on_head:
            callback(3)  # the new log's next append
        assert await asyncio.wait_for(waiting, 1)
    finally:
        feed.close()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_the_resource_feed_wakes_on_news_of_the_watched_resource_only() -> None:
    log = FakeLog()
    feed = ResourceFeed(log, poll_interval=5.0)
    with feed.watching("r"):
        noted = feed.version("r")
        waiting = asyncio.create_task(feed.wait_changed("r", noted))
        await asyncio.sleep(0.02)
        log.on_resource[0]("other", 9)  # not watched: ignored
        await asyncio.sleep(0.02)
        assert not waiting.done()
        log.on_resource[0]("r", 1)
        assert await asyncio.wait_for(waiting, 1)
        # News heard while the stream was reading counts too: no wait at all.
        noted = feed.version("r")
        log.on_resource[0]("r", 2)
        assert await asyncio.wait_for(feed.wait_changed("r", noted), 0.1)
        # A log that starts over (lower revisions) is still news: counted, not compared.
        noted = feed.version("r")
        log.on_resource[0]("r", 1)
        assert await asyncio.wait_for(feed.wait_changed("r", noted), 0.1)
    assert feed.watchers == 0 and feed.version("r") == 0


async def test_the_resource_feed_polls_and_closes() -> None:
    log = FakeLog()
    feed = ResourceFeed(log, poll_interval=0.05)
    with feed.watching("r"):
        # No news: the stream reads again after the poll interval (expiries are logged
        # when read, and a lost pub/sub message must not stall it).
        assert await asyncio.wait_for(feed.wait_changed("r", feed.version("r")), 1)
        waiting = asyncio.create_task(feed.wait_changed("r", feed.version("r")))
        await asyncio.sleep(0)
        feed.close()
        assert await asyncio.wait_for(waiting, 1) is False
        assert await feed.wait_changed("r", feed.version("r")) is False
