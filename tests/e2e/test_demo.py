"""The demo story with real processes and SIGSTOP, and its control with fencing off."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def run_demo(*extra: str) -> tuple[int, str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "fencing", "demo", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=90,
    )
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, proc.stdout, outcome


def test_paused_former_owner_is_rejected() -> None:
    code, out, outcome = run_demo()
    assert code == 0, out
    assert outcome["ok"] is True
    late = outcome["late"]
    assert isinstance(late, dict)
    assert late["event"] == "rejected"
    assert late["reason"] == "STALE_TOKEN"
    assert late["token"] == 1
    assert late["current_token"] == 2
    assert outcome["final_value"] == "B: 200"
    assert outcome["final_token"] == 2
    assert "SIGSTOP worker-A" in out


def test_control_without_fencing_shows_the_stale_write_landing() -> None:
    code, out, outcome = run_demo("--fence-mode", "off")
    assert code == 1, out
    assert outcome["ok"] is False
    late = outcome["late"]
    assert isinstance(late, dict)
    assert late["event"] == "wrote"
    assert outcome["final_value"] == "A: 150"
    assert outcome["final_token"] == 1
    assert "VIOLATION" in out
