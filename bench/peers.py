"""Taking and giving back a lock: our Acquire+Release next to etcd, PostgreSQL and Redis locks.

From this one Python process, at each client count (each client on its own lock):

* **etcd lock + unlock**: ``etcd`` (3.4, from the Debian package) started here on free
  loopback ports in a temporary directory; each client grants one lease (ttl 10 s)
  once, as etcd's ``concurrency.Session`` does, then loops ``/v3/lock/lock`` (with
  that lease) and ``/v3/lock/unlock`` through etcd's JSON gateway over keep-alive
  HTTP/1.1 (a small stdlib-asyncio client, no new dependency);
* **PostgreSQL advisory lock**: ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` on
  one psycopg connection per client;
* **redis-py Lock**: ``Lock.acquire`` (``SET NX PX``) + ``release`` (its Lua script);
* **ours**: ``Acquire`` + ``Release`` through a lease server process on SQLite, on
  PostgreSQL and on Redis, each row's ratio against the peer on the same kind of
  store (SQLite against etcd, both durable single-node services with fsync);
* **ours via Session**: the same two calls through the lease stream (one
  ``Session`` per client, :mod:`bench.stream_client`), every backend's row against
  etcd (P5: at least 2.0 on SQLite and Redis, 1.5 on PostgreSQL, at 16 clients);
* **ours via one shared Session**: as many tasks on one stream, as a service's tasks
  share its one ``LeaseClient`` (etcd's Go client shares one connection the same
  way): calls queued together share messages, both ways;
* **two pings via Session, a stream per client**: the same messages as a streamed
  Acquire+Release, answered by the stream alone: the ceiling of the stream-per-client
  rows, whatever the backend.

Every client, ours and etcd's, has its own connection (grpc would otherwise share
one TCP connection among a process's channels to one address).

What the peers do not give, noted in the table: none checks anything at the
resource. etcd hands out a revision (the lock key's) and leaves the check to the
user; an advisory lock has no token and no expiry (held until the session ends);
redis-py's Lock value is random, so no order. Ours hands out a token that only
grows, and the guard checks it in the write's own transaction.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

import grpc.aio
import psycopg

from bench import postgres as pg_bench
from bench import redis as redis_bench
from bench.harness import Result, measure, progress, server
from bench.stream_client import OWN_CONNECTION, SessionStream
from fencing.v1 import lease_pb2, lease_pb2_grpc
from serving.ports import free_port

ETCD = "etcd lock+unlock (lease per client)"
ADVISORY = "postgres advisory lock+unlock"
REDIS_LOCK = "redis-py Lock acquire+release"
PINGS = "two pings via Session, a stream per client (the stream's floor)"
#: Seconds of the lease each etcd client grants once: longer than any run, as
#: ``concurrency.Session`` keeps its lease alive (a keep-alive here would be load of ours).
ETCD_LEASE_TTL = 3600

NOTES = {
    ETCD: "token = lock key revision; nothing checks it at the resource",
    ADVISORY: "no token, no expiry (held until the session ends)",
    REDIS_LOCK: "random value, no order; nothing checks it at the resource",
    "ours": "growing token; the guard checks it in the write's transaction",
}


# -- etcd ----------------------------------------------------------------------------------------


@contextmanager
def etcd_server() -> Iterator[tuple[str, int]]:
    """A one-member etcd on loopback in a temporary directory; yields (host, client port)."""
    with etcd_process() as (host, port, _):
        yield host, port


@contextmanager
def etcd_process() -> Iterator[tuple[str, int, int]]:
    """:func:`etcd_server`, yielding (host, client port, pid): for CPU accounting."""
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="fencing-etcd-") as tmp:
        proc = subprocess.Popen(
            [
                binary,
                "--name=bench",
                f"--data-dir={tmp}/data",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=bench=http://127.0.0.1:{peer}",
                "--log-level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", client), timeout=0.5) as s:
                        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                        if b'"health":"true"' in s.recv(4096):
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("etcd did not start")
                time.sleep(0.1)
            yield "127.0.0.1", client, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Http:
    """A keep-alive HTTP/1.1 client of one server, just enough for etcd's JSON gateway."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        data = json.dumps(body).encode()
        self._writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        status = await self._reader.readline()
        headers: dict[str, str] = {}
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            payload = b""
            while (size := int((await self._reader.readline()).strip(), 16)) > 0:
                payload += await self._reader.readexactly(size)
                await self._reader.readline()
            await self._reader.readline()
        else:
            payload = await self._reader.readexactly(int(headers.get("content-length", "0")))
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"etcd {path}: {status.decode().strip()} {payload[:200]!r}")
        result: dict[str, Any] = json.loads(payload)
        return result

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()


async def etcd_lock(clients: int, duration: float) -> Result:
    with etcd_server() as (host, port):
        async with contextlib.AsyncExitStack() as stack:
            op = await etcd_op(host, port, clients, stack)
            progress(f"{ETCD}, {clients} clients")
            return await measure(ETCD, op, clients, duration)


async def etcd_op(
    host: str, port: int, clients: int, stack: contextlib.AsyncExitStack
) -> Callable[[int], Awaitable[None]]:
    """Lock + unlock by client ``i`` on its own lock, each client with its own keep-alive
    connection and its own lease (granted once, ``ETCD_LEASE_TTL``)."""
    conns = [Http(host, port) for _ in range(clients)]
    for c in conns:
        stack.push_async_callback(c.close)
    leases = [(await c.post("/v3/lease/grant", {"TTL": ETCD_LEASE_TTL}))["ID"] for c in conns]
    names = [base64.b64encode(f"bench-lock-{i}".encode()).decode() for i in range(clients)]

    async def op(i: int) -> None:
        got = await conns[i].post("/v3/lock/lock", {"name": names[i], "lease": leases[i]})
        await conns[i].post("/v3/lock/unlock", {"key": got["key"]})

    return op


# -- PostgreSQL and Redis ------------------------------------------------------------------------


async def advisory_lock(dsn: str, clients: int, duration: float) -> Result:
    async with pg_bench.connections(dsn, clients) as conns:
        base = int.from_bytes(os.urandom(3), "big") << 16

        async def op(i: int) -> None:
            cur = await conns[i].execute("SELECT pg_try_advisory_lock(%s)", (base + i,))
            row = await cur.fetchone()
            if row is None or not row[0]:
                raise RuntimeError("uncontended advisory lock refused")
            await conns[i].execute("SELECT pg_advisory_unlock(%s)", (base + i,))

        progress(f"{ADVISORY}, {clients} connections")
        return await measure(ADVISORY, op, clients, duration)


# -- ours -------------------------------------------------------------------------------------


async def ours(
    address: str,
    label: str,
    baseline: str,
    clients: int,
    duration: float,
    *,
    streamed: bool = False,
) -> Result:
    """Acquire+Release by each client on its own resource, each client on its own
    connection: unary calls, or (``streamed``) the same two calls through one lease
    stream per client (P5: against etcd whatever the backend, so ``baseline`` is then
    etcd's)."""
    channels = [grpc.aio.insecure_channel(address, OWN_CONNECTION) for _ in range(clients)]
    stubs = [lease_pb2_grpc.LeaseServiceStub(c) for c in channels]
    streams = [SessionStream(c) for c in channels] if streamed else []
    try:

        async def unary(i: int) -> None:
            lease = await stubs[i].Acquire(
                lease_pb2.AcquireRequest(resource=f"peer-{i}", holder=f"c{i}", ttl_ms=10_000)
            )
            await stubs[i].Release(
                lease_pb2.ReleaseRequest(resource=lease.resource, token=lease.token, holder=f"c{i}")
            )

        async def through_stream(i: int) -> None:
            lease = await streams[i].acquire(f"peer-s{i}", f"c{i}", 10_000)
            await streams[i].release(lease.resource, lease.token, f"c{i}")

        name = streamed_name(label) if streamed else f"ours ({label}): Acquire+Release"
        progress(f"{name}, {clients} clients")
        op = through_stream if streamed else unary
        result = await measure(name, op, clients, duration, baseline=baseline)
        return replace(result, note=NOTES["ours"])
    finally:
        for stream in streams:
            await stream.close()
        for c in channels:
            await c.close()


async def shared(address: str, label: str, tasks: int, duration: float) -> Result:
    """Acquire+Release by ``tasks`` tasks, each on its own resource, all on one lease
    stream (one client, as a service's tasks share its one ``LeaseClient``): calls
    queued together share messages both ways. Against etcd (P5)."""
    async with grpc.aio.insecure_channel(address, OWN_CONNECTION) as channel:
        stream = SessionStream(channel)
        try:

            async def op(i: int) -> None:
                lease = await stream.acquire(f"peer-t{i}", f"t{i}", 10_000)
                await stream.release(lease.resource, lease.token, f"t{i}")

            name = shared_name(label)
            progress(f"{name}, {tasks} tasks")
            result = await measure(name, op, tasks, duration, baseline=ETCD)
            return replace(result, note=NOTES["ours"])
        finally:
            await stream.close()


async def stream_floor(address: str, clients: int, duration: float) -> Result:
    """Two pings per loop through one lease stream per client (each on its own
    connection): the same messages as a streamed Acquire+Release, answered by the
    stream alone. No lease call through a stream per client can beat it."""
    channels = [grpc.aio.insecure_channel(address, OWN_CONNECTION) for _ in range(clients)]
    streams = [SessionStream(c) for c in channels]
    try:

        async def op(i: int) -> None:
            await streams[i].ping()
            await streams[i].ping()

        progress(f"{PINGS}, {clients} clients")
        result = await measure(PINGS, op, clients, duration, baseline=ETCD)
        return replace(result, note="the stream's own floor: no service, no backend")
    finally:
        for stream in streams:
            await stream.close()
        for c in channels:
            await c.close()


def streamed_name(label: str) -> str:
    return f"ours ({label}): Acquire+Release via Session"


def shared_name(label: str) -> str:
    return f"ours ({label}): Acquire+Release via one shared Session"


async def both(
    address: str, label: str, baseline: str, clients: int, duration: float
) -> list[Result]:
    """Our unary row (against ``baseline``), our streamed rows (against etcd): a stream
    per client, and one stream shared by as many tasks."""
    return [
        await ours(address, label, baseline, clients, duration),
        await ours(address, label, ETCD, clients, duration, streamed=True),
        await shared(address, label, clients, duration),
    ]


@asynccontextmanager
async def _skip(what: str, notes: list[str]) -> AsyncIterator[None]:
    """Run a block; a peer that cannot run here is noted, never faked."""
    try:
        yield
    except (OSError, RuntimeError, ConnectionError, psycopg.OperationalError) as exc:
        notes.append(f"{what}: skipped ({type(exc).__name__}: {exc})")
        progress(notes[-1])


async def run(
    clients: Sequence[int],
    duration: float,
    *,
    dsn: str | None = None,
    url: str | None = None,
    notes: list[str] | None = None,
) -> list[Result]:
    """Every peer next to ours, at each client count (see the module doc)."""
    notes = notes if notes is not None else []
    dsn = dsn or pg_bench.default_dsn()
    url = url or redis_bench.default_url()
    results: list[Result] = []
    for n in clients:
        async with _skip("etcd", notes):
            results.append(replace(await etcd_lock(n, duration), note=NOTES[ETCD]))
        with (
            tempfile.TemporaryDirectory(prefix="fencing-peers-") as tmp,
            server("lease_server", "--backend", f"sqlite:{tmp}/leases.db") as lease,
        ):
            results.append(await stream_floor(lease.address, n, duration))
            results += await both(lease.address, "sqlite", ETCD, n, duration)
        async with _skip("postgres", notes), pg_bench.bench_schema(dsn) as schema:
            advisory = await advisory_lock(dsn, n, duration)
            results.append(replace(advisory, note=NOTES[ADVISORY]))
            sep = "&" if "?" in dsn else "?"
            with server("lease_server", "--backend", f"{dsn}{sep}schema={schema}") as lease:
                results += await both(lease.address, "postgres", ADVISORY, n, duration)
        prefix = f"peers{os.getpid()}"
        async with _skip("redis", notes):
            try:
                progress(f"{REDIS_LOCK}, {n} clients")
                lock = await redis_bench.redis_py_lock(url, n, duration, prefix)
                results.append(replace(lock, name=REDIS_LOCK, baseline="", note=NOTES[REDIS_LOCK]))
                sep = "&" if "?" in url else "?"
                with server("lease_server", "--backend", f"{url}{sep}prefix={prefix}") as lease:
                    results += await both(lease.address, "redis", REDIS_LOCK, n, duration)
            finally:
                with contextlib.suppress(Exception):
                    await redis_bench.drop(url, prefix)
    return results
