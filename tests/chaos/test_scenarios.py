"""Every chaos scenario, short, on real processes: the fenced run is valid, the control is not.

Each test runs a scenario twice on fresh servers (see :mod:`chaos.scenarios`): with
the guard fencing in the mode under test, and with fencing off. The fenced history
must satisfy every checker rule; the control's must break one of the rules the
scenario expects, or the faults were too weak to prove anything and the test fails.
Nothing here asserts on timing. A failure prints the verdict table; the histories,
process logs and ``timeline.html`` stay in the test's ``tmp_path``.

Every scenario runs on SQLite in monotonic mode (the lock-counter in the short
matrix, tests/chaos/test_cli.py, instead); a few run on throwaway PostgreSQL and
Redis servers (the harness starts them from the local binaries) and in the other
modes: strict (PostgreSQL, Redis), watch and promise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chaos.matrix import SHORT
from chaos.report import verdict_table, write_report
from chaos.scenarios import SCENARIOS, RunConfig, ScenarioResult, available_modes, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

CLIENTS = 4
RESOURCES = 2
DURATION_S = 6.0
SEED = 7
SHORT_MATRIX = {s for s, b, m in SHORT if (b, m) == ("sqlite", "monotonic")}
"""Scenarios the short matrix already runs on SQLite in monotonic mode."""


def run_and_judge(
    tmp_path: Path, scenario: str, backend: str = "sqlite", fence_mode: str = "monotonic"
) -> ScenarioResult:
    config = RunConfig(
        scenario,
        backend=backend,
        fence_mode=fence_mode,
        clients=CLIENTS,
        resources=RESOURCES,
        duration=DURATION_S,
        seed=SEED,
    )
    result = run_scenario(config, tmp_path)
    _, html_path = write_report(result, tmp_path)
    table = f"{verdict_table(result)}\nreport: {html_path}"
    for run in result.runs:
        assert not run.errors, table
    assert result.fenced.valid, table
    assert result.control is not None
    assert result.control_flagged, table
    assert result.passed, table
    return result


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in SHORT_MATRIX])
def test_scenario_on_sqlite(tmp_path: Path, scenario: str) -> None:
    result = run_and_judge(tmp_path, scenario)
    assert result.fenced.faults, "the schedule injected no fault"
    assert result.control is not None
    assert result.control.faults, "the control's schedule injected no fault"


def _missing(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    if backend == "postgres":
        if shutil.which("initdb") is None and not Path("/usr/lib/postgresql/15/bin").is_dir():
            return "needs the PostgreSQL binaries"
    elif backend == "redis" and shutil.which("redis-server") is None:
        return "needs redis-server"
    return None


def variant(scenario: str, backend: str, mode: str = "monotonic") -> object:
    reason = _missing(backend)
    if reason is None and mode not in available_modes():
        reason = f"fence mode {mode} is not in this build"
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(scenario, backend, mode, id=f"{scenario}-{backend}-{mode}", marks=marks)


@pytest.mark.parametrize(
    ("scenario", "backend", "mode"),
    [
        # A crash of the database itself, under the lease server and the guard.
        variant("restart-backend", "postgres"),
        variant("restart-backend", "redis"),
        # strict: the write's own transaction requires the live lease.
        variant("pause-holder", "postgres", "strict"),
        variant("pause-holder", "redis", "strict"),
        # watch: the guard follows the lease server, also across its restart.
        variant("pause-holder", "sqlite", "watch"),
        variant("restart-lease-server", "sqlite", "watch"),
        # promise: hold(fence=[guard]) fences the guard before the body runs.
        variant("pause-holder", "sqlite", "promise"),
        variant("partition-holder-from-lease-server", "sqlite", "promise"),
    ],
)
def test_scenario_on_other_backends_and_modes(
    tmp_path: Path, scenario: str, backend: str, mode: str
) -> None:
    result = run_and_judge(tmp_path, scenario, backend, mode)
    assert result.fenced.guard_mode == ("monotonic" if mode == "promise" else mode)
