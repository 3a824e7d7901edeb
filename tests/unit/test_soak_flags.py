"""``fencing chaos soak``'s client counts reach the soak: hold_many sessions and election
candidates are set (or turned off) like the other workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chaos.soak
from fencingctl import main


def test_the_workload_counts_reach_the_soak(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[chaos.soak.SoakConfig] = []

    def run_soak(config: chaos.soak.SoakConfig, out: Path, **kw: Any) -> Any:
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(chaos.soak, "run_soak", run_soak)
    # The command's SIGTERM handler is the soak process's, not this test run's.
    monkeypatch.setattr("fencingctl.chaos._unwind_on_sigterm", lambda: None)
    argv = ["chaos", "soak", "--duration", "10s", "--out", str(tmp_path), "--quiet"]
    with pytest.raises(SystemExit):
        main([*argv, "--many-clients", "3", "--candidates", "0", "--workers", "1"])
    with pytest.raises(SystemExit):
        main(argv)
    assert [(c.many_clients, c.candidates, c.workers) for c in seen] == [(3, 0, 1), (2, 2, 2)]


def test_a_negative_count_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["chaos", "soak", "--candidates", "-1"])
    assert exit_.value.code == 2
    assert "--candidates" in capsys.readouterr().err


def test_resource_names_rotate_by_epoch_on_the_shared_clock() -> None:
    from chaos.workload import in_epoch

    assert in_epoch("r0", 300.0, now=599.9) == "r0.e1"
    assert in_epoch("r0", 300.0, now=600.0) == "r0.e2"
    assert in_epoch("r0", 0.0, now=600.0) == "r0"  # off: the name as it is
