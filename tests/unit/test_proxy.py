"""The fault proxy against a real echo server on loopback: each fault does what it says.

Timing assertions are lower bounds only (a delay is at least the latency set);
"nothing arrives" is shown by a short read timeout, then the fault is healed and
the held bytes must arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from chaos.proxy import FaultProxy, ThreadedFaultProxy
from serving.ports import free_port

QUIET_S = 0.3  # how long "nothing arrives" is watched for


class EchoServer:
    """Echoes what it receives, records it, and can push bytes to every client."""

    def __init__(self) -> None:
        self.port = 0
        self.received = bytearray()
        self.clients: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def push(self, data: bytes) -> None:
        for w in self.clients:
            w.write(data)
            await w.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.clients.append(writer)
        try:
            while data := await reader.read(65536):
                self.received += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # a cancelled handler task would be logged as an error by asyncio
        finally:
            self.clients.remove(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._tasks.discard(task)


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = EchoServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy(echo: EchoServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", echo.port) as p:
        yield p


@contextlib.asynccontextmanager
async def dial(
    proxy: FaultProxy,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def echoes(proxy: FaultProxy, data: bytes = b"ping") -> bool:
    async with dial(proxy) as (reader, writer):
        writer.write(data)
        return await asyncio.wait_for(reader.readexactly(len(data)), 2) == data


async def silent(reader: asyncio.StreamReader) -> bool:
    try:
        await asyncio.wait_for(reader.read(1), QUIET_S)
    except TimeoutError:
        return True
    return False


async def sees_reset_or_eof(reader: asyncio.StreamReader) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), 2)
    except ConnectionResetError:
        return True
    return data == b""


async def test_bytes_flow_both_ways(proxy: FaultProxy) -> None:
    assert await echoes(proxy)
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks, queues and drains
    async with dial(proxy) as (reader, writer):
        writer.write(payload)
        assert await asyncio.wait_for(reader.readexactly(len(payload)), 5) == payload
        assert proxy.connections == 1


async def test_latency_delays_each_direction_by_at_least_the_latency(proxy: FaultProxy) -> None:
    proxy.latency(150)
    async with dial(proxy) as (reader, writer):
        start = time.monotonic()
        writer.write(b"slow")
        assert await asyncio.wait_for(reader.readexactly(4), 3) == b"slow"
        assert time.monotonic() - start >= 2 * 0.150  # there and back
    assert proxy.faults["latency_ms"] == 150
    proxy.heal()
    assert proxy.faults == FaultProxy("127.0.0.1", 1).faults  # nothing left in force


async def test_blackhole_is_a_partition_until_heal(echo: EchoServer, proxy: FaultProxy) -> None:
    async with dial(proxy) as (reader, writer):
        assert await echoes(proxy)
        proxy.blackhole()
        writer.write(b"held")
        assert await silent(reader)
        assert b"held" not in echo.received
        async with dial(proxy) as (reader2, writer2):  # a new connection is silent too
            writer2.write(b"x")
            assert await silent(reader2)
        proxy.heal()
        assert await echoes(proxy, b"after")  # heal restores flow on a new connection
        # Held bytes are delivered, not dropped (like TCP after a partition heals).
        assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"


async def test_reset_closes_current_connections_with_rst(proxy: FaultProxy) -> None:
    async with dial(proxy) as (reader, writer):
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        proxy.reset()
        assert await sees_reset_or_eof(reader)
    assert await echoes(proxy)  # new connections are allowed


async def test_reset_sends_rst_not_fin(proxy: FaultProxy) -> None:
    async with dial(proxy) as (reader, writer):
        writer.write(b"ping")
        await reader.readexactly(4)
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), 2)


async def refused(proxy: FaultProxy) -> bool:
    """The connection is reset (the RST may even beat connect's return) or closed."""
    try:
        async with dial(proxy) as (reader, _):
            return await sees_reset_or_eof(reader)
    except ConnectionResetError:
        return True


async def test_refuse_resets_new_connections_only(proxy: FaultProxy) -> None:
    async with dial(proxy) as (old_reader, old_writer):
        proxy.refuse()
        assert await refused(proxy)
        old_writer.write(b"still")
        assert await asyncio.wait_for(old_reader.readexactly(5), 2) == b"still"
    proxy.heal()
    assert await echoes(proxy)


async def test_half_open_upstream_forwards_requests_but_not_replies(
    echo: EchoServer, proxy: FaultProxy
) -> None:
    proxy.half_open("upstream")
    async with dial(proxy) as (reader, writer):
        writer.write(b"req")
        assert await silent(reader)
        assert bytes(echo.received) == b"req"  # it arrived; the echo is what is held
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(3), 2) == b"req"


async def test_half_open_downstream_forwards_replies_but_not_requests(
    echo: EchoServer, proxy: FaultProxy
) -> None:
    proxy.half_open("downstream")
    async with dial(proxy) as (reader, writer):
        writer.write(b"req")
        assert await silent(reader)
        assert echo.received == b""
        await echo.push(b"news")
        assert await asyncio.wait_for(reader.readexactly(4), 2) == b"news"
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(3), 2) == b"req"
        assert bytes(echo.received) == b"req"


async def test_unreachable_upstream_resets_the_client() -> None:
    port = free_port()  # nothing listens there
    async with FaultProxy("127.0.0.1", port) as proxy:
        assert await refused(proxy)


async def test_stop_closes_every_connection(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port)
    await proxy.start()
    async with dial(proxy) as (reader, writer):
        writer.write(b"ping")
        await reader.readexactly(4)
        await proxy.stop()
        assert await sees_reset_or_eof(reader)
    await proxy.stop()  # idempotent


@pytest.mark.parametrize(
    ("upstream", "listen"), [("10.0.0.1", "127.0.0.1"), ("127.0.0.1", "0.0.0.0"), ("db", "::1")]
)
def test_only_loopback_addresses(upstream: str, listen: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(upstream, 5432, listen)
    with pytest.raises(ValueError, match="loopback"):
        ThreadedFaultProxy(upstream, 5432, listen)


def test_bad_arguments_are_refused() -> None:
    proxy = FaultProxy("127.0.0.1", 1)
    with pytest.raises(ValueError, match=">= 0"):
        proxy.latency(-1)
    with pytest.raises(ValueError, match="direction"):
        proxy.half_open("sideways")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not started"):
        _ = proxy.port


# -- the threaded twin, from synchronous code ------------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def sync_echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def sync_echoes(proxy: ThreadedFaultProxy, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as s:
        s.sendall(data)
        return s.recv(len(data), socket.MSG_WAITALL)


def sync_refused(proxy: ThreadedFaultProxy) -> bool:
    """The connection is reset (the RST may even beat connect's return) or closed."""
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as s:
            return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_threaded_proxy_works_from_sync_code(sync_echo: int) -> None:
    with ThreadedFaultProxy("127.0.0.1", sync_echo) as proxy:
        assert proxy.target == f"127.0.0.1:{proxy.port}"
        assert sync_echoes(proxy, b"ping") == b"ping"

        proxy.latency(100)
        start = time.monotonic()
        assert sync_echoes(proxy, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.100

        proxy.heal()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=QUIET_S) as s:
            s.sendall(b"a")
            assert s.recv(1) == b"a"
            assert proxy.connections >= 1  # earlier ones may still be closing
            proxy.blackhole()
            s.sendall(b"b")
            with pytest.raises(TimeoutError):
                s.recv(1)
            proxy.heal()
            s.settimeout(2)
            assert s.recv(1) == b"b"
            proxy.reset()
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1) == b""  # RST normally; EOF is also a dead connection

        proxy.refuse()
        assert sync_refused(proxy)
        proxy.heal()
        assert sync_echoes(proxy, b"back") == b"back"
    proxy.stop()  # idempotent after the with block
    with pytest.raises(RuntimeError, match="not started"):
        proxy.heal()
