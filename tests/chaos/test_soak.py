"""Short soaks on real processes (SQLite): valid and flat, and the controls of both verdicts.

A soak (:mod:`chaos.soak`) runs every workload at once under a seeded nemesis, with
the checker over the whole history and a health watch over every server. Each
verdict has its control here: with the guard's fencing off the same soak shows
violations, and servers that keep one asyncio task per call (:mod:`chaos.leaky`)
fail the growth check. Nothing asserts on timing. The long soaks are run by hand
(``fencing chaos soak --duration 30m``, docs/chaos.md), never in this suite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.processes import REPO_ROOT, child_env
from chaos.soak import SoakConfig, SoakResult, rejudge, run_soak, verdict_lines

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

DURATION_S = 30.0
CI_SOAK_S = 60.0
"""The CI's soak step: SQLite, every workload, the nemesis; a minute keeps the suite's
time in bounds while giving the growth check a last half of 30 s to judge."""
SEED = 3


def soak(tmp_path: Path, **kw: object) -> SoakResult:
    kw.setdefault("duration", DURATION_S)
    config = SoakConfig(seed=SEED, sample_every=1.0, **kw)  # type: ignore[arg-type]
    result = run_soak(config, tmp_path)
    print("\n".join(verdict_lines(result)))
    return result


def test_a_short_soak_on_sqlite_is_valid_and_flat(tmp_path: Path) -> None:
    # Every workload at once (lock-counter, effects, queue workers, hold_many, leaders) under
    # the nemesis: no violation, health flat.
    # Names rotate every 20 s here (five minutes in a real soak): three epochs at least.
    result = soak(tmp_path, duration=CI_SOAK_S, epoch_s=20.0)
    assert result.errors == []
    assert result.result.valid, result.result.summary()
    assert result.grows == []
    # It did soak: faults struck, every workload ran, the servers were sampled.
    assert sum(result.fault_counts.values()) >= 3
    processes = {e.process.split("~")[0][:1] for e in _history(tmp_path)}
    assert {"k", "e", "j", "m", "l"} <= processes
    # hold_many sessions held several leases at once and wrote under each.
    many = [e for e in _history(tmp_path) if e.process.startswith("m") and e.type == "ok"]
    assert {_base(e.resource) for e in many if e.op == "write"} >= {"m0", "m1", "m2"}
    # Each resource was written under several epochs' names, each a fresh counter.
    counted = {e.resource for e in _history(tmp_path) if e.op == "write" and e.key == "counter"}
    assert len({r for r in counted if _base(r) == "r0"}) >= 2, sorted(counted)
    # The periodic schedule's jobs were listed after the run, one per period (rule 8).
    periodic = [e for e in _history(tmp_path) if e.op == "periodic" and e.type == "ok"]
    assert len(periodic) >= 5
    # Every job of the workers' queue was listed at the end, each one done (rule 9).
    jobs = [e for e in _history(tmp_path) if e.op == "job" and e.type == "invoke"]
    claimed = {e.extra["job"] for e in _history(tmp_path) if e.op == "acquire" and "job" in e.extra}
    assert claimed and claimed <= {e.extra["job"] for e in jobs}
    # Candidates were elected (terms) and their increments fenced by the term.
    led = [e for e in _history(tmp_path) if e.process.startswith("l") and e.type == "ok"]
    assert {e.op for e in led} >= {"acquire", "write"}
    assert {g.metric for g in result.growths} >= {"rss_mb", "fds", "tasks"}
    assert result.checks, "the checker also ran during the soak"
    assert (tmp_path / "health.html").read_text().count("<svg") >= 6
    assert list((tmp_path / "plots").glob("*.svg"))
    # Judged again from what the run left on disk (fencing chaos report DIR): the same.
    again = rejudge(tmp_path)
    assert again.passed
    assert again.result.counts() == result.result.counts()
    assert [g.to_dict() for g in again.growths] == [g.to_dict() for g in result.growths]


def _missing(backend: str) -> str | None:
    if backend == "postgres":
        if shutil.which("initdb") is None and not Path("/usr/lib/postgresql/15/bin").is_dir():
            return "needs the PostgreSQL binaries"
    elif shutil.which("redis-server") is None:
        return "needs redis-server"
    return None


@pytest.mark.parametrize(
    ("backend", "mode"),
    [
        pytest.param(
            backend,
            mode,
            id=f"{backend}-{mode}",
            marks=[pytest.mark.skip(reason=r)] if (r := _missing(backend)) else [],
        )
        for backend, mode in [("postgres", "strict"), ("redis", "watch")]
    ],
)
def test_a_short_soak_with_two_lease_servers_is_valid_and_flat(
    tmp_path: Path, backend: str, mode: str
) -> None:
    result = soak(tmp_path, backend=backend, fence_mode=mode)
    assert result.config.servers == 2
    assert result.errors == []
    assert result.result.valid, result.result.summary()
    assert result.grows == []
    judged = {(g.process, g.metric) for g in result.growths}
    assert ("lease-server-1", "fds") in judged
    assert ("database", "connections") in judged


def test_the_same_soak_with_fencing_off_shows_violations(tmp_path: Path) -> None:
    # Its faults the pauses alone: whether a paused holder's late write lands is
    # timing, and 30 s of every kind of fault held one client pause, so a loaded machine
    # could run the control without a violation to show.
    result = soak(tmp_path, fencing=False, fault_kinds=("pause-client", "pause-lease-server"))
    assert result.errors == []
    assert not result.result.valid
    assert result.result.kinds() & {"stale-write-accepted", "lost-update"}


def test_servers_that_keep_a_task_per_call_fail_the_growth_check(tmp_path: Path) -> None:
    # The health check's control: no faults needed, the leak grows under any load.
    result = soak(tmp_path, leak="task", faults=False)
    assert result.errors == []
    flagged = {(g.process, g.metric) for g in result.grows}
    assert ("guard", "tasks") in flagged, result.growths
    assert not result.passed


def test_the_soak_command_refuses_what_does_not_apply() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fencingctl", "chaos", "soak", "--fence-mode", "strict"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert run.returncode == 2
    assert "strict mode needs --backend postgres or redis" in run.stderr


def _base(resource: str) -> str:
    """A resource's name without its epoch (``r0.e5938123`` -> ``r0``)."""
    return resource.split(".e", 1)[0]


def _history(out: Path) -> list:  # type: ignore[type-arg]
    from chaos.history import read_history

    return read_history(out / "history")
