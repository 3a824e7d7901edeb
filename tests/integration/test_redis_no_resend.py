"""A lost reply must not make the client run a non-idempotent script twice.

A small TCP proxy sits between the client and Redis. Armed, it forwards the next
EVALSHA to Redis, waits until Redis has answered (so the script did run), and then
drops the client's connection instead of relaying the reply. Our backend must
report ``BackendUnavailableError`` and leave the counter bumped once; the control,
redis-py's default client (10 retries), re-sends the script: its second run finds
the lease its first run took and answers "held", so the caller believes it failed
while it holds a lease nobody will release.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from fencing.errors import BackendUnavailableError
from lease_server.backends.redis import ACQUIRE_LUA, RedisBackend
from serving.redis_db import EventLogKeys, events_channel, url_for_node
from tests.redis_server import drop_prefix, unique_prefix

pytestmark = pytest.mark.redis


class CuttingProxy:
    """Relays bytes to Redis; counts EVALSHAs; can cut one reply off."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.evalshas = 0
        self.armed = False
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        cut = asyncio.Event()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if cut.is_set():
                    return  # Redis answered the cut command: drop the client now
                writer.write(data)
                await writer.drain()

        down = asyncio.create_task(downstream())
        try:
            while data := await reader.read(65536):
                n = data.count(b"EVALSHA")
                self.evalshas += n
                if n and self.armed:
                    self.armed = False
                    self.cuts += 1
                    cut.set()
                up_writer.write(data)
                await up_writer.drain()
                if cut.is_set():
                    await asyncio.wait_for(down, 5)
                    return
        finally:
            down.cancel()
            with contextlib.suppress(BaseException):
                await down
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._tasks.discard(task)


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[CuttingProxy]:
    client = Redis.from_url(redis_url)
    kw = client.connection_pool.connection_kwargs
    p = CuttingProxy(kw.get("host", "127.0.0.1"), int(kw.get("port", 6379)))
    await client.aclose()
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def counter(redis_url: str, key: str) -> int:
    client = Redis.from_url(redis_url)
    try:
        return int(await client.get(key) or 0)
    finally:
        await client.aclose()


async def test_acquire_script_is_sent_once_when_its_reply_is_lost(
    proxy: CuttingProxy, redis_url: str
) -> None:
    prefix = unique_prefix()
    via_proxy = url_for_node(redis_url, "127.0.0.1", proxy.port)
    backend = RedisBackend(via_proxy, prefix=prefix, clock_floor=False)
    await backend.open()
    try:
        await backend.acquire("warm-up", "a", 10_000, "")  # the script is cached by now
        proxy.evalshas = 0
        proxy.armed = True
        with pytest.raises(BackendUnavailableError):
            await backend.acquire("r", "a", 10_000, "")
        assert proxy.cuts == 1
        assert proxy.evalshas == 1, "the acquire script was sent again"
        assert await counter(redis_url, f"{prefix}:{{r}}:counter") == 1
        # The backend is usable again (a new connection) and the lease exists: the
        # script ran once, its reply was lost. A retry without request_id is refused.
        outcome = await backend.acquire("r", "b", 10_000, "")
        assert type(outcome).__name__ == "Held" and outcome.token == 1
    finally:
        await backend.close()
        await drop_prefix(redis_url, prefix)


async def test_control_redis_py_default_client_resends_the_script(
    proxy: CuttingProxy, redis_url: str
) -> None:
    """The control: with redis-py's default retries the same cut runs the script twice.

    (``Redis(...)`` retries 10 times by default in redis-py 8.1; ``Redis.from_url``
    happens not to. Ours are built with ``Retry(NoBackoff(), 0)`` either way.)
    """
    prefix = unique_prefix()
    default_retry = inspect.signature(Redis.__init__).parameters["retry"].default
    assert default_retry.get_retries() > 0
    via_proxy = url_for_node(redis_url, "127.0.0.1", proxy.port)
    client = Redis.from_url(via_proxy, retry=copy.deepcopy(default_retry))
    script = client.register_script(ACQUIRE_LUA)
    lease, count = f"{prefix}:{{r}}:lease", f"{prefix}:{{r}}:counter"
    # The one event log of a single Redis (see lease_server/lua/acquire.lua).
    log_keys = EventLogKeys.shared(prefix).all()

    def args(resource: str, ttl_ms: int) -> list[str | int]:
        return ["a", ttl_ms, "", "0", resource, "0", events_channel(prefix), "0"]

    try:
        warm = [f"{prefix}:{{w}}:lease", f"{prefix}:{{w}}:counter", *log_keys]
        await script(keys=warm, args=args("w", 1000))
        proxy.evalshas = 0
        proxy.armed = True
        outcome = await script(keys=[lease, count, *log_keys], args=args("r", 10_000))
        assert proxy.cuts == 1
        assert proxy.evalshas == 2
        # The re-sent script found its own first run's lease: "held", token 1.
        assert outcome[0] == b"held"
        assert await counter(redis_url, count) == 1
    finally:
        await client.aclose()
        await drop_prefix(redis_url, prefix)
