"""The matrix re-runs a control that caught nothing with a fresh seed, a bounded number of
times, and never re-runs a fenced run (chaos/matrix.py), with fake runs in place of
real processes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from chaos.checker import CheckResult, Violation, ViolationKind, check
from chaos.matrix import (
    CONTROL_ATTEMPTS,
    Cell,
    cell_row,
    control_seed,
    matrix_table,
    run_cell,
    run_matrix,
)
from chaos.scenarios import SCENARIOS, Progress, RunConfig, RunOutcome, ScenarioResult

STALE = ViolationKind.STALE_WRITE_ACCEPTED.value
CONFIG = RunConfig(scenario="pause-worker", backend="postgres", fence_mode="promise", seed=1)


def judged(*kinds: str) -> CheckResult:
    """A checker verdict with one violation of each of ``kinds``."""
    clean = check([], mode="promise")
    return replace(clean, violations=tuple(Violation(k, "r0", "made up", ("w",)) for k in kinds))


def outcome(
    label: str, workdir: Path, seed: int, *kinds: str, errors: tuple[str, ...] = ()
) -> RunOutcome:
    workdir.mkdir(parents=True, exist_ok=True)
    return RunOutcome(
        label=label,
        guard_mode="off" if label == "control" else "monotonic",
        checked_mode="promise",
        result=judged(*kinds),
        events=[],
        faults=[],
        workdir=workdir,
        started_ns=0,
        ended_ns=1,
        errors=list(errors),
        seed=seed,
    )


@dataclass
class FakeRuns:
    """Scripted runs: the fenced run's violations and errors, and one control verdict per
    control run in order (a tuple of violation kinds; empty: caught nothing)."""

    controls: list[tuple[str, ...]]
    fenced: tuple[str, ...] = ()
    fenced_errors: tuple[str, ...] = ()
    control_errors: tuple[str, ...] = ()
    scenario_calls: list[RunConfig] = field(default_factory=list)
    control_calls: list[tuple[RunConfig, Path]] = field(default_factory=list)

    def run_scenario(
        self, config: RunConfig, out: Path, *, progress: Progress | None = None
    ) -> ScenarioResult:
        self.scenario_calls.append(config)
        fenced = outcome(
            "fenced", out / "fenced", config.seed, *self.fenced, errors=self.fenced_errors
        )
        control = None
        if config.control:
            kinds = self.controls.pop(0)
            control = outcome(
                "control", out / "control", config.seed, *kinds, errors=self.control_errors
            )
        return ScenarioResult(config, SCENARIOS[config.scenario], fenced, control)

    def run_control(
        self, config: RunConfig, workdir: Path, *, progress: Progress | None = None
    ) -> RunOutcome:
        self.control_calls.append((config, workdir))
        assert not workdir.exists(), "a re-run control must get a fresh directory"
        return outcome("control", workdir, config.seed, *self.controls.pop(0))


def cell_with(runs: FakeRuns, tmp_path: Path, config: RunConfig = CONFIG) -> Cell:
    return run_cell(
        config,
        tmp_path / "cell",
        scenario_runner=runs.run_scenario,
        control_runner=runs.run_control,
    )


def test_a_control_flagged_at_once_is_not_run_again(tmp_path: Path) -> None:
    runs = FakeRuns(controls=[(STALE,)])
    cell = cell_with(runs, tmp_path)
    assert cell.result.passed
    assert runs.control_calls == []
    assert [(a.seed, a.flagged) for a in cell.controls] == [(1, True)]
    assert cell.control_reruns == 0
    assert "no control re-run" in matrix_table([cell])


def test_a_control_that_caught_nothing_is_run_again_with_a_fresh_seed(tmp_path: Path) -> None:
    runs = FakeRuns(controls=[(), (STALE,)])
    cell = cell_with(runs, tmp_path)
    assert cell.result.passed
    # Once more, the same cell but for the seed, into the cell's control/ directory.
    assert runs.control_calls == [(replace(CONFIG, seed=1001), tmp_path / "cell" / "control")]
    assert len(runs.scenario_calls) == 1  # the fenced run ran once
    assert [(a.seed, a.flagged) for a in cell.controls] == [(1, False), (1001, True)]
    assert cell.controls[0].out == tmp_path / "cell" / "control-try1"
    assert (tmp_path / "cell" / "control-try1").is_dir()  # the weak attempt is kept
    assert cell.controls[1].counts == {STALE: 1}
    assert cell.result.control is not None and cell.result.control_flagged
    assert cell_row(cell)["tries"] == "2"
    table = matrix_table([cell])
    assert "tries" in table.splitlines()[0].split()
    assert "PASS: 1 of 1 cells passed" in table
    assert "1 control re-run (1 extra run)" in table
    data = json.loads((tmp_path / "cell" / "result.json").read_text())
    assert data["runs"]["control"]["seed"] == 1001  # the report is the deciding control's


def test_a_control_that_never_catches_anything_fails_after_the_last_attempt(
    tmp_path: Path,
) -> None:
    runs = FakeRuns(controls=[()] * CONTROL_ATTEMPTS)
    cell = cell_with(runs, tmp_path)
    assert not cell.result.passed
    assert [a.seed for a in cell.controls] == [control_seed(1, n) for n in range(3)]
    assert [a.seed for a in cell.controls] == [1, 1001, 2001]
    assert not any(a.flagged for a in cell.controls)
    assert sorted(p.name for p in (tmp_path / "cell").iterdir() if p.is_dir()) == [
        "control",
        "control-try1",
        "control-try2",
        "fenced",
    ]
    table = matrix_table([cell])
    assert "FAIL: 0 of 1 cells passed" in table
    assert "caught nothing" in table or "CAUGHT NOTHING" in table
    assert "(control runs: 3)" in table


@pytest.mark.parametrize(
    "runs",
    [
        # An invalid fenced run fails its cell, whatever a control would show.
        FakeRuns(controls=[(), (STALE,)], fenced=(STALE,)),
        # A harness failure is a bug to see, not chance to retry: in either run.
        FakeRuns(controls=[(), (STALE,)], fenced_errors=("fault schedule failed: boom",)),
        FakeRuns(controls=[(), (STALE,)], control_errors=("clients still running",)),
    ],
    ids=["invalid-fenced-run", "harness-error-fenced", "harness-error-control"],
)
def test_no_control_is_run_again_to_hide_a_failure(tmp_path: Path, runs: FakeRuns) -> None:
    cell = cell_with(runs, tmp_path)
    assert not cell.result.passed
    assert runs.control_calls == []
    assert len(cell.controls) == 1


def test_a_control_of_an_unexpected_kind_counts_as_caught_nothing(tmp_path: Path) -> None:
    # pause-worker expects stale-write-accepted or lost-update; a duplicate token alone
    # does not show this scenario's violation.
    runs = FakeRuns(controls=[(ViolationKind.DUPLICATE_TOKEN.value,), (STALE,)])
    cell = cell_with(runs, tmp_path)
    assert cell.result.passed
    assert [a.flagged for a in cell.controls] == [False, True]


def test_without_controls_nothing_is_retried(tmp_path: Path) -> None:
    runs = FakeRuns(controls=[])
    cell = cell_with(runs, tmp_path, replace(CONFIG, control=False))
    assert cell.controls == ()
    assert cell_row(cell)["tries"] == "-"


def test_matrix_json_lists_every_control_attempt(tmp_path: Path) -> None:
    runs = FakeRuns(controls=[(STALE,), (), (), ()])
    configs = [CONFIG, replace(CONFIG, backend="sqlite")]
    done = run_matrix(
        configs,
        tmp_path,
        scenario_runner=runs.run_scenario,
        control_runner=runs.run_control,
    )
    assert [c.result.passed for c in done] == [True, False]
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["passed"] is False
    assert data["control_attempts_max"] == CONTROL_ATTEMPTS
    assert data["control_reruns"] == 2
    first, second = data["cells"]
    assert first["tries"] == "1"
    assert [a["seed"] for a in first["control_attempts"]] == [1]
    assert [(a["seed"], a["flagged"]) for a in second["control_attempts"]] == [
        (1, False),
        (1001, False),
        (2001, False),
    ]
    assert second["control_attempts"][0]["out"].endswith("control-try1")
    assert "1 control re-run (2 extra runs)" in matrix_table(done)
