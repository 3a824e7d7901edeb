"""The PostgreSQL lease path of an earlier commit against this one, in alternating rounds.

:mod:`bench.pglog` measures the code before and the code now one after the other, and on
a shared machine the load drifts between them. Here both run at once, each in a database
of its own (so neither's NOTIFYs wake the other's listeners), and each measurement of one
is followed at once by the same of the other (before, now; in the next round now,
before), so both see the load of the same few seconds. Each measurement: Acquire+Release
pairs/s from N gRPC clients, the lease servers' CPU per call, PostgreSQL's CPU per call
(its backend processes serving them, from ``/proc``), calls per backend step (the
servers' ``fencing_lease_step_calls_total`` / ``fencing_lease_steps_total``), and the
sequencer runs per step (``pg_stat_statements``, when the server has it loaded; else
nan). The medians end the run, with now / before.

``python -m bench.pglog_ab --before REF [--clients 1,16] [--servers 1,2] [--rounds 6]
[--duration 3]`` (``FENCING_BENCH_POSTGRES_DSN``, default the local test database; the
role must be allowed to create databases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import statistics
import sys
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc.aio
import psycopg
from psycopg import sql

from bench import postgres as pg_bench
from bench.harness import Server, measure, progress, server
from bench.pglog import PgCpu, _acquire_release_op, checkout, code_from
from fencing.v1 import lease_pb2_grpc
from serving.ports import free_port


@dataclass
class Setup:
    """One tree's lease servers on one schema of a database of its own."""

    label: str
    dsn: str
    servers: list[tuple[Server, int]]  # each with its metrics port
    pg: PgCpu
    rows: dict[tuple[int, int], list[tuple[float, ...]]] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def _database(dsn: str) -> AsyncIterator[str]:
    """A database of its own, dropped after: ``dsn`` pointing at it."""
    name = f"fencing_ab_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, query = dsn.partition("?")
    url = f"{base.rsplit('/', 1)[0]}/{name}{'?' + query if query else ''}"
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            with contextlib.suppress(psycopg.Error):  # counts sequencer runs when available
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield url
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _steps(port: int) -> tuple[float, float]:
    """The server's backend steps and the calls they carried, so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()

    def value(name: str) -> float:
        found = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    return value("fencing_lease_steps_total"), value("fencing_lease_step_calls_total")


async def _sequencer_runs(dsn: str, reset: bool) -> float:
    """Sequencer runs since the last reset (``pg_stat_statements``), or NaN without it."""
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            if reset:
                await conn.execute("SELECT pg_stat_statements_reset()")
                return 0.0
            cur = await conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE query LIKE '%lease_events_sequence()%' AND toplevel"
            )
            row = await cur.fetchone()
            return float(row[0]) if row else 0.0
    except psycopg.Error:
        return float("nan")


async def _round(s: Setup, n: int, count: int, duration: float) -> tuple[float, ...]:
    """One measurement: pairs/s, servers' and PostgreSQL's us/call, calls per step,
    sequencer runs per step."""
    addresses = [srv.address for srv, _ in s.servers[:count]]
    chans = [grpc.aio.insecure_channel(addresses[i % count]) for i in range(n)]
    try:
        op = _acquire_release_op([lease_pb2_grpc.LeaseServiceStub(c) for c in chans], "ab")
        await measure("warm-up", op, n, 0.5, warmup=0)
        await _sequencer_runs(s.dsn, reset=True)
        steps0 = [_steps(port) for _, port in s.servers[:count]]
        cpu0 = sum(srv.cpu_seconds() for srv, _ in s.servers[:count])
        pg0 = await s.pg.snapshot()
        got = await measure(s.label, op, n, duration, warmup=0)
        cpu = sum(srv.cpu_seconds() for srv, _ in s.servers[:count]) - cpu0
        pg = await s.pg.since(pg0)
        steps1 = [_steps(port) for _, port in s.servers[:count]]
        runs = await _sequencer_runs(s.dsn, reset=False)
    finally:
        for c in chans:
            await c.close()
    calls = got.ops * 2
    steps = sum(b[0] - a[0] for a, b in zip(steps0, steps1, strict=True)) or 1.0
    carried = sum(b[1] - a[1] for a, b in zip(steps0, steps1, strict=True))
    return got.rate, cpu / calls * 1e6, pg / calls * 1e6, carried / steps, runs / steps


async def run(
    before: str,
    clients: Sequence[int],
    servers: Sequence[int],
    rounds: int,
    duration: float,
    dsn: str,
) -> list[str]:
    """Every round's line and the medians (see the module doc)."""
    lines: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        trees = {"before": stack.enter_context(checkout(before)), "now": None}
        setups: list[Setup] = []
        for label, tree in trees.items():
            url = await stack.enter_async_context(_database(dsn))
            schema = f"ab_{secrets.token_hex(3)}"
            app = f"{schema}-lease"
            lease_url = f"{url}{'&' if '?' in url else '?'}schema={schema}&application_name={app}"
            stack.enter_context(code_from(tree))
            started = []
            for _ in range(max(servers)):
                port = free_port()
                args = ("--backend", lease_url, "--metrics-port", str(port))
                srv = stack.enter_context(server("lease_server", *args, cwd=tree))
                started.append((srv, port))
            setups.append(Setup(label, url, started, PgCpu(url, app)))
        for r in range(rounds):
            for count in servers:
                for n in clients:
                    # Before and now back to back, first one then the other: both see the
                    # load of the same few seconds.
                    for s in setups if r % 2 == 0 else reversed(setups):
                        progress(f"round {r}: {s.label}, {count} server(s), {n} clients")
                        row = await _round(s, n, count, duration)
                        s.rows.setdefault((count, n), []).append(row)
                        lines.append(
                            f"round {r} {s.label}, {count} server(s), {n} clients: " + _text(row)
                        )
        lines.append("medians (now / before):")
        for count in servers:
            for n in clients:
                med = {s.label: _medians(s.rows[(count, n)]) for s in setups}
                b, a = med["before"], med["now"]
                lines.append(f"  {count} server(s), {n} clients: before {_text(b)}")
                lines.append(f"  {count} server(s), {n} clients: now    {_text(a)}")
                lines.append(
                    f"  {count} server(s), {n} clients: now/before pairs/s {a[0] / b[0]:.2f}x,"
                    f" servers' CPU/call {a[1] / b[1]:.2f}x,"
                    f" PostgreSQL's CPU/call {a[2] / b[2]:.2f}x"
                )
    return lines


def _medians(rows: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(statistics.median(row[i] for row in rows) for i in range(len(rows[0])))


def _text(row: tuple[float, ...]) -> str:
    rate, server_us, pg_us, per_step, runs = row
    return (
        f"{rate:6.0f} pairs/s, servers {server_us:5.0f} us/call, postgres {pg_us:4.0f} us/call,"
        f" {per_step:4.1f} calls/step, {runs:.2f} sequencer runs/step"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pglog_ab", description=__doc__)
    p.add_argument("--before", required=True, help="the commit to measure against")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument("--servers", default="1,2", help="lease servers on one schema")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--dsn", default=pg_bench.default_dsn())
    args = p.parse_args(argv)
    lines = asyncio.run(
        run(
            args.before,
            [int(c) for c in args.clients.split(",") if c],
            [int(c) for c in args.servers.split(",") if c],
            args.rounds,
            args.duration,
            args.dsn,
        )
    )
    print("\n".join(lines))
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
