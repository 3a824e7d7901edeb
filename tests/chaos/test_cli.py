"""``fencing chaos``: list, argument errors, the matrix's cells, one short run writing its
report, and the short matrix CI runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaos.matrix import BACKENDS, applies, cells
from chaos.scenarios import (
    JOB_BACKENDS,
    JOB_MODES,
    SCENARIOS,
    SHARED_BACKEND_MODES,
    available_modes,
    keeps_event_log,
)
from fencingctl import main


def test_list_names_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(SCENARIOS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "no-such-thing"], "unknown scenario"),
        (["--scenario", "pause-holder", "--fence-mode", "strict"], "needs --backend"),
        (["--scenario", "pause-holder", "--fence-mode", "sideways"], "not available"),
    ],
)
def test_bad_arguments_exit_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["chaos", "run", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "fenced").exists()


@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_a_run_prints_the_verdict_and_writes_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["chaos", "run", "--scenario", "pause-holder", "--duration", "4"]
    argv += ["--no-control", "--quiet", "--out", str(tmp_path), "--seed", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^fenced\s+monotonic\s+yes\s", out, re.MULTILINE)
    assert "PASS (no control run" in out
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["passed"] is True
    assert set(data["runs"]) == {"fenced"}
    assert data["runs"]["fenced"]["faults"][0]["kind"] == "pause"
    page = (tmp_path / "timeline.html").read_text()
    assert "<svg" in page
    assert "pause c" in page
    assert main(["chaos", "report", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--short"], "--short goes with --matrix"),
        ([], "give --scenario NAME, or --matrix"),
        (["--matrix", "--backend", "sqlite", "--fence-mode", "strict"], "no cell"),
        (["--matrix", "--scenario", "pause-worker", "--backend", "redis"], "no cell"),
        (["--matrix", "--fence-mode", "sideways"], "not available"),
    ],
)
def test_bad_matrix_arguments_exit_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["chaos", "run", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_matrix_holds_every_cell_that_applies_and_only_those() -> None:
    full = [(c.scenario, c.backend, c.fence_mode) for c in cells()]
    assert len(full) == len(set(full))
    assert all(applies(*cell) for cell in full)
    assert {s for s, _, _ in full} == set(SCENARIOS)
    assert not [c for c in full if c[1] == "sqlite" and c[2] in SHARED_BACKEND_MODES]
    assert not [c for c in full if c[2] == "watch" and not keeps_event_log(c[1])]
    jobs = {(b, m) for s, b, m in full if s == "pause-worker"}
    assert {b for b, _ in jobs} <= set(JOB_BACKENDS)
    assert {m for _, m in jobs} == set(JOB_MODES) & set(available_modes())
    # Every backend and every mode the build has is in the matrix.
    assert {b for _, b, _ in full} == set(BACKENDS)
    assert {m for _, _, m in full} == set(available_modes())
    short = [(c.scenario, c.backend, c.fence_mode) for c in cells(short=True)]
    assert short and set(short) <= set(full)
    assert {b for _, b, _ in short} == set(BACKENDS)
    only = cells(scenarios=["lock-counter"], backends=["postgres"])
    assert {(c.scenario, c.backend) for c in only} == {("lock-counter", "postgres")}


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_the_short_matrix_passes_and_prints_one_verdict_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["chaos", "run", "--matrix", "--short", "--quiet", "--out", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.split(" ", 1)[0] in SCENARIOS]
    assert len(rows) == len(cells(short=True)), out
    assert all(re.search(r"\svalid\s", r) and "flagged:" in r for r in rows), out
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["passed"] is True
    assert len(data["cells"]) == len(rows)
    for cell in data["cells"]:
        assert (Path(cell["out"]) / "timeline.html").exists()
