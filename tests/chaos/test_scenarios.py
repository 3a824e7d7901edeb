"""Every chaos scenario, short, on real processes: the fenced run is valid, the control is not.

Each test runs a scenario twice on fresh servers (see :mod:`chaos.scenarios`): with
the guard fencing in the mode under test, and with fencing off. The fenced history
must satisfy every checker rule; the control's must break one of the rules the
scenario expects, or the faults were too weak to prove anything and the test fails.
Nothing here asserts on timing. A failure prints the verdict table; the histories,
process logs and ``timeline.html`` stay in the test's ``tmp_path``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.report import verdict_table, write_report
from chaos.scenarios import SCENARIOS, RunConfig, ScenarioResult, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

CLIENTS = 4
RESOURCES = 2
DURATION_S = 6.0
SEED = 7


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


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_on_sqlite(tmp_path: Path, scenario: str) -> None:
    result = run_and_judge(tmp_path, scenario)
    assert result.fenced.faults, "the schedule injected no fault"
    assert result.control is not None
    assert result.control.faults, "the control's schedule injected no fault"
