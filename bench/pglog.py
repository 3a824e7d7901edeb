"""PostgreSQL's lease path next to SQLite's, and the code before against the code now.

Everything is measured in one run, each figure against a baseline from the same run:

* **P7, through gRPC**: Acquire+Release from N clients against a lease server on
  SQLite, on PostgreSQL, and (``before``) on PostgreSQL running an earlier commit of
  this repository (its own schema, its own migrations), plus an empty call and a
  one-op guarded Write on each backend's guard. Every row also says the server's CPU
  per call (``/proc`` of the server processes), i.e. what one call costs the server;
* **CPU per call**: the server's CPU for an Acquire alone and a Release alone (each
  client acquires resources of its own for a while, then releases them all), next to
  the empty call's and a one-op Write's, per backend; on PostgreSQL also PostgreSQL's
  own CPU per call: the backend processes serving that server's connections (found by
  the ``application_name`` the bench gives its URL), from ``/proc``. PostgreSQL's
  shared background processes (WAL writer, checkpointer, autovacuum) are not counted:
  other users of the same server share them;
* **P7b, in process**: the backend object alone (``acquire`` + ``release``) from 8 tasks
  and from 1, SQLite against PostgreSQL (and ``before``, in a subprocess of its own),
  called as the service calls it: through the group commit of lease calls
  (:mod:`lease_server.grouped`) where the code measured has one;
* **two lease servers on one database**: 16 clients split over two processes on one
  schema against 16 on one;
* **P6 latency**: a waiter blocked in ``Acquire(wait_ms)`` while the holder releases:
  from the Release call's start to the waiter's grant, p50/p99, per backend and with
  holder and waiter on two servers of one PostgreSQL schema; and a Watch stream's
  delivery delay: from the Release call's return to its RELEASED event on the stream
  (what a guard in ``watch`` mode follows), on the same server and on another one.

``python -m bench.pglog [--duration S] [--clients 1,16] [--before REF]``; ``REF`` (a
commit, default none) is exported with ``git archive`` to a temporary directory and
its servers run from there, on a schema they migrate themselves. The setups are
measured one after the other, so the load may drift between them: to compare the code
before with this one, :mod:`bench.pglog_ab` runs both at once, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import postgres as pg_bench
from bench.harness import Op, Result, cpu_seconds, fresh_value, measure, progress, server, table
from fencing.v1 import guard_pb2, guard_pb2_grpc, lease_pb2, lease_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "empty gRPC call (floor)"
WAITS = 150  # release -> waiter grant samples per backend
WATCHES = 150  # release -> watch event samples


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """``ref`` of this repository, exported to a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="fencing-before-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


@contextlib.contextmanager
def code_from(tree: Path | None) -> Iterator[None]:
    """Servers started inside run ``tree``'s code (PYTHONPATH), or this one's."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree or ROOT)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@dataclass
class Backend:
    label: str
    lease_url: str
    guard_url: str
    tree: Path | None = None
    #: The database the URLs name (to find their backend processes), "" if not PostgreSQL.
    dsn: str = ""
    #: The ``application_name`` of the lease server's and the guard's connections.
    lease_app: str = ""
    guard_app: str = ""


@dataclass
class Cpu:
    """One kind of call's CPU per call (microseconds): the server's and PostgreSQL's."""

    backend: str
    what: str
    clients: int
    server_us: float
    postgres_us: float


class PgCpu:
    """CPU seconds of the PostgreSQL backend processes whose ``application_name`` is
    ``name`` (one lease server's or guard's pooled and listening connections), from
    ``/proc``: PostgreSQL's own cost of what that server asked of it. Nothing (0) when
    the server is not on PostgreSQL."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name

    async def _pids(self) -> list[int]:
        if not self.name:
            return []
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.name,)
            )
            return [int(row[0]) for row in await cur.fetchall()]

    async def snapshot(self) -> dict[int, float]:
        """Each backend's CPU seconds so far."""
        return {pid: cpu_seconds(pid) for pid in await self._pids()}

    async def since(self, before: dict[int, float]) -> float:
        """CPU seconds used since ``before`` (a backend started since counts whole)."""
        now = await self.snapshot()
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def _cpu_note(server_s: float, pg_s: float, calls: float, pg: bool) -> str:
    note = f"server {server_s / calls * 1e6:,.0f} us CPU/call" if calls else ""
    if pg and calls:
        note += f", postgres {pg_s / calls * 1e6:,.0f} us"
    return note


async def _with_cpu(
    pids: Sequence[int], pg: PgCpu, run: object, is_pg: bool, per_call: float = 1.0
) -> tuple[Result, float, float]:
    """Run the measurement ``run`` and note the CPU per call it cost the server process
    (``pids``) and PostgreSQL (``pg``): the result, and both in microseconds."""
    before, pg_before = sum(cpu_seconds(p) for p in pids), await pg.snapshot()
    assert asyncio.iscoroutine(run)
    result: Result = await run
    used = sum(cpu_seconds(p) for p in pids) - before
    pg_used = await pg.since(pg_before)
    calls = result.ops / result.per_call * per_call
    result.note = _cpu_note(used, pg_used, calls, is_pg)
    return result, used / calls * 1e6 if calls else 0.0, pg_used / calls * 1e6 if calls else 0.0


def _empty_op(health: list[health_pb2_grpc.HealthStub]) -> Op:
    async def empty(i: int) -> None:
        await health[i].Check(health_pb2.HealthCheckRequest(service=""))

    return empty


def _acquire_release_op(stubs: list[lease_pb2_grpc.LeaseServiceAsyncStub], prefix: str) -> Op:
    async def acquire_release(i: int) -> None:
        got = await stubs[i].Acquire(
            lease_pb2.AcquireRequest(resource=f"{prefix}-{i}", holder=f"c{i}", ttl_ms=10_000)
        )
        await stubs[i].Release(
            lease_pb2.ReleaseRequest(resource=got.resource, token=got.token, holder=f"c{i}")
        )

    return acquire_release


#: Resources each client acquires, then releases, to measure the two calls apart.
SPLIT = 150


async def _acquire_then_release(
    stubs: Sequence[lease_pb2_grpc.LeaseServiceAsyncStub], label: str
) -> tuple[Op, Op]:
    """Two ops: each client's Acquire of its next resource (``SPLIT`` of them, all held),
    and its Release of the next one it holds: run the first ``SPLIT`` times per client,
    then the second as many times, to see what each call costs alone."""
    held: list[list[tuple[str, int]]] = [[] for _ in stubs]
    taken = [0] * len(stubs)

    async def acquire(i: int) -> None:
        resource = f"split-{label}-{i}-{taken[i] % SPLIT}"
        taken[i] += 1
        got = await stubs[i].Acquire(
            lease_pb2.AcquireRequest(resource=resource, holder=f"c{i}", ttl_ms=120_000)
        )
        held[i].append((got.resource, got.token))

    async def release(i: int) -> None:
        resource, token = held[i].pop()
        await stubs[i].Release(
            lease_pb2.ReleaseRequest(resource=resource, token=token, holder=f"c{i}")
        )

    return acquire, release


async def _times(op: Op, clients: int, count: int, name: str) -> Result:
    """``op(i)`` exactly ``count`` times from each of ``clients`` tasks, timed."""

    async def loop(i: int) -> None:
        for _ in range(count):
            await op(i)

    started = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    return Result(name, clients, clients * count, time.perf_counter() - started)


def _write_op(guards: list[guard_pb2_grpc.GuardServiceAsyncStub]) -> Op:
    async def write(i: int) -> None:
        await guards[i].Write(
            guard_pb2.WriteRequest(
                resource=f"p7-{i}",
                token=1,
                ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=fresh_value()))],
            )
        )

    return write


async def _grpc_rows(
    b: Backend, clients: Sequence[int], duration: float
) -> tuple[list[Result], list[Cpu]]:
    rows: list[Result] = []
    cpus: list[Cpu] = []
    is_pg = bool(b.dsn)
    lease_pg, guard_pg = PgCpu(b.dsn, b.lease_app), PgCpu(b.dsn, b.guard_app)
    with (
        code_from(b.tree),
        server("lease_server", "--backend", b.lease_url, cwd=b.tree) as lease,
        server("guard", "--store", b.guard_url, cwd=b.tree) as guard,
    ):
        for n in clients:
            chans = [grpc.aio.insecure_channel(lease.address) for _ in range(n)]
            gchans = [grpc.aio.insecure_channel(guard.address) for _ in range(n)]
            health = [health_pb2_grpc.HealthStub(c) for c in chans]
            stubs = [lease_pb2_grpc.LeaseServiceStub(c) for c in chans]
            guards = [guard_pb2_grpc.GuardServiceStub(c) for c in gchans]

            empty = _empty_op(health)
            acquire_release = _acquire_release_op(stubs, "p7")
            write = _write_op(guards)

            def cpu(what: str, server_us: float, pg_us: float, n: int = n) -> None:
                cpus.append(Cpu(b.label, what, n, server_us, pg_us))

            try:
                progress(f"{b.label}: empty call, {n} clients")
                r, us, pg_us = await _with_cpu(
                    lease.pids,
                    lease_pg,
                    measure(f"{b.label}: {FLOOR}", empty, n, duration),
                    is_pg,
                )
                rows.append(r)
                cpu("empty call", us, pg_us)
                progress(f"{b.label}: Acquire+Release, {n} clients")
                r = await measure(
                    f"{b.label}: Acquire+Release",
                    acquire_release,
                    n,
                    duration,
                    baseline="sqlite: Acquire+Release",
                )
                rows.append(r)
                # Its CPU per call: a second short run (the first one's ratio stays clean).
                got, _, _ = await _with_cpu(
                    lease.pids,
                    lease_pg,
                    measure("cpu", acquire_release, n, min(duration, 2.0), per_call=2),
                    is_pg,
                    per_call=2,
                )
                r.note = got.note.replace("call", "call (Acquire or Release)", 1)
                progress(f"{b.label}: Acquire alone, then Release alone, {n} clients")
                acquire, release = await _acquire_then_release(stubs, f"{n}")
                for op in (acquire, release):  # every resource's row exists from here on
                    await _times(op, n, SPLIT, "warm-up")
                for what, op in (("Acquire", acquire), ("Release", release)):
                    _, us, pg_us = await _with_cpu(
                        lease.pids, lease_pg, _times(op, n, SPLIT, what), is_pg
                    )
                    cpu(what, us, pg_us)
                progress(f"{b.label}: Write, {n} clients")
                r, us, pg_us = await _with_cpu(
                    guard.pids,
                    guard_pg,
                    measure(
                        f"{b.label}: Write (1 op)",
                        write,
                        n,
                        duration,
                        baseline="sqlite: Write (1 op)",
                    ),
                    is_pg,
                )
                rows.append(r)
                cpu("Write (1 op)", us, pg_us)
            finally:
                for c in chans + gchans:
                    await c.close()
    return rows, cpus


def cpu_table(cpus: Sequence[Cpu]) -> str:
    """Server CPU per call (and PostgreSQL's, on PostgreSQL) by backend and kind of call,
    each against the empty call's server CPU on the same server and client count."""
    whats = ("empty call", "Acquire", "Release", "Write (1 op)")
    lines = [
        "CPU per call, us: the server's (x the empty call's on that server), + PostgreSQL's",
        f"{'backend':<18} {'clients':>7}  " + "  ".join(f"{w:>22}" for w in whats),
    ]
    keys = sorted({(c.backend, c.clients) for c in cpus}, key=lambda k: (k[1], k[0]))
    for backend, n in keys:
        got = {c.what: c for c in cpus if c.backend == backend and c.clients == n}
        floor = got["empty call"].server_us if "empty call" in got else 0.0
        cells = []
        for w in whats:
            c = got.get(w)
            if c is None:
                cells.append(f"{'-':>22}")
                continue
            text = f"{c.server_us:,.0f}"
            if floor and w != "empty call":
                text += f" ({c.server_us / floor:.1f}x)"
            if backend.startswith("postgres") and w != "empty call":
                text += f" +{c.postgres_us:,.0f}"
            cells.append(f"{text:>22}")
        lines.append(f"{backend:<18} {n:>7}  " + "  ".join(cells))
    return "\n".join(lines)


async def _two_servers(b: Backend, n: int, duration: float) -> tuple[list[Result], list[str]]:
    """n clients on one server, then split over two on the same schema; with each
    setup's CPU per call (both servers', and PostgreSQL's for both)."""
    rows: list[Result] = []
    notes: list[str] = []
    pg = PgCpu(b.dsn, b.lease_app)
    with (
        code_from(b.tree),
        server("lease_server", "--backend", b.lease_url, cwd=b.tree) as one,
        server("lease_server", "--backend", b.lease_url, cwd=b.tree) as two,
    ):
        for label, addrs in (
            ("1 server", [one.address]),
            ("2 servers", [one.address, two.address]),
        ):
            chans = [grpc.aio.insecure_channel(addrs[i % len(addrs)]) for i in range(n)]
            stubs = [lease_pb2_grpc.LeaseServiceStub(c) for c in chans]

            acquire_release = _acquire_release_op(stubs, "two")

            progress(f"{b.label}: Acquire+Release on {label}, {n} clients")
            try:
                r, us, pg_us = await _with_cpu(
                    [*one.pids, *two.pids],
                    pg,
                    measure(
                        f"{b.label}: Acquire+Release, {label}",
                        acquire_release,
                        n,
                        duration,
                        baseline=f"{b.label}: Acquire+Release, 1 server",
                    ),
                    True,
                    per_call=2,
                )
                rows.append(r)
                notes.append(
                    f"{b.label}, {label}, {n} clients: {r.rate * 2:,.0f} calls/s; per call"
                    f" {us:,.0f} us CPU of the lease servers, {pg_us:,.0f} us of PostgreSQL"
                    f" ({(us + pg_us) * r.rate * 2 / 1e6:.2f} cores busy with it)"
                )
            finally:
                for c in chans:
                    await c.close()
    return rows, notes


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def _latencies(b: Backend, two: bool) -> list[str]:
    """P6: release -> next waiter's grant, and release -> watch event (ms, p50/p99)."""
    lines: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(code_from(b.tree))
        first = stack.enter_context(server("lease_server", "--backend", b.lease_url, cwd=b.tree))
        second = (
            stack.enter_context(server("lease_server", "--backend", b.lease_url, cwd=b.tree))
            if two
            else first
        )
        where = "two servers" if two else "one server"
        holder_ch = grpc.aio.insecure_channel(first.address)
        waiter_ch = grpc.aio.insecure_channel(second.address)
        holder = lease_pb2_grpc.LeaseServiceStub(holder_ch)
        waiter = lease_pb2_grpc.LeaseServiceStub(waiter_ch)
        try:
            grants: list[float] = []
            for k in range(WAITS):
                r = f"p6-{k % 8}"
                got = await holder.Acquire(
                    lease_pb2.AcquireRequest(resource=r, holder="h", ttl_ms=10_000)
                )
                waiting = asyncio.ensure_future(
                    waiter.Acquire(
                        lease_pb2.AcquireRequest(
                            resource=r, holder="w", ttl_ms=10_000, wait_ms=5000
                        )
                    )
                )
                await asyncio.sleep(0.01)  # the waiter is queued on the server
                start = time.perf_counter()
                await holder.Release(
                    lease_pb2.ReleaseRequest(resource=r, token=got.token, holder="h")
                )
                won = await waiting
                grants.append(time.perf_counter() - start)
                await waiter.Release(
                    lease_pb2.ReleaseRequest(resource=r, token=won.token, holder="w")
                )
            lines.append(
                f"{b.label}, {where}: Release -> waiter's grant p50 {_pct(grants, 0.5):.1f} ms,"
                f" p99 {_pct(grants, 0.99):.1f} ms ({len(grants)} samples)"
            )
            stream = waiter.Watch(lease_pb2.WatchRequest(prefix="p6w-"))
            await stream.initial_metadata()
            delays: list[float] = []
            for k in range(WATCHES):
                got = await holder.Acquire(
                    lease_pb2.AcquireRequest(resource=f"p6w-{k % 8}", holder="h", ttl_ms=10_000)
                )
                await stream.read()  # its ACQUIRED
                await holder.Release(
                    lease_pb2.ReleaseRequest(resource=got.resource, token=got.token, holder="h")
                )
                done = time.perf_counter()
                event = await stream.read()
                assert not isinstance(event, type(grpc.aio.EOF))
                delays.append(max(0.0, time.perf_counter() - done))
            stream.cancel()
            lines.append(
                f"{b.label}, {where}: Release returned -> Watch event p50"
                f" {_pct(delays, 0.5):.1f} ms, p99 {_pct(delays, 0.99):.1f} ms"
                f" ({len(delays)} samples)"
            )
        finally:
            await holder_ch.close()
            await waiter_ch.close()
    return lines


_INPROC = r"""
import asyncio, json, sys, tempfile
from pathlib import Path
from bench.harness import measure
async def main(kind, url, n, duration):
    if kind == "sqlite":
        from lease_server.backends.sqlite import SQLiteBackend
        tmp = tempfile.mkdtemp()
        backend = SQLiteBackend(Path(tmp) / "leases.db")
    else:
        from lease_server.backends.postgres import PostgresBackend
        backend = PostgresBackend(url)
    await backend.open()
    backend.on_events(lambda head: None)  # as the server's watch feed does
    try:  # as the service calls it: through its group commit, where the code has one
        from lease_server.grouped import grouped
    except ImportError:
        calls = backend
    else:
        calls = grouped(backend)
    async def op(i):
        g = await calls.acquire(f"p7b-{i}", f"t{i}", 10000, "")
        await calls.release(g.resource, g.token, g.holder)
    try:
        r = await measure("x", op, n, duration)
    finally:
        await backend.close()
    print(json.dumps([r.ops, r.seconds, r.percentile(0.5), r.percentile(0.99)]))
kind, url, n, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
asyncio.run(main(kind, url, n, duration))
"""


def _inproc(label: str, kind: str, url: str, n: int, duration: float, tree: Path | None) -> Result:
    """The backend alone, in a process of its own (so ``before`` runs its own code)."""
    progress(f"{label}: backend acquire+release in process, {n} tasks")
    env = dict(os.environ, PYTHONPATH=f"{tree or ROOT}{os.pathsep}{ROOT}")
    out = subprocess.run(
        [sys.executable, "-c", _INPROC, kind, url, str(n), str(duration)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tree or ROOT),
    ).stdout
    ops, seconds, p50, p99 = json.loads(out.strip().splitlines()[-1])
    # Latencies as two points, enough for the table's p50 and p99 columns.
    lat = [p50] * 98 + [p99] * 2
    return Result(f"{label}: in process", n, int(ops), float(seconds), lat)


async def run(
    clients: Sequence[int], duration: float, before: str = "", dsn: str | None = None
) -> tuple[list[Result], list[str]]:
    """Every measurement of the module doc; rows and the latency lines."""
    dsn = dsn or pg_bench.default_dsn()
    rows: list[Result] = []
    lines: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fencing-pglog-")))
        tree = stack.enter_context(checkout(before)) if before else None
        schemas = [await stack.enter_async_context(_schema_cm(dsn))]
        if before:
            # Not migrated here: its own servers migrate it with its own migrations, or the
            # code before would run on this code's SQL.
            schemas.append(await stack.enter_async_context(_empty_schema(dsn)))
        sqlite = Backend("sqlite", f"sqlite:{tmp / 'leases.db'}", f"sqlite:{tmp / 'guard.db'}")
        backends = [sqlite, _pg_backend("postgres", dsn, schemas[0])]
        if tree is not None:
            backends.append(_pg_backend("postgres before", dsn, schemas[1], tree))
        cpus: list[Cpu] = []
        for b in backends:
            got, cpu = await _grpc_rows(b, clients, duration)
            rows += got
            cpus += cpu
        lines += cpu_table(cpus).splitlines()
        for b in backends[1:]:
            got, notes = await _two_servers(b, max(clients), duration)
            rows += got
            lines += notes
        for n in (8, 1):
            for b in backends:
                kind = "sqlite" if b is sqlite else "postgres"
                url = f"{tmp}" if b is sqlite else b.lease_url
                r = _inproc(b.label, kind, url, n, duration, b.tree)
                r.baseline = "sqlite: in process" if b is not sqlite else ""
                rows.append(r)
        for b in backends:
            lines += await _latencies(b, two=False)
        for b in backends[1:]:
            lines += await _latencies(b, two=True)
        # Redis, for the P6 line per backend, if one answers.
        with contextlib.suppress(OSError, RuntimeError, grpc.aio.AioRpcError):
            url = os.environ.get("FENCING_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
            prefix = f"bench-pglog-{os.getpid()}"  # a private prefix on a shared Redis
            redis = Backend("redis", f"{url}{'&' if '?' in url else '?'}prefix={prefix}", "")
            lines += await _latencies(redis, two=False)
    return rows, lines


@contextlib.asynccontextmanager
async def _schema_cm(dsn: str):  # type: ignore[no-untyped-def]
    async with pg_bench.bench_schema(dsn) as schema:
        yield schema


@contextlib.asynccontextmanager
async def _empty_schema(dsn: str):  # type: ignore[no-untyped-def]
    """A schema name nobody uses, dropped on exit; whoever opens it first migrates it."""
    schema = f"bench_{secrets.token_hex(4)}"
    try:
        yield schema
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(schema)
                )
            )


def _url(dsn: str, schema: str, app: str = "") -> str:
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    return f"{url}&application_name={app}" if app else url


def _pg_backend(label: str, dsn: str, schema: str, tree: Path | None = None) -> Backend:
    """A PostgreSQL backend on ``schema``, its servers' connections named apart (so their
    PostgreSQL processes can be found: :class:`PgCpu`)."""
    lease_app, guard_app = f"{schema}-lease", f"{schema}-guard"
    return Backend(
        label,
        _url(dsn, schema, lease_app),
        _url(dsn, schema, guard_app),
        tree,
        dsn=dsn,
        lease_app=lease_app,
        guard_app=guard_app,
    )


def ratios(rows: Sequence[Result]) -> list[str]:
    """The brief's figures: P7, P7b and two servers, as ratios of this run's rows."""

    def rate(name: str, n: int) -> float:
        return next((r.rate for r in rows if r.name == name and r.concurrency == n), 0.0)

    out = []
    n = max(r.concurrency for r in rows if r.name.endswith("Acquire+Release"))
    for label in ("postgres", "postgres before"):
        pg, lite = rate(f"{label}: Acquire+Release", n), rate("sqlite: Acquire+Release", n)
        if pg and lite:
            out.append(f"P7 {label}/sqlite, gRPC Acquire+Release at {n} clients: {pg / lite:.2f}x")
        pg8, lite8, pg1 = (
            rate(f"{label}: in process", 8),
            rate("sqlite: in process", 8),
            rate(f"{label}: in process", 1),
        )
        if pg8 and lite8 and pg1:
            out.append(
                f"P7b {label}: 8 tasks/sqlite 8 tasks {pg8 / lite8:.2f}x;"
                f" 8 tasks/1 task {pg8 / pg1:.2f}x"
            )
        one = rate(f"{label}: Acquire+Release, 1 server", n)
        two = rate(f"{label}: Acquire+Release, 2 servers", n)
        if one and two:
            out.append(f"{label}: two servers on one schema / one, {n} clients: {two / one:.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pglog", description=__doc__)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument("--before", default="", help="a commit to measure as 'postgres before'")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c]
    started = time.perf_counter()
    rows, lines = asyncio.run(run(clients, args.duration, args.before))
    print(table(rows, "PostgreSQL lease path against SQLite (and the code before)"))
    for line in [*ratios(rows), *lines]:
        print(line)
    print(
        f"took {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f},"
        f" {os.getloadavg()[1]:.2f}, {os.getloadavg()[2]:.2f};"
        f" median rate {statistics.median(r.rate for r in rows):,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
