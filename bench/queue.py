"""The queue: jobs per second through the QueueService, next to hand-written SQL run directly.

For each client count, with batch 1 and batch 100:

* **enqueue**: ``Enqueue`` of ``batch`` jobs (64-byte payloads) per call, for ``duration``;
* **claim+complete**: ``Claim(batch)`` then ``Complete`` of what it returned, until a
  prefilled queue is drained (so an empty queue never inflates the rate);
* **claim+fence+complete** (batch 1): the same with a ``Fence(job.resource, job.token)``
  at a guard process between them, one per job, as
  ``Worker(..., fence=[guard])`` does before each handler: its ratio to the
  claim+complete row of the same run is what the promise for jobs costs;

through a lease server process hosting the queue service on SQLite (the embedded
default) and, when PostgreSQL answers, on PostgreSQL; and, as the baseline, the
same work as a hand-written SKIP LOCKED queue's statements, run directly with psycopg
on PostgreSQL in
the same run (its ``INSERT``; its ``FOR UPDATE SKIP LOCKED`` claim with ``LIMIT
batch``; its owner-checked complete, ``id = ANY(...)`` for a batch), one
connection per client, autocommit. Every rate counts jobs, not calls. The service
does more per job than that SQL (tokens, ordering keys, idempotency keys, the
all-or-nothing token check, gRPC): the ratio is what that costs.

``python -m bench.queue [--duration S] [--clients 1,16] [--dsn URL]``; :func:`run` plugs
into ``python -m bench --queue``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc.aio
import psycopg
from psycopg import sql

from bench.harness import Result, measure, progress, server_process, table
from fencing.v1 import guard_pb2, guard_pb2_grpc, queue_pb2, queue_pb2_grpc

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BATCHES = (1, 100)
PAYLOAD = b"p" * 64
#: Jobs prefilled for each claim+complete measurement, per second of ``duration``.
DRAIN_JOBS_PER_S = {1: 1000, 100: 10_000}

SEED = "hand-written SQL (psycopg)"


def default_dsn() -> str:
    return os.environ.get("FENCING_BENCH_POSTGRES_DSN", DEFAULT_DSN)


def seed_name(what: str, batch: int) -> str:
    return f"{SEED}: {what} x{batch}"


async def drain(
    name: str,
    op: Callable[[int], Awaitable[int]],
    clients: int,
    total: int,
    *,
    per_call: int,
    baseline: str = "",
) -> Result:
    """Run ``op(i)`` (returns jobs done) from ``clients`` tasks until it returns 0."""
    latencies: list[float] = []
    started = time.perf_counter()

    async def loop(i: int) -> int:
        done = 0
        for _ in range(total + 1):
            t = time.perf_counter()
            n = await op(i)
            if n == 0:
                return done
            latencies.append(time.perf_counter() - t)
            done += n
        return done

    done = sum(await asyncio.gather(*(loop(i) for i in range(clients))))
    elapsed = time.perf_counter() - started
    if done != total:
        raise RuntimeError(f"{name}: drained {done} jobs, expected {total}")
    return Result(name, clients, done, elapsed, latencies, per_call=per_call, baseline=baseline)


# -- through the service ------------------------------------------------------------------------


async def service_bench(
    address: str,
    label: str,
    clients: Sequence[int],
    duration: float,
    *,
    baseline: bool,
    guard: str = "",
) -> list[Result]:
    results: list[Result] = []
    for n in clients:
        channels = [grpc.aio.insecure_channel(address) for _ in range(n)]
        guard_channels = [grpc.aio.insecure_channel(guard) for _ in range(n)] if guard else []
        try:
            stubs: list[queue_pb2_grpc.QueueServiceAsyncStub] = [
                queue_pb2_grpc.QueueServiceStub(c) for c in channels
            ]
            guards: list[guard_pb2_grpc.GuardServiceAsyncStub] = [
                guard_pb2_grpc.GuardServiceStub(c) for c in guard_channels
            ]
            for batch in BATCHES:
                results += await _service_one(stubs, label, n, batch, duration, baseline, guards)
        finally:
            for c in channels + guard_channels:
                await c.close()
    return results


async def _service_one(
    stubs: list[queue_pb2_grpc.QueueServiceAsyncStub],
    label: str,
    n: int,
    batch: int,
    duration: float,
    baseline: bool,
    guards: Sequence[guard_pb2_grpc.GuardServiceAsyncStub] = (),
) -> list[Result]:
    tag = secrets.token_hex(3)
    jobs = [queue_pb2.NewJob(payload=PAYLOAD) for _ in range(batch)]
    enqueue_queue = f"bench-enq-{tag}"

    async def enqueue(i: int) -> None:
        await stubs[i].Enqueue(queue_pb2.EnqueueRequest(queue=enqueue_queue, jobs=jobs))

    progress(f"QueueService/{label} enqueue x{batch}, {n} clients")
    results = [
        await measure(
            f"QueueService/{label}: enqueue x{batch}",
            enqueue,
            n,
            duration,
            per_call=batch,
            baseline=seed_name("enqueue", batch) if baseline else "",
        )
    ]

    total = max(batch * n, round(DRAIN_JOBS_PER_S[batch] * duration / batch) * batch)
    chunk = [queue_pb2.NewJob(payload=PAYLOAD) for _ in range(1000)]

    async def prefill(work_queue: str) -> None:
        for start in range(0, total, 1000):
            size = min(1000, total - start)
            await stubs[0].Enqueue(queue_pb2.EnqueueRequest(queue=work_queue, jobs=chunk[:size]))

    def claim_complete(work_queue: str, fence: bool) -> Callable[[int], Awaitable[int]]:
        async def op(i: int) -> int:
            claimed = await stubs[i].Claim(
                queue_pb2.ClaimRequest(
                    queue=work_queue, worker=f"b{i}", batch_size=batch, ttl_ms=60_000
                )
            )
            if not claimed.jobs:
                return 0
            if fence:  # what Worker(fence=[guard]) does before each job's handler
                await asyncio.gather(
                    *(
                        guards[i].Fence(guard_pb2.FenceRequest(resource=j.resource, token=j.token))
                        for j in claimed.jobs
                    )
                )
            refs = [queue_pb2.JobRef(id=j.id, token=j.token) for j in claimed.jobs]
            await stubs[i].Complete(queue_pb2.CompleteRequest(jobs=refs))
            return len(refs)

        return op

    plain = f"QueueService/{label}: claim+complete x{batch}"
    work_queue = f"bench-work-{tag}"
    await prefill(work_queue)
    progress(f"QueueService/{label} claim+complete x{batch}, {n} clients, {total} jobs")
    results.append(
        await drain(
            plain,
            claim_complete(work_queue, fence=False),
            n,
            total,
            per_call=batch,
            baseline=seed_name("claim+complete", batch) if baseline else "",
        )
    )
    # Batch 1 only: a worker fences each job from its own handler, and 100 concurrent
    # Fence calls per client are not what a worker of a sane concurrency sends.
    if guards and batch == 1:
        fenced_queue = f"bench-fenced-{tag}"
        await prefill(fenced_queue)
        progress(f"QueueService/{label} claim+fence+complete x{batch}, {n} clients")
        results.append(
            await drain(
                f"QueueService/{label}: claim+fence+complete x{batch}",
                claim_complete(fenced_queue, fence=True),
                n,
                total,
                per_call=batch,
                baseline=plain,
            )
        )
    return results


# -- the hand-written queue's SQL, directly --------------------------------------------------

# The hand-written queue's schema: a jobs table and its partial indexes.
SEED_SCHEMA = """
CREATE TABLE jobs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    payload         jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'ready'
                    CHECK (state IN ('ready', 'running', 'succeeded', 'dead')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    available_at    timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_until     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz
);
CREATE INDEX jobs_claimable_idx ON jobs (available_at, id) WHERE state = 'ready';
CREATE INDEX jobs_expired_idx ON jobs (lease_until) WHERE state = 'running';
"""

# Its enqueue (a plain INSERT), for many rows at once.
SEED_ENQUEUE = """
INSERT INTO jobs (idempotency_key, payload)
SELECT k, '{"message": "bench"}'::jsonb FROM unnest(%s::text[]) AS k
"""

# Its claim, with LIMIT the batch size.
SEED_CLAIM = """
WITH candidate AS (
    SELECT id
    FROM jobs
    WHERE attempts < max_attempts
      AND (
        (state = 'ready' AND available_at <= now())
        OR (state = 'running' AND lease_until < now())
      )
    ORDER BY available_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT %s
)
UPDATE jobs AS j
SET state = 'running',
    lease_owner = %s,
    lease_until = now() + (%s * interval '1 millisecond'),
    attempts = attempts + 1
FROM candidate
WHERE j.id = candidate.id
RETURNING j.id, j.idempotency_key, j.payload, j.attempts, j.max_attempts
"""

# Its owner-checked complete (id = ANY for a batch).
SEED_COMPLETE = """
UPDATE jobs
SET state = 'succeeded', completed_at = now(),
    lease_owner = NULL, lease_until = NULL, last_error = NULL
WHERE id = ANY(%s) AND lease_owner = %s AND state = 'running'
"""


@asynccontextmanager
async def seed_schema(dsn: str) -> AsyncIterator[str]:
    schema = f"bench_seed002_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        await conn.execute(SEED_SCHEMA.encode())
    try:
        yield schema
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


async def seed_bench(dsn: str, clients: Sequence[int], duration: float) -> list[Result]:
    results: list[Result] = []
    async with seed_schema(dsn) as schema:
        for n in clients:
            conns = []
            try:
                for _ in range(n):
                    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                    conns.append(conn)
                    await conn.execute(
                        sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))
                    )
                for batch in BATCHES:
                    results += await _seed_one(conns, n, batch, duration)
            finally:
                for conn in conns:
                    await conn.close()
    return results


async def _seed_one(
    cs: list[psycopg.AsyncConnection[tuple[Any, ...]]], n: int, batch: int, duration: float
) -> list[Result]:
    counter = [0]

    def keys(count: int) -> list[str]:
        counter[0] += count
        return [f"k{secrets.token_hex(4)}-{counter[0] - j}" for j in range(count)]

    async def enqueue(i: int) -> None:
        await cs[i].execute(SEED_ENQUEUE, (keys(batch),))

    progress(f"{SEED} enqueue x{batch}, {n} clients")
    results = [await measure(seed_name("enqueue", batch), enqueue, n, duration, per_call=batch)]
    # Each drain starts on a table holding just its jobs, as the service's queue does.
    await cs[0].execute("TRUNCATE jobs")

    total = max(batch * n, round(DRAIN_JOBS_PER_S[batch] * duration / batch) * batch)
    for start in range(0, total, 1000):
        await cs[0].execute(SEED_ENQUEUE, (keys(min(1000, total - start)),))

    async def claim_complete(i: int) -> int:
        owner = f"b{i}"
        cur = await cs[i].execute(SEED_CLAIM, (batch, owner, 60_000))
        ids = [row[0] for row in await cur.fetchall()]
        if not ids:
            return 0
        await cs[i].execute(SEED_COMPLETE, (ids, owner))
        return len(ids)

    progress(f"{SEED} claim+complete x{batch}, {n} clients, {total} jobs")
    results.append(
        await drain(seed_name("claim+complete", batch), claim_complete, n, total, per_call=batch)
    )
    return results


# -- the section ---------------------------------------------------------------------------------


def postgres_reachable(dsn: str) -> str | None:
    """None if PostgreSQL answers at ``dsn``, else why not."""
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return None
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}".strip()


def postgres_queue_available() -> bool:
    return importlib.util.find_spec("lease_server.queue.backends.postgres") is not None


async def run(clients: Sequence[int], duration: float, dsn: str | None = None) -> list[Result]:
    """Hand-written SQL on PostgreSQL (if reachable), then the service on SQLite and PostgreSQL."""
    dsn = dsn or default_dsn()
    why_not = postgres_reachable(dsn)
    if why_not is not None:
        progress(f"PostgreSQL not reachable at {dsn} ({why_not}): seed baseline skipped")
    results: list[Result] = []
    if why_not is None:
        results += await seed_bench(dsn, clients, duration)
    with tempfile.TemporaryDirectory(prefix="fencing-bench-queue-") as tmp:
        data = Path(tmp)
        with (
            server_process(
                "lease_server",
                "--backend",
                f"sqlite:{data / 'leases.db'}",
                "--queue",
                f"sqlite:{data / 'queue.db'}",
            ) as address,
            server_process("guard", "--store", f"sqlite:{data / 'guard.db'}") as guard,
        ):
            results += await service_bench(
                address, "sqlite", clients, duration, baseline=why_not is None, guard=guard
            )
    if why_not is None and postgres_queue_available():
        schema = f"bench_queue_{secrets.token_hex(4)}"
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&pool_max=16"
        try:
            with (
                server_process("lease_server", "--backend", url, "--queue", url) as address,
                server_process("guard", "--store", url) as guard,
            ):
                results += await service_bench(
                    address, "postgres", clients, duration, baseline=True, guard=guard
                )
        finally:
            await _drop_schema(dsn, schema)
    return results


async def _drop_schema(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.queue", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--dsn", default=None, help=f"PostgreSQL (default {DEFAULT_DSN})")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c]
    results = asyncio.run(run(clients, args.duration, args.dsn))
    print(table(results, "Queue: jobs/s through the QueueService vs hand-written SQL"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
