"""The scale benchmarks run end to end with tiny sizes (no timing is asserted)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import peers, scale, sessions, throughput
from bench.harness import Result

# slow: smoke runs of the benches (the default loop leaves it out).
pytestmark = pytest.mark.slow


async def test_sessions_bench_holds_and_counts() -> None:
    (run,) = await sessions.run(leases=120, ttl=1.0, hold_s=1.5, backends=("sqlite",))
    assert run.leases == 120 and run.expirations == 0
    assert run.calls["AcquireMany"] == 1 and run.calls.get("RenewMany", 0) >= 1
    assert run.server_cores >= 0 and "sqlite" in sessions.markdown([run])


async def test_scale_bench_populates_and_compares() -> None:
    rows = await scale.run(0.4, large=3000, only=("sqlite",))
    assert [r.name for r in rows] == [
        "sqlite: Acquire, 1,000 resources",
        "sqlite: Acquire, 3,000 resources",
        "sqlite: Write (1 op), 1,000 resources",
        "sqlite: Write (1 op), 3,000 resources",
    ]
    assert all(r.latencies for r in rows)
    assert len(scale.p50_ratio(rows)) == 2


@pytest.mark.postgres
async def test_throughput_bench_runs_on_postgres() -> None:
    rows = await throughput.run([2], 0.2, only=("postgres",), workers=(1, 2))
    names = [r.name for r in rows]
    assert throughput.PG_DIRECT in names and "pg guard x2 workers: WriteStream 4x64 (SDK)" in names
    assert all(r.ops > 0 for r in rows)
    assert all("guard" in r.note for r in rows if r.name.startswith("pg guard"))


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed")
async def test_etcd_peer_runs() -> None:
    result = await peers.etcd_lock(2, 0.2)
    assert result.ops > 0 and result.name == peers.ETCD


def test_results_file_is_written(tmp_path: Path) -> None:
    row = Result("x", 1, 10, 1.0, [0.1] * 10)
    report = bench_main.Report(results=[row], targets=[("a target", "a figure", "yes")])
    out = tmp_path / "RESULTS.md"
    options = bench_main.Options(clients=[1], duration=0.1)
    bench_main.write_results(out, {"floor": (report, 1.0)}, options, "now", 2.0)
    text = out.read_text()
    assert "# Benchmark results" in text and "| a target | a figure | yes |" in text
    assert "| x | 1 | 10 |" in text
