"""A TCP fault proxy on loopback: put it between two parts and break the link on demand.

:class:`FaultProxy` listens on a loopback port and forwards every connection to one
upstream (``client -> proxy -> upstream``). Faults apply to all connections, current
and future, from the moment they are set, and stay until :meth:`FaultProxy.heal`:

- ``latency(ms, jitter_ms)``: hold each chunk ``ms`` (plus a uniform draw in
  ``[-jitter_ms, +jitter_ms]``, never below zero) before forwarding it, in both
  directions. Order is kept; delay does not accumulate across chunks.
- ``blackhole()``: a partition. Nothing is forwarded either way, but every socket
  stays open, so peers see timeouts, not errors. New connections are accepted and
  get the same silence.
- ``reset()``: close every current connection abruptly, sending RST to both peers
  (``SO_LINGER`` 0). New connections are allowed.
- ``refuse()``: accept new connections and reset them at once; current ones go on.
- ``half_open(direction)``: forward only one direction: ``"upstream"`` (client to
  upstream) or ``"downstream"`` (upstream to client); the other is held as in a
  blackhole.
- ``heal()``: clear every fault.

Held data is delivered, not dropped: while a direction is blackholed its bytes wait
(at most ``queue_chunks`` chunks in the proxy, the rest in the kernel's socket
buffers, which then push back on the sender through TCP flow control) and are
forwarded in order on :meth:`~FaultProxy.heal`. That is what TCP retransmission does
when a real partition heals; dropping bytes from the middle of a stream would not
simulate a network but corrupt the protocol framing (gRPC's HTTP/2 frames). A peer
that gave up during the partition closed its connection, which the proxy passes on.

A reset on one side (a peer that died, or :meth:`~FaultProxy.reset`) is passed on as
a reset to the other side; a clean close (EOF) is passed on as a half-close.

Each connection has one reader and one writer task per direction, joined by a
bounded queue; tasks wait on events and timers, never poll. Only loopback addresses
are accepted, for both the listener and the upstream. The proxy runs on the event
loop that calls :meth:`~FaultProxy.start`; its fault methods must be called from that
loop. :class:`ThreadedFaultProxy` hosts one on its own loop in a daemon thread and
offers the same methods as blocking calls for synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, Literal, TypeVar

Direction = Literal["upstream", "downstream"]
"""``upstream``: bytes from the client to the upstream; ``downstream``: the replies."""

DIRECTIONS: Final[tuple[Direction, Direction]] = ("upstream", "downstream")

CHUNK_BYTES: Final = 64 * 1024
"""Largest read per step; also the unit of the per-direction queue."""

_T = TypeVar("_T")


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"fault proxy only uses loopback addresses, got {host!r}")


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close the connection abruptly: with ``SO_LINGER`` 0 the kernel sends RST, not FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _closed(writer: asyncio.StreamWriter) -> None:
    if not writer.is_closing():
        writer.close()
    # Waiting lets the transport release its socket now rather than in a later GC.
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class _Link:
    """One proxied connection: both sides and its four pump tasks."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        _rst(self.client)
        _rst(self.upstream)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """An asyncio TCP proxy from ``listen_host:port`` to ``upstream_host:upstream_port``.

    ``listen_port=0`` picks a free port; read it from :attr:`port` after
    :meth:`start`. ``connect_timeout`` bounds the upstream connect of each accepted
    connection (on failure the client is reset). ``queue_chunks`` bounds what the
    proxy itself holds per direction of a connection. ``seed`` makes latency jitter
    reproducible. Raises ``ValueError`` for a non-loopback address. Usable as
    ``async with FaultProxy(...) as proxy``.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        connect_timeout: float = 5.0,
        queue_chunks: int = 16,
        seed: int | None = None,
    ) -> None:
        _require_loopback(upstream_host)
        _require_loopback(listen_host)
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._queue_chunks = queue_chunks
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._flow = {d: asyncio.Event() for d in DIRECTIONS}
        self._latency_s = 0.0
        self._jitter_s = 0.0
        self._blackholed = False
        self._one_way: Direction | None = None
        self._refusing = False
        self._update_flow()

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start listening; after it returns, connections to :attr:`port` are proxied."""
        if self._server is not None:
            raise RuntimeError("fault proxy already started")
        self._server = await asyncio.start_server(self._accept, self.listen_host, self._listen_port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and reset every connection; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for link in list(self._links):
            link.abort()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("fault proxy not started")
        return self._port

    @property
    def target(self) -> str:
        """``host:port`` to dial instead of the upstream (e.g. a gRPC target)."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections currently proxied."""
        return len(self._links)

    @property
    def faults(self) -> dict[str, object]:
        """The faults in force, for logs and reports."""
        return {
            "latency_ms": self._latency_s * 1000,
            "jitter_ms": self._jitter_s * 1000,
            "blackhole": self._blackholed,
            "half_open": self._one_way,
            "refuse": self._refusing,
        }

    # -- faults -------------------------------------------------------------------

    def latency(self, ms: float, jitter_ms: float = 0) -> None:
        """Delay every chunk read from now on by ``ms`` +/- up to ``jitter_ms``, both ways."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError("latency and jitter must be >= 0")
        self._latency_s, self._jitter_s = ms / 1000, jitter_ms / 1000

    def blackhole(self) -> None:
        """Partition: forward nothing either way, keep sockets open (peers time out)."""
        self._blackholed = True
        self._update_flow()

    def half_open(self, direction: Direction) -> None:
        """Forward only ``direction`` (``"upstream"`` or ``"downstream"``); hold the other."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'upstream' or 'downstream', got {direction!r}")
        self._one_way = direction
        self._update_flow()

    def reset(self) -> None:
        """Reset (RST) every current connection on both sides; new ones are allowed."""
        for link in list(self._links):
            link.abort()

    def refuse(self) -> None:
        """Reset every new connection as soon as it is accepted; current ones go on."""
        self._refusing = True

    def heal(self) -> None:
        """Clear every fault; held bytes are then delivered in order."""
        self._latency_s = self._jitter_s = 0.0
        self._blackholed = self._refusing = False
        self._one_way = None
        self._update_flow()

    def _update_flow(self) -> None:
        for d in DIRECTIONS:
            if not self._blackholed and self._one_way in (None, d):
                self._flow[d].set()
            else:
                self._flow[d].clear()

    def _due(self, now: float) -> float:
        jitter = self._random.uniform(-self._jitter_s, self._jitter_s) if self._jitter_s else 0
        return now + max(0.0, self._latency_s + jitter)

    # -- connections ----------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._connect(reader, writer)
        except asyncio.CancelledError:
            # Only stop() cancels handlers. asyncio's stream server reports a handler
            # task that ends cancelled as an unhandled error, so end it normally.
            pass
        finally:
            self._handlers.discard(task)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            _rst(writer)
            await _closed(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port),
                self._connect_timeout,
            )
        except (OSError, TimeoutError):
            _rst(writer)  # the upstream is down: the client sees what it would see
            await _closed(writer)
            return
        except asyncio.CancelledError:
            _rst(writer)
            await _closed(writer)
            raise
        await self._serve(_Link(writer, up_writer), reader, up_reader)

    async def _serve(
        self, link: _Link, client: asyncio.StreamReader, upstream: asyncio.StreamReader
    ) -> None:
        up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self._queue_chunks)
        down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self._queue_chunks)
        link.tasks = [
            asyncio.create_task(self._pump_in(client, up)),
            asyncio.create_task(self._pump_out(link.upstream, up, "upstream")),
            asyncio.create_task(self._pump_in(upstream, down)),
            asyncio.create_task(self._pump_out(link.client, down, "downstream")),
        ]
        self._links.add(link)
        try:
            # Returns when every pump ended cleanly (both EOFs passed on), or at the
            # first error, or when reset() cancelled them all.
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_EXCEPTION)
            if not all(
                t.done() and not t.cancelled() and t.exception() is None for t in link.tasks
            ):
                link.abort()  # an error on one side is a reset on the other
        finally:
            self._links.discard(link)
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)
            await _closed(link.client)
            await _closed(link.upstream)

    async def _pump_in(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(CHUNK_BYTES)
            # A full queue blocks here, so the kernel buffers fill and TCP pushes back.
            await queue.put((self._due(loop.time()), data))
            if not data:
                return

    async def _pump_out(
        self,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes]],
        direction: Direction,
    ) -> None:
        loop = asyncio.get_running_loop()
        flow = self._flow[direction]
        while True:
            due, data = await queue.get()
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await flow.wait()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()


class ThreadedFaultProxy:
    """A :class:`FaultProxy` on its own event loop in a daemon thread, for synchronous code.

    Same constructor arguments and fault methods, each a blocking call that returns
    once the fault is in force (a :meth:`reset` has closed the sockets by then). Any
    call waits at most ``call_timeout`` seconds, then raises ``TimeoutError``. Usable
    as ``with ThreadedFaultProxy(...) as proxy``; :meth:`stop` ends the thread.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        connect_timeout: float = 5.0,
        queue_chunks: int = 16,
        seed: int | None = None,
        call_timeout: float = 10.0,
    ) -> None:
        _require_loopback(upstream_host)
        _require_loopback(listen_host)
        self._make: Callable[[], FaultProxy] = lambda: FaultProxy(
            upstream_host,
            upstream_port,
            listen_host,
            listen_port,
            connect_timeout=connect_timeout,
            queue_chunks=queue_chunks,
            seed=seed,
        )
        self._call_timeout = call_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._proxy: FaultProxy | None = None

    def start(self) -> None:
        """Start the loop thread and the proxy; returns once it listens."""
        if self._loop is not None:
            raise RuntimeError("fault proxy already started")
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="fault-proxy", daemon=True
        )
        self._thread.start()
        self._loop = loop

        async def start() -> FaultProxy:
            proxy = self._make()
            await proxy.start()
            return proxy

        try:
            self._proxy = self._call(start())
        except BaseException:
            self._end_thread()
            raise

    def stop(self) -> None:
        """Stop the proxy (resetting its connections) and end the thread; idempotent."""
        if self._loop is None:
            return
        try:
            if self._proxy is not None:
                self._call(self._proxy.stop())
        finally:
            self._proxy = None
            self._end_thread()

    def __enter__(self) -> ThreadedFaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        return self._started().port

    @property
    def target(self) -> str:
        """``host:port`` to dial instead of the upstream."""
        return self._started().target

    @property
    def connections(self) -> int:
        """Connections currently proxied."""
        return self._do(lambda p: p.connections)

    @property
    def faults(self) -> dict[str, object]:
        """The faults in force."""
        return self._do(lambda p: p.faults)

    def latency(self, ms: float, jitter_ms: float = 0) -> None:
        """See :meth:`FaultProxy.latency`."""
        self._do(lambda p: p.latency(ms, jitter_ms))

    def blackhole(self) -> None:
        """See :meth:`FaultProxy.blackhole`."""
        self._do(lambda p: p.blackhole())

    def half_open(self, direction: Direction) -> None:
        """See :meth:`FaultProxy.half_open`."""
        self._do(lambda p: p.half_open(direction))

    def reset(self) -> None:
        """See :meth:`FaultProxy.reset`."""
        self._do(lambda p: p.reset())

    def refuse(self) -> None:
        """See :meth:`FaultProxy.refuse`."""
        self._do(lambda p: p.refuse())

    def heal(self) -> None:
        """See :meth:`FaultProxy.heal`."""
        self._do(lambda p: p.heal())

    def _started(self) -> FaultProxy:
        if self._proxy is None:
            raise RuntimeError("fault proxy not started")
        return self._proxy

    def _do(self, action: Callable[[FaultProxy], _T]) -> _T:
        proxy = self._started()

        async def run() -> _T:
            result = action(proxy)
            # Aborted transports close their sockets in the next loop iteration; wait
            # for it so a reset has happened when the blocking call returns.
            await asyncio.sleep(0)
            return result

        return self._call(run())

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._call_timeout)

    def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(self._call_timeout)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


__all__ = ["CHUNK_BYTES", "DIRECTIONS", "Direction", "FaultProxy", "ThreadedFaultProxy"]
