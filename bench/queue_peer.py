"""The queue next to a real peer: procrastinate 3 on the same PostgreSQL, worker against worker.

Both sides are real processes: our lease server hosting the queue on PostgreSQL with
our :class:`~fencing.worker.AsyncWorker` in a process of its own, and a procrastinate
worker process (``App.run_worker_async``, LISTEN/NOTIFY on), each running a trivial
async job. Measured, in alternating rounds (ours, then procrastinate, twice; the better
round of each counts, as the machine is shared):

* **enqueue x1** and **x100**: one client in this process enqueueing for ``duration``
  (``AsyncQueueClient.enqueue``/``enqueue_many`` against ``Task.defer_async``/
  ``batch_defer_async``);
* **enqueue x1 in the caller's transaction**: ours only, ``fencing.pg.enqueue_async``
  in a transaction of the application's own connection (one job per transaction:
  BEGIN, the statement, COMMIT), against procrastinate's ``defer_async`` (its own
  connection: the way it defers, one autocommit statement);
* **enqueue x1, one statement on the caller's connection**: ours only, the same call on
  an autocommit connection (the statement is its transaction), the like-for-like of
  procrastinate's ``defer_async``;
* **drain** at concurrency 1 and 8: a prefilled queue drained by one worker process;
  the rate is taken from the database's own finish times (our ``jobs.finished_at``,
  procrastinate's ``succeeded`` events), first to last, so process start-up is not
  counted;
* **drain beside a paused queue**: ours only, the drain at concurrency 1 again while
  another queue holds ``PAUSED_NEIGHBOUR_JOBS`` ready jobs and is paused, against the
  plain drain of the same round (what a pause costs the claims of other queues);
* **enqueue-to-start latency**: jobs enqueued one at a time (10 ms apart) into an idle,
  running worker; each handler records ``now - enqueued_at`` (both stamps from this
  host's clock); p50 and p99.

procrastinate is optional (``pip install procrastinate==3.*``): without it this part is
skipped with a note. Its schema goes into a throwaway database, dropped afterwards.

Worker processes: ``python -m bench.queue_peer ours ADDRESS QUEUE CONCURRENCY [LATENCY_FILE]``
and ``python -m bench.queue_peer procrastinate DSN QUEUE CONCURRENCY [LATENCY_FILE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from bench.harness import Result, measure, progress, server_process
from fencing import pg as fpg
from fencing.client._queue import new_job
from fencing.client.async_queue import AsyncQueueClient

PEER = "procrastinate"
OURS = "ours (postgres, AsyncWorker)"
ROUNDS = 2
#: Jobs drained per measurement, per second of ``duration``, by concurrency.
DRAIN_JOBS_PER_S = {1: 400, 8: 800}
LATENCY_JOBS = 100
#: Ready jobs in the paused queue beside the drained one.
PAUSED_NEIGHBOUR_JOBS = 10_000
LATENCY_GAP_S = 0.01


def available() -> bool:
    return importlib.util.find_spec("procrastinate") is not None


def peer_version() -> str:
    import procrastinate

    return str(getattr(procrastinate, "__version__", "3"))


# -- the worker processes ---------------------------------------------------------------------


class _Recorder:
    """Appends each job's enqueue-to-start latency (seconds) to a file, if one is named."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def record(self, enqueued_at: float) -> None:
        if self._file is not None and enqueued_at > 0:
            self._file.write(f"{time.time() - enqueued_at:.6f}\n")


def _procrastinate_app(dsn: str, recorder: _Recorder | None = None) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    # procrastinate (an optional extra) may be installed or not: untyped either way.
    @app.task(name="bench_noop")  # type: ignore[untyped-decorator,unused-ignore]
    async def noop(t: float = 0.0) -> None:
        if recorder is not None:
            recorder.record(t)

    return app, noop


async def _run_procrastinate(dsn: str, queue: str, concurrency: int, latency: str) -> None:
    app, _ = _procrastinate_app(dsn, _Recorder(latency))
    async with app.open_async():
        print("ready", flush=True)
        await app.run_worker_async(
            queues=[queue], concurrency=concurrency, wait=True, install_signal_handlers=True
        )


async def _run_ours(address: str, queue: str, concurrency: int, latency: str) -> None:
    from fencing.client._queue import Job
    from fencing.worker import AsyncWorker

    recorder = _Recorder(latency)

    async def noop(job: Job) -> None:
        if latency:
            recorder.record(float(job.payload or b"0"))

    worker = AsyncWorker(address, queue, noop, concurrency=concurrency, poll=1.0, grace=5.0)
    print("ready", flush=True)
    await worker.run()


def worker_main(argv: list[str]) -> int:
    kind, target, queue, concurrency, *rest = argv
    latency = rest[0] if rest else ""
    run = _run_ours if kind == "ours" else _run_procrastinate
    asyncio.run(run(target, queue, int(concurrency), latency))
    return 0


@contextlib.contextmanager
def worker_process(
    kind: str, target: str, queue: str, concurrency: int, latency: str = ""
) -> Iterator[None]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.queue_peer", kind, target, queue, str(concurrency), latency],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind} worker did not start")
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


# -- the two sides ----------------------------------------------------------------------------


@dataclass
class Side:
    """What the measurements need of one queue: enqueue calls, prefill, a finish count."""

    name: str
    enqueue: Callable[[str, int, float], Awaitable[None]]
    finished: Callable[[str], Awaitable[tuple[int, float]]]
    worker: Callable[[str, int, str], contextlib.AbstractContextManager[None]]
    #: One job enqueued in a transaction of the caller's own connection (ours only).
    enqueue_in_tx: Callable[[str], Awaitable[None]] | None = None
    #: One job enqueued by one statement on an autocommit connection (ours only).
    enqueue_autocommit: Callable[[str], Awaitable[None]] | None = None
    #: Pause a queue (ours only).
    pause: Callable[[str], Awaitable[bool]] | None = None


def _ms_span(row: tuple[Any, ...] | None) -> tuple[int, float]:
    if row is None or not row[0]:
        return 0, 0.0
    return int(row[0]), float(row[1] or 0.0)


@contextlib.asynccontextmanager
async def _our_side(address: str, dsn: str, schema: str) -> AsyncIterator[Side]:
    client = AsyncQueueClient(address, worker="bench")
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    app_conn = await psycopg.AsyncConnection.connect(dsn)  # the application's own
    auto_conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    query = sql.SQL(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(finished_at))"
        " FROM {}.jobs WHERE queue = %s AND state = 'succeeded'"
    ).format(sql.Identifier(schema))

    async def enqueue(queue: str, count: int, stamp: float) -> None:
        payload = f"{stamp:.6f}".encode() if stamp else b""
        if count == 1:
            await client.enqueue(queue, payload)
        else:
            await client.enqueue_many(queue, [new_job(payload) for _ in range(count)])

    async def finished(queue: str) -> tuple[int, float]:
        cur = await conn.execute(query, (queue,))
        return _ms_span(await cur.fetchone())

    def worker(
        queue: str, concurrency: int, latency: str
    ) -> contextlib.AbstractContextManager[None]:
        return worker_process("ours", address, queue, concurrency, latency)

    async def enqueue_in_tx(queue: str) -> None:
        async with app_conn.transaction():
            await fpg.enqueue_async(app_conn, queue, b"", schema=schema)

    async def enqueue_autocommit(queue: str) -> None:
        await fpg.enqueue_async(auto_conn, queue, b"", schema=schema)

    try:
        yield Side(OURS, enqueue, finished, worker, enqueue_in_tx, enqueue_autocommit, client.pause)
    finally:
        await client.aclose()
        await conn.close()
        await app_conn.close()
        await auto_conn.close()


@contextlib.asynccontextmanager
async def _peer_side(dsn: str) -> AsyncIterator[Side]:
    app, noop = _procrastinate_app(dsn)
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    query = (
        "SELECT count(*), extract(epoch FROM max(e.at) - min(e.at))"
        " FROM procrastinate_events AS e JOIN procrastinate_jobs AS j ON j.id = e.job_id"
        " WHERE j.queue_name = %s AND e.type = 'succeeded'"
    )
    async with app.open_async():
        await app.schema_manager.apply_schema_async()

        async def enqueue(queue: str, count: int, stamp: float) -> None:
            deferrer = noop.configure(queue=queue)
            if count == 1:
                await deferrer.defer_async(t=stamp)
            else:
                await deferrer.batch_defer_async(*({"t": stamp} for _ in range(count)))

        async def finished(queue: str) -> tuple[int, float]:
            cur = await conn.execute(query, (queue,))
            return _ms_span(await cur.fetchone())

        def worker(
            queue: str, concurrency: int, latency: str
        ) -> contextlib.AbstractContextManager[None]:
            return worker_process("procrastinate", dsn, queue, concurrency, latency)

        try:
            yield Side(f"{PEER} {peer_version()}", enqueue, finished, worker)
        finally:
            await conn.close()


# -- the measurements -------------------------------------------------------------------------


async def _enqueue(side: Side, batch: int, duration: float, baseline: str) -> Result:
    queue = f"enq-{secrets.token_hex(3)}"

    async def op(i: int) -> None:
        await side.enqueue(queue, batch, 0.0)

    return await measure(
        f"{side.name}: enqueue x{batch}", op, 1, duration, per_call=batch, baseline=baseline
    )


async def _enqueue_on_own_connection(
    side: Side, autocommit: bool, duration: float, baseline: str
) -> Result:
    """One job per call through ``fencing.pg`` on the application's connection: in a
    transaction of its own, or as one autocommit statement."""
    enqueue = side.enqueue_autocommit if autocommit else side.enqueue_in_tx
    assert enqueue is not None
    queue = f"enq-{'ac' if autocommit else 'tx'}-{secrets.token_hex(3)}"

    async def op(i: int) -> None:
        await enqueue(queue)

    how = (
        "one statement on the caller's connection (autocommit)"
        if autocommit
        else "in the caller's transaction (fencing.pg.enqueue)"
    )
    return await measure(f"{side.name}: enqueue x1 {how}", op, 1, duration, baseline=baseline)


async def _paused_neighbour(side: Side) -> str:
    """A queue of :data:`PAUSED_NEIGHBOUR_JOBS` ready jobs, paused: its name."""
    assert side.pause is not None
    queue = f"paused-{secrets.token_hex(3)}"
    for start in range(0, PAUSED_NEIGHBOUR_JOBS, 500):
        await side.enqueue(queue, min(500, PAUSED_NEIGHBOUR_JOBS - start), 0.0)
    await side.pause(queue)
    return queue


async def _drain(
    side: Side, concurrency: int, total: int, baseline: str, title: str = "drain"
) -> Result:
    queue = f"drain-{secrets.token_hex(3)}"
    for start in range(0, total, 500):
        await side.enqueue(queue, min(500, total - start), 0.0)
    deadline = time.monotonic() + 120
    with side.worker(queue, concurrency, ""):
        while True:
            done, span = await side.finished(queue)
            if done >= total:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{side.name}: drained {done} of {total} jobs in 120 s")
            await asyncio.sleep(0.1)
    return Result(
        f"{side.name}: {title}", concurrency, total - 1, span, unit="jobs", baseline=baseline
    )


async def _latency(side: Side, baseline: str) -> Result:
    queue = f"lat-{secrets.token_hex(3)}"
    with tempfile.NamedTemporaryFile("r", suffix=".lat") as f:
        with side.worker(queue, 1, f.name):
            await asyncio.sleep(1.0)  # the worker connects and starts waiting for work
            started = time.perf_counter()
            for _ in range(LATENCY_JOBS):
                await side.enqueue(queue, 1, time.time())
                await asyncio.sleep(LATENCY_GAP_S)
            deadline = time.monotonic() + 30
            while (await side.finished(queue))[0] < LATENCY_JOBS:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{side.name}: latency jobs not done in 30 s")
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - started
        latencies = [float(line) for line in f.read().split()]
    return Result(
        f"{side.name}: enqueue-to-start latency",
        1,
        len(latencies),
        elapsed,
        latencies,
        unit="jobs",
        baseline=baseline,
    )


def _better(a: Result | None, b: Result, latency: bool = False) -> Result:
    if a is None:
        return b
    if latency:
        return b if b.percentile(0.5) < a.percentile(0.5) else a
    return b if b.rate > a.rate else a


@contextlib.asynccontextmanager
async def _peer_database(dsn: str) -> AsyncIterator[str]:
    name = f"bench_procrastinate_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(dsn)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def run(dsn: str, duration: float, notes: list[str]) -> list[Result]:
    """Ours next to procrastinate (see the module docstring); [] with a note without it."""
    if not available():
        notes.append("procrastinate is not installed (pip install 'procrastinate==3.*'): skipped")
        return []
    schema = f"bench_peer_{secrets.token_hex(4)}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&pool_max=16"
    best: dict[tuple[str, str, int], Result] = {}
    neighbour: str | None = None

    def keep(side: str, what: str, n: int, r: Result, latency: bool = False) -> None:
        best[(side, what, n)] = _better(best.get((side, what, n)), r, latency)

    try:
        async with _peer_database(dsn) as peer_dsn:
            with server_process("lease_server", "--backend", url, "--queue", url) as address:
                async with (
                    _our_side(address, dsn, schema) as ours,
                    _peer_side(peer_dsn) as peer,
                ):
                    for round_no in range(1, ROUNDS + 1):
                        for side in (ours, peer):
                            base = "" if side is peer else f"{peer.name}: "
                            tag = f"round {round_no}/{ROUNDS}, {side.name}"
                            for batch in (1, 100):
                                progress(f"{tag}: enqueue x{batch}")
                                r = await _enqueue(
                                    side, batch, duration, base and f"{base}enqueue x{batch}"
                                )
                                keep(side.name, "enqueue", batch, r)
                            if side.enqueue_in_tx is not None:
                                progress(f"{tag}: enqueue x1 in the caller's transaction")
                                r = await _enqueue_on_own_connection(
                                    side, False, duration, f"{base}enqueue x1"
                                )
                                keep(side.name, "enqueue-tx", 1, r)
                            if side.enqueue_autocommit is not None:
                                progress(f"{tag}: enqueue x1, one autocommit statement")
                                r = await _enqueue_on_own_connection(
                                    side, True, duration, f"{base}enqueue x1"
                                )
                                keep(side.name, "enqueue-ac", 1, r)
                            for c in (1, 8):
                                total = round(DRAIN_JOBS_PER_S[c] * duration)
                                progress(f"{tag}: drain {total} jobs, concurrency {c}")
                                r = await _drain(side, c, total, base and f"{base}drain")
                                keep(side.name, "drain", c, r)
                            if side.pause is not None:
                                if neighbour is None:
                                    neighbour = await _paused_neighbour(side)
                                total = round(DRAIN_JOBS_PER_S[1] * duration)
                                progress(f"{tag}: drain {total} jobs beside a paused queue")
                                r = await _drain(
                                    side,
                                    1,
                                    total,
                                    f"{OURS}: drain",
                                    f"drain beside a paused queue of {PAUSED_NEIGHBOUR_JOBS:,}",
                                )
                                keep(side.name, "drain-paused", 1, r)
                            progress(f"{tag}: enqueue-to-start latency")
                            r = await _latency(side, base and f"{base}enqueue-to-start latency")
                            keep(side.name, "latency", 1, r, latency=True)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
    order = [
        ("enqueue", 1),
        ("enqueue-tx", 1),
        ("enqueue-ac", 1),
        ("enqueue", 100),
        ("drain", 1),
        ("drain", 8),
        ("drain-paused", 1),
        ("latency", 1),
    ]
    results: list[Result] = []
    for what, n in order:
        for side_name in (f"{PEER} {peer_version()}", OURS):
            row = best.get((side_name, what, n))
            if row is None:
                continue
            peer_row = best.get((f"{PEER} {peer_version()}", what, n))
            if what == "latency" and row.baseline and peer_row is not None:
                # Its rate is the enqueue pace: compare p50s, not rates.
                ratio = row.percentile(0.5) / max(peer_row.percentile(0.5), 1e-9)
                row.note = f"p50 {ratio:.2f}x {PEER}'s (lower is better)"
                row.baseline = ""
            results.append(row)
    return results


def main(argv: list[str]) -> int:
    """``ours ...``/``procrastinate ...``: a worker process; else run this part alone."""
    if argv and argv[0] in ("ours", "procrastinate"):
        return worker_main(argv)
    from bench.harness import table
    from bench.queue import default_dsn

    duration = float(argv[0]) if argv else 3.0
    notes: list[str] = []
    results = asyncio.run(run(default_dsn(), duration, notes))
    print(table(results, f"Queue: ours next to {PEER}"))
    for note in notes:
        print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
