"""The matrix: every scenario on every backend in every fence mode it applies to.

:func:`cells` lists the runs (each a :class:`~chaos.scenarios.RunConfig` with its
control), :func:`run_matrix` runs them one after another, each on fresh servers
in its own directory, and :func:`matrix_table` prints one verdict per cell. A cell
passes when its fenced run is valid and its control was flagged; findings (the
monotonic window's lost updates, see :mod:`chaos.checker`) are shown, never
failures. The matrix passes when every cell does.

A control shows that the scenario *can* produce the violation; whether one run of a
few seconds does is partly chance (where a fault strikes, how a loaded machine
schedules the processes). So a control that ran cleanly and caught nothing is run
again with a fresh seed (:func:`control_seed`), up to :data:`CONTROL_ATTEMPTS` runs
in all, and the cell passes if one of them was flagged. Each attempt is listed (the
table's ``tries`` column, ``control_attempts`` in ``matrix.json``; the weak ones
stay on disk as ``control-try<N>/``). The fenced run is never re-run: a violation
in it, or a harness failure in either run, fails the cell at once
(:func:`control_retry_allowed`).

:data:`SHORT` is the subset CI runs: every backend and every mode at least once,
the read-modify-write scenarios first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from chaos import cluster
from chaos.report import write_report
from chaos.scenarios import (
    SCENARIOS,
    SHARED_BACKEND_MODES,
    Progress,
    RunConfig,
    RunOutcome,
    ScenarioResult,
    available_modes,
    keeps_event_log,
    run_control,
    run_scenario,
)

BACKENDS: Final = cluster.BACKENDS
MODES: Final = ("monotonic", "promise", "watch", "strict")

SHORT: Final = (
    ("lock-counter", "sqlite", "monotonic"),
    ("lock-counter", "postgres", "watch"),
    ("lock-counter", "redis", "strict"),
    ("pause-worker", "sqlite", "promise"),
)
"""(scenario, backend, mode) cells of ``--short``, as far as this build has them."""

CONTROL_ATTEMPTS: Final = 3
"""Control runs a cell may use: the first, with the cell's seed, and at most two more,
each with a fresh seed, while none was flagged."""

CONTROL_SEED_STRIDE: Final = 1000
"""Attempt ``n`` (0 = the first) of a control runs with seed ``seed + n * 1000``: new
fault timings and client choices, and reproducible (``--seed 1001``)."""


def control_seed(seed: int, attempt: int) -> int:
    """The seed of control attempt ``attempt`` (0 = the first) of a cell seeded ``seed``."""
    return seed + attempt * CONTROL_SEED_STRIDE


def control_retry_allowed(result: ScenarioResult) -> bool:
    """Whether the matrix may run ``result``'s control again: only when the control ran
    cleanly and caught nothing, and the fenced run is valid and ran cleanly.

    An invalid fenced run is a failure whatever its control shows, and a harness
    failure (a server that would not start, a schedule that raised) is a bug to see,
    not bad luck to retry.
    """
    control = result.control
    return (
        control is not None
        and not result.control_flagged
        and not control.errors
        and result.fenced.valid
        and not result.fenced.errors
    )


def applies(scenario: str, backend: str, mode: str) -> bool:
    """Whether ``scenario`` runs on ``backend`` in ``mode`` in this build."""
    s = SCENARIOS[scenario]
    if backend not in s.backends or (s.modes is not None and mode not in s.modes):
        return False
    if mode not in available_modes():
        return False
    if mode in SHARED_BACKEND_MODES and backend == "sqlite":
        return False
    return not (mode == "watch" and not keeps_event_log(backend))


def cells(
    *,
    short: bool = False,
    scenarios: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    base: RunConfig | None = None,
) -> list[RunConfig]:
    """The matrix's runs in order: all that apply, or the :data:`SHORT` ones; optionally
    only those scenarios, backends and modes. ``base`` supplies clients, resources,
    duration, seed and whether to run the controls."""
    base = base or RunConfig(scenario="")
    keep_s = set(scenarios) if scenarios is not None else None
    keep_b = set(backends) if backends is not None else None
    keep_m = set(modes) if modes is not None else None
    grid = list(SHORT) if short else [(s, b, m) for s in SCENARIOS for b in BACKENDS for m in MODES]
    return [
        replace(base, scenario=s, backend=b, fence_mode=m)
        for s, b, m in grid
        if (keep_s is None or s in keep_s)
        and (keep_b is None or b in keep_b)
        and (keep_m is None or m in keep_m)
        and applies(s, b, m)
    ]


@dataclass(frozen=True, slots=True)
class ControlAttempt:
    """One control run of a cell: its seed, whether it was flagged, where it lies."""

    seed: int
    flagged: bool
    counts: dict[str, int]
    """Violations per rule (only rules broken)."""
    out: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "flagged": self.flagged,
            "violations": self.counts,
            "out": str(self.out),
        }


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell of the matrix: its result (with the deciding control), how long it took
    (every run), where it lies, and each control attempt in order."""

    config: RunConfig
    result: ScenarioResult
    seconds: float
    out: Path
    controls: tuple[ControlAttempt, ...] = ()

    @property
    def control_reruns(self) -> int:
        """Control runs beyond the first."""
        return max(0, len(self.controls) - 1)


RunScenario = Callable[..., ScenarioResult]
"""``run_scenario(config, out_dir, progress=...)``, as :func:`chaos.scenarios.run_scenario`."""

RunControl = Callable[..., RunOutcome]
"""``run_control(config, workdir, progress=...)``, as :func:`chaos.scenarios.run_control`."""


def _attempt(result: ScenarioResult, seed: int, out: Path) -> ControlAttempt:
    assert result.control is not None
    counts = {k: n for k, n in result.control.result.counts().items() if n}
    return ControlAttempt(seed, result.control_flagged, counts, out)


def run_cell(
    config: RunConfig,
    out: Path,
    *,
    progress: Progress | None = None,
    attempts: int = CONTROL_ATTEMPTS,
    scenario_runner: RunScenario = run_scenario,
    control_runner: RunControl = run_control,
) -> Cell:
    """Run one cell in ``out``: the scenario and its control, then the control again with
    a fresh seed while :func:`control_retry_allowed`, up to ``attempts`` control runs.

    The deciding control (the flagged one, or the last) is the cell's ``control/``; a
    weak attempt before it is kept as ``control-try<N>/`` (N from 1).
    """
    began = time.monotonic()
    result = scenario_runner(config, out, progress=progress)
    controls: list[ControlAttempt] = []
    if result.control is not None:
        controls.append(_attempt(result, config.seed, out / "control"))
    while control_retry_allowed(result) and len(controls) < attempts:
        n = len(controls)
        kept = out / f"control-try{n}"
        if (out / "control").exists():
            (out / "control").rename(kept)
        controls[-1] = replace(controls[-1], out=kept)
        seed = control_seed(config.seed, n)
        control = control_runner(replace(config, seed=seed), out / "control", progress=progress)
        result = replace(result, control=control)
        controls.append(_attempt(result, seed, out / "control"))
    write_report(result, out)
    return Cell(config, result, time.monotonic() - began, out, tuple(controls))


def run_matrix(
    configs: Sequence[RunConfig],
    out_dir: Path,
    *,
    progress: Progress | None = None,
    on_cell: Callable[[Cell], None] | None = None,
    attempts: int = CONTROL_ATTEMPTS,
    scenario_runner: RunScenario = run_scenario,
    control_runner: RunControl = run_control,
) -> list[Cell]:
    """Run every cell (see :func:`run_cell`) in ``out_dir/<scenario>-<backend>-<mode>/``
    and write ``out_dir/matrix.json``."""
    done: list[Cell] = []
    for config in configs:
        out = out_dir / f"{config.scenario}-{config.backend}-{config.fence_mode}"
        cell = run_cell(
            config,
            out,
            progress=progress,
            attempts=attempts,
            scenario_runner=scenario_runner,
            control_runner=control_runner,
        )
        done.append(cell)
        if on_cell is not None:
            on_cell(cell)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "matrix.json").write_text(json.dumps(matrix_json(done), indent=2) + "\n")
    return done


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={n}" for k, n in sorted(counts.items()) if n) or "none"


def cell_row(cell: Cell) -> dict[str, str]:
    """The columns of :func:`matrix_table` for one cell."""
    r = cell.result
    fenced = r.fenced.result
    findings = dict(fenced.finding_counts())
    if r.control is None:
        control = "not run"
    elif r.control_flagged:
        control = "flagged: " + _kinds(r.control.result.counts())
    else:
        control = "CAUGHT NOTHING"
    return {
        "scenario": cell.config.scenario,
        "backend": cell.config.backend,
        "mode": cell.config.fence_mode,
        "fenced": "valid" if r.fenced.valid else "INVALID: " + _kinds(fenced.counts()),
        "findings": _kinds(findings),
        "control": control,
        "tries": str(len(cell.controls)) if cell.controls else "-",
        "verdict": "PASS" if r.passed else "FAIL",
        "s": f"{cell.seconds:.0f}",
    }


def matrix_table(done: Sequence[Cell]) -> str:
    """One line per cell, then a summary line."""
    rows = [cell_row(c) for c in done]
    if not rows:
        return "no cell of the matrix applies"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    failed = [c for c in done if not c.result.passed]
    total = sum(c.seconds for c in done)
    lines.append(
        f"{'PASS' if not failed else 'FAIL'}: {len(done) - len(failed)} of {len(done)} cells "
        f"passed in {total:.0f} s; {rerun_summary(done)}"
    )
    for c in failed:
        tries = f" (control runs: {len(c.controls)})" if c.control_reruns else ""
        lines.append(
            f"  {c.config.scenario} on {c.config.backend} ({c.config.fence_mode}): "
            + "; ".join(c.result.problems)
            + tries
            + f" [{c.out}]"
        )
    return "\n".join(lines)


def rerun_summary(done: Sequence[Cell]) -> str:
    """How many controls were run again, e.g. ``2 controls re-run (3 extra runs)``."""
    cells_rerun = [c for c in done if c.control_reruns]
    if not cells_rerun:
        return "no control re-run"
    extra = sum(c.control_reruns for c in cells_rerun)
    noun = "control" if len(cells_rerun) == 1 else "controls"
    runs = "run" if extra == 1 else "runs"
    return f"{len(cells_rerun)} {noun} re-run ({extra} extra {runs})"


def matrix_json(done: Sequence[Cell]) -> dict[str, Any]:
    return {
        "passed": all(c.result.passed for c in done),
        "seconds": round(sum(c.seconds for c in done), 1),
        "control_attempts_max": CONTROL_ATTEMPTS,
        "control_reruns": sum(c.control_reruns for c in done),
        "cells": [
            {
                **cell_row(c),
                "problems": c.result.problems,
                "findings": dict(c.result.fenced.result.finding_counts()),
                "control_attempts": [a.to_json() for a in c.controls],
                "out": str(c.out),
            }
            for c in done
        ],
    }


__all__ = [
    "BACKENDS",
    "CONTROL_ATTEMPTS",
    "CONTROL_SEED_STRIDE",
    "MODES",
    "SHORT",
    "Cell",
    "ControlAttempt",
    "applies",
    "cell_row",
    "cells",
    "control_retry_allowed",
    "control_seed",
    "matrix_json",
    "matrix_table",
    "rerun_summary",
    "run_cell",
    "run_matrix",
]
