"""``fencing chaos``: list, argument errors, and one short run writing its report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaos.scenarios import SCENARIOS
from fencing.cli import main


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
