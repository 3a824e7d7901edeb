"""One client holding 100,000 leases: how many calls, and how much of the server, does it take?

For each backend (SQLite, PostgreSQL; Redis when asked), a lease server runs in its own
process and this process is the one client: a ``LeaseClient`` takes 100,000 leases
(ttl 10 s) in blocks of 1,000 (``AcquireMany``), hands them to its session as
``hold_many`` does, and holds them for 120 s while the session renews them all with
``RenewMany``; then it releases them (``ReleaseMany``). Measured:

* **calls per second**: every RPC the client makes, counted by a client interceptor,
  over the holding window (and over the whole run, acquisition and release included);
* **expirations**: leases lost during the hold (``lease.lost``), plus releases the
  server refused at the end (a lease that expired, even unnoticed, is no longer the
  current one and is refused): the target is zero;
* **server CPU**: user + system time of the lease-server process (``/proc/<pid>/stat``)
  over the holding window, as cores; the target is under half a core.

Targets: zero expirations, at most 10 calls/s, the server under 0.5 cores.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench import postgres as pg_bench
from bench import redis as redis_bench
from bench.harness import Server, progress, server
from fencing import LeaseClient
from fencing.client.lease import Lease

LEASES = 100_000
TTL = 10.0
HOLD = 120.0
BLOCK = 1000  # resources per AcquireMany


class CallCounter(grpc.UnaryUnaryClientInterceptor):
    """Counts every unary call made through the channel, by method."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        with self._lock:
            method = client_call_details.method.rsplit("/", 1)[-1]
            self.calls[method] = self.calls.get(method, 0) + 1
        return continuation(client_call_details, request)

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())


@dataclass
class SessionRun:
    """One backend's figures (see the module doc)."""

    backend: str
    leases: int
    ttl: float
    hold_s: float
    calls_in_hold: int
    calls_total: int
    run_s: float
    lost: int
    refused: int
    server_cores: float
    calls: dict[str, int]

    @property
    def calls_per_s(self) -> float:
        return self.calls_in_hold / self.hold_s if self.hold_s else 0.0

    @property
    def calls_per_s_total(self) -> float:
        return self.calls_total / self.run_s if self.run_s else 0.0

    @property
    def expirations(self) -> int:
        return self.lost + self.refused

    def verdict(self) -> str:
        ok = self.expirations == 0 and self.calls_per_s <= 10 and self.server_cores < 0.5
        return "meets the target" if ok else "MISSES the target"


def hold_leases(
    address: str,
    server_: Server,
    leases: int,
    ttl: float,
    hold_s: float,
    label: str,
) -> SessionRun:
    """The client side, blocking (run it in a thread)."""
    counter = CallCounter()
    channel = grpc.intercept_channel(grpc.insecure_channel(address), counter)
    # Unary: the interceptor counts RPCs by method (on the lease stream they would all
    # be messages of one Session call).
    client = LeaseClient(
        address, holder=f"bench-{label}", channel=channel, rpc_timeout=10.0, transport="unary"
    )
    names = [f"sess-{label}-{i}" for i in range(leases)]
    started = time.perf_counter()
    held: list[Lease] = []
    try:
        session = client.session()
        for start in range(0, leases, BLOCK):
            block = client.acquire_many(names[start : start + BLOCK], ttl)
            for lease in block:
                session.add(lease)  # what hold_many does: the session keeps them
            held += block
        progress(f"{label}: {len(held):,} leases held; holding {hold_s:.0f} s")
        calls0, cpu0, t0 = counter.total(), server_.cpu_seconds(), time.perf_counter()
        deadline = t0 + hold_s
        while time.perf_counter() < deadline:
            time.sleep(min(10.0, max(0.0, deadline - time.perf_counter())))
            lost = sum(1 for lease in held if lease.lost.is_set())
            progress(
                f"{label}: {time.perf_counter() - t0:3.0f} s, "
                f"{counter.total() - calls0} calls, {lost} lost"
            )
        held_for = time.perf_counter() - t0
        cores = (server_.cpu_seconds() - cpu0) / held_for
        calls_in_hold = counter.total() - calls0
        for lease in held:
            session.discard(lease)
        lost = sum(1 for lease in held if lease.lost.is_set())
        # A lease that expired unnoticed is no longer current: its release is refused.
        refused = len(client.release_many([lease for lease in held if not lease.lost.is_set()]))
    finally:
        client.close()
    return SessionRun(
        backend=label,
        leases=len(held),
        ttl=ttl,
        hold_s=held_for,
        calls_in_hold=calls_in_hold,
        calls_total=counter.total(),
        run_s=time.perf_counter() - started,
        lost=lost,
        refused=refused,
        server_cores=cores,
        calls=dict(counter.calls),
    )


async def one(label: str, backend_url: str, leases: int, ttl: float, hold_s: float) -> SessionRun:
    with server("lease_server", "--backend", backend_url) as lease_server:
        return await asyncio.to_thread(
            hold_leases, lease_server.address, lease_server, leases, ttl, hold_s, label
        )


async def run(
    *,
    leases: int = LEASES,
    ttl: float = TTL,
    hold_s: float = HOLD,
    backends: Sequence[str] = ("sqlite", "postgres"),
    dsn: str | None = None,
    url: str | None = None,
) -> list[SessionRun]:
    """Each backend in ``backends`` (an unreachable one is skipped with a note)."""
    runs: list[SessionRun] = []
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory(prefix="fencing-sessions-") as tmp:
            url_ = f"sqlite:{Path(tmp) / 'leases.db'}"
            runs.append(await one("sqlite", url_, leases, ttl, hold_s))
    if "postgres" in backends:
        dsn = dsn or pg_bench.default_dsn()
        async with pg_bench.bench_schema(dsn) as schema:
            sep = "&" if "?" in dsn else "?"
            runs.append(await one("postgres", f"{dsn}{sep}schema={schema}", leases, ttl, hold_s))
    if "redis" in backends:
        url = url or redis_bench.default_url()
        prefix = f"sessbench{id(runs)}"
        try:
            sep = "&" if "?" in url else "?"
            runs.append(await one("redis", f"{url}{sep}prefix={prefix}", leases, ttl, hold_s))
        finally:
            await redis_bench.drop(url, prefix)
    return runs


def table(runs: Sequence[SessionRun]) -> str:
    lines = [
        f"{'backend':<10} {'leases':>7} {'hold s':>7} {'calls/s':>8} {'(all)':>7} "
        f"{'expired':>8} {'server cores':>13}  verdict",
    ]
    lines.append("-" * len(lines[0]))
    for r in runs:
        lines.append(
            f"{r.backend:<10} {r.leases:>7} {r.hold_s:>7.0f} {r.calls_per_s:>8.2f} "
            f"{r.calls_per_s_total:>7.2f} {r.expirations:>8} {r.server_cores:>13.3f}  {r.verdict()}"
        )
    return "\n".join(lines)


def markdown(runs: Sequence[SessionRun]) -> str:
    lines = [
        "| backend | leases (ttl) | held for | calls/s while holding (target <= 10) | "
        "calls/s incl. acquire+release | expirations (target 0) | "
        "lease-server CPU, cores (target < 0.5) | calls by method | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in runs:
        methods = ", ".join(f"{k} {v}" for k, v in sorted(r.calls.items()))
        lines.append(
            f"| {r.backend} | {r.leases:,} ({r.ttl:g} s) | {r.hold_s:.0f} s | "
            f"{r.calls_per_s:.2f} | {r.calls_per_s_total:.2f} | {r.expirations} | "
            f"{r.server_cores:.3f} | {methods} | {r.verdict()} |"
        )
    return "\n".join(lines)
