"""The demo story with real processes and SIGSTOP, and its control with fencing off."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def run_demo(*extra: str) -> tuple[int, str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "fencingctl", "demo", "--json", *extra],
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


def _story(text: str) -> list[str]:
    """The demo's lines without what varies run to run: timestamps and ports."""
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    lines = []
    for line in text.strip().splitlines():
        parts = line.split(None, 1)
        if parts and parts[0].endswith("s") and parts[0][:-1].replace(".", "").isdigit():
            line = parts[1] if len(parts) > 1 else ""
        lines.append(" ".join(line.split()))
    return [line for line in lines if line]


def test_the_readme_shows_the_demo_as_it_prints() -> None:
    """The README's sample output is the real one, line for line but for the times."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = readme[readme.index("pip install -e . && fencing demo\n```\n") :]
    opening = after.index("\n```\n", after.index("```\n")) + len("\n```\n")
    sample = after[opening : after.index("\n```", opening)]
    proc = subprocess.run(
        [sys.executable, "-m", "fencingctl", "demo"], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _story(sample) == _story(proc.stdout)
