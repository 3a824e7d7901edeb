"""The matrix: every scenario on every backend in every fence mode it applies to.

:func:`cells` lists the runs (each a :class:`~chaos.scenarios.RunConfig` with its
control), :func:`run_matrix` runs them one after another, each on fresh servers
in its own directory, and :func:`matrix_table` prints one verdict per cell. A cell
passes when its fenced run is valid and its control was flagged; findings (the
monotonic window's lost updates, see :mod:`chaos.checker`) are shown, never
failures. The matrix passes when every cell does.

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

from chaos.report import write_report
from chaos.scenarios import (
    SCENARIOS,
    SHARED_BACKEND_MODES,
    Progress,
    RunConfig,
    ScenarioResult,
    available_modes,
    keeps_event_log,
    run_scenario,
)

BACKENDS: Final = ("sqlite", "postgres", "redis")
MODES: Final = ("monotonic", "promise", "watch", "strict")

SHORT: Final = (
    ("lock-counter", "sqlite", "monotonic"),
    ("lock-counter", "postgres", "watch"),
    ("lock-counter", "redis", "strict"),
    ("pause-worker", "sqlite", "promise"),
)
"""(scenario, backend, mode) cells of ``--short``, as far as this build has them."""


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
class Cell:
    """One run of the matrix: its result and how long it took (both runs)."""

    config: RunConfig
    result: ScenarioResult
    seconds: float
    out: Path


def run_matrix(
    configs: Sequence[RunConfig],
    out_dir: Path,
    *,
    progress: Progress | None = None,
    on_cell: Callable[[Cell], None] | None = None,
) -> list[Cell]:
    """Run every config (fenced and control) in ``out_dir/<scenario>-<backend>-<mode>/``."""
    done: list[Cell] = []
    for config in configs:
        out = out_dir / f"{config.scenario}-{config.backend}-{config.fence_mode}"
        began = time.monotonic()
        result = run_scenario(config, out, progress=progress)
        write_report(result, out)
        cell = Cell(config, result, time.monotonic() - began, out)
        done.append(cell)
        if on_cell is not None:
            on_cell(cell)
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
        f"passed in {total:.0f} s"
    )
    for c in failed:
        lines.append(
            f"  {c.config.scenario} on {c.config.backend} ({c.config.fence_mode}): "
            + "; ".join(c.result.problems)
            + f" [{c.out}]"
        )
    return "\n".join(lines)


def matrix_json(done: Sequence[Cell]) -> dict[str, Any]:
    return {
        "passed": all(c.result.passed for c in done),
        "seconds": round(sum(c.seconds for c in done), 1),
        "cells": [
            {
                **cell_row(c),
                "problems": c.result.problems,
                "findings": dict(c.result.fenced.result.finding_counts()),
                "out": str(c.out),
            }
            for c in done
        ],
    }


__all__ = [
    "BACKENDS",
    "MODES",
    "SHORT",
    "Cell",
    "applies",
    "cell_row",
    "cells",
    "matrix_json",
    "matrix_table",
    "run_matrix",
]
