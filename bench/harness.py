"""Measuring loops, server processes and the ratio table shared by every benchmark."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

Op = Callable[[int], Awaitable[object]]

_written = itertools.count(1)


def fresh_value(size: int = 64) -> bytes:
    """A ``size``-byte value no earlier call in this process returned.

    Every benchmark write writes one, so each write changes what is stored: rewriting a
    constant leaves SQLite nothing to commit (no WAL frame, no fsync) and would measure a
    write that never reaches the disk.
    """
    return next(_written).to_bytes(8, "big").rjust(size, b"v")


@dataclass
class Result:
    """One measurement: ``ops`` operations in ``seconds`` with per-op latencies (s)."""

    name: str
    concurrency: int
    ops: int
    seconds: float
    latencies: list[float] = field(repr=False, default_factory=list)
    unit: str = "ops"
    #: Operations each timed call stands for (a batched write of 100 ops counts 100).
    per_call: int = 1
    baseline: str = ""
    #: Printed after the ratio (e.g. the server's CPU use during the run).
    note: str = ""
    #: CPU seconds the server process(es) used during the measured period (0: not known).
    server_cpu: float = 0.0

    @property
    def cpu_per_op(self) -> float:
        """Server CPU seconds per operation (0 when not measured)."""
        return self.server_cpu / self.ops if self.ops else 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    name: str,
    op: Op,
    concurrency: int,
    duration: float,
    *,
    warmup: float = 0.3,
    per_call: int = 1,
    baseline: str = "",
) -> Result:
    """Run ``op(worker_index)`` from ``concurrency`` tasks for ``duration`` seconds.

    Every task loops until the deadline; a warm-up period is run and discarded first.
    """

    async def loop(i: int, until: float, latencies: list[float] | None) -> int:
        n = 0
        while time.perf_counter() < until:
            started = time.perf_counter()
            await op(i)
            if latencies is not None:
                latencies.append(time.perf_counter() - started)
            n += 1
        return n

    if warmup > 0:
        until = time.perf_counter() + warmup
        await asyncio.gather(*(loop(i, until, None) for i in range(concurrency)))
    latencies: list[float] = []
    started = time.perf_counter()
    until = started + duration
    counts = await asyncio.gather(*(loop(i, until, latencies) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    return Result(
        name,
        concurrency,
        sum(counts) * per_call,
        elapsed,
        latencies,
        per_call=per_call,
        baseline=baseline,
    )


async def measure_server_cpu(
    srv: Server,
    name: str,
    op: Op,
    concurrency: int,
    duration: float,
    *,
    warmup: float = 0.3,
    baseline: str = "",
) -> Result:
    """:func:`measure`, also reading the CPU ``srv`` used over the measured period only
    (the warm-up runs first, before the reading starts); noted as microseconds per op."""
    if warmup > 0:
        await measure(name, op, concurrency, warmup, warmup=0)
    before = srv.cpu_seconds()
    result = await measure(name, op, concurrency, duration, warmup=0, baseline=baseline)
    result.server_cpu = srv.cpu_seconds() - before
    result.note = f"server CPU {result.cpu_per_op * 1e6:,.0f} us/op"
    return result


def baseline_of(r: Result, results: Sequence[Result]) -> Result | None:
    """The row ``r`` is compared with: its baseline at the same client count, else the
    first baseline row of that name (a stream of 256 writers against 16 connections)."""
    if not r.baseline:
        return None
    same = [b for b in results if b.name == r.baseline and b.concurrency == r.concurrency]
    if same:
        return same[0]
    return next((b for b in results if b.name == r.baseline), None)


def ratio_text(r: Result, results: Sequence[Result]) -> str:
    base = baseline_of(r, results)
    if base is None or not base.rate:
        return "(baseline)" if not r.baseline else "(no baseline)"
    return f"{r.rate / base.rate:.2f}x {r.baseline}"


def table(results: Sequence[Result], title: str = "") -> str:
    """A fixed-width table: rate, p50, p99 and the ratio to each row's baseline row."""
    lines = []
    if title:
        lines.append(title)
    width = max([44, *(len(r.name) for r in results)])
    header = f"{'benchmark':<{width}} {'clients':>7} {'ops/s':>10} "
    header += f"{'p50 ms':>8} {'p99 ms':>8}  ratio"
    lines += [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<{width}} {r.concurrency:>7} {r.rate:>10.0f} "
            f"{r.percentile(0.5) * 1000:>8.2f} {r.percentile(0.99) * 1000:>8.2f}  "
            f"{ratio_text(r, results)}{'  ' + r.note if r.note else ''}"
        )
    return "\n".join(lines)


def markdown(results: Sequence[Result]) -> str:
    """The same rows as :func:`table`, as a Markdown table."""
    lines = [
        "| benchmark | clients | ops/s | p50 ms | p99 ms | ratio | note |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.concurrency} | {r.rate:,.0f} | {r.percentile(0.5) * 1000:.2f} | "
            f"{r.percentile(0.99) * 1000:.2f} | {ratio_text(r, results)} | {r.note} |"
        )
    return "\n".join(lines)


def median_rate(results: Sequence[Result]) -> float:
    return statistics.median(r.rate for r in results) if results else 0.0


@dataclass
class Server:
    """A started server process: the address it printed and the pids doing the work
    (its workers with ``--workers N``, else itself), for CPU accounting."""

    address: str
    pids: list[int]

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by every pid (from /proc)."""
        return sum(cpu_seconds(pid) for pid in self.pids)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far: utime + stime of /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server_process(module: str, *args: str) -> Iterator[str]:
    """Start ``python -m module ... --listen 127.0.0.1:0``; yield the address it printed."""
    with server(module, *args) as started:
        yield started.address


@contextmanager
def server(module: str, *args: str, cwd: Path | None = None) -> Iterator[Server]:
    """Start ``python -m module ... --listen 127.0.0.1:0``; yield its :class:`Server`.

    ``cwd``: the directory it runs in. ``python -m`` puts it first on ``sys.path``, ahead
    of ``PYTHONPATH``, so a server meant to run another tree's code must run there.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    # Keep reading what it logs, so a chatty server never blocks on a full pipe.
    tail: deque[str] = deque(maxlen=50)
    drain = threading.Thread(
        target=lambda: tail.extend(proc.stderr or ()), name=f"{module}-stderr", daemon=True
    )
    drain.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.wait(5)
            drain.join(1)
            raise RuntimeError(f"{module} did not start: {line!r} {''.join(tail)[-2000:]}")
        address = line.split("listening on ")[1].split()[0]
        pids = [proc.pid]
        if "pids " in line:
            pids = [int(p) for p in line.split("pids ")[1].rstrip(")\n").split()]
        yield Server(address, pids)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(2)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)
