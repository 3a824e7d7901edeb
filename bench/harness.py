"""Measuring loops, server processes and the ratio table shared by every benchmark."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

Op = Callable[[int], Awaitable[object]]


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


def table(results: Sequence[Result], title: str = "") -> str:
    """A fixed-width table: rate, p50, p99 and the ratio to each row's baseline row."""
    by_key = {(r.name, r.concurrency): r for r in results}
    lines = []
    if title:
        lines.append(title)
    header = f"{'benchmark':<44} {'clients':>7} {'ops/s':>10} {'p50 ms':>8} {'p99 ms':>8}  ratio"
    lines += [header, "-" * len(header)]
    for r in results:
        base = by_key.get((r.baseline, r.concurrency)) if r.baseline else None
        ratio = f"{r.rate / base.rate:5.2f}x {r.baseline}" if base and base.rate else "  (baseline)"
        lines.append(
            f"{r.name:<44} {r.concurrency:>7} {r.rate:>10.0f} "
            f"{r.percentile(0.5) * 1000 / 1:>8.2f} {r.percentile(0.99) * 1000:>8.2f}  {ratio}"
        )
    return "\n".join(lines)


def median_rate(results: Sequence[Result]) -> float:
    return statistics.median(r.rate for r in results) if results else 0.0


@contextmanager
def server_process(module: str, *args: str) -> Iterator[str]:
    """Start ``python -m module ... --listen 127.0.0.1:0``; yield the address it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"{module} did not start: {line!r} {err[-2000:]}")
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)
