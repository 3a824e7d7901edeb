"""Run the test suite on a busy machine: CPU hogs beside it, several runs in a row.

    python scripts/test_under_load.py                    # 1 hog, 3 runs of the README's command
    python scripts/test_under_load.py --hogs 2 --runs 1 -- tests/e2e   # pytest args after --

A test that passes on an idle machine and fails on a loaded one is waiting on time,
not on the condition it means: CI machines are shared, so such a test fails some run
sooner or later. This keeps ``--hogs`` processes spinning (each takes a core) while the
suite runs ``--runs`` times (``python -m pytest -q -m ""`` unless arguments follow
``--``), prints each run's summary line, and exits 1 if any run failed. Opt-in: it
takes the suite's time times ``--runs``, longer under the hogs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:  # pragma: no cover - runs in the hog processes
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (
        (args_in[: args_in.index("--")], args_in[args_in.index("--") + 1 :])
        if "--" in args_in
        else (args_in, [])
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=1, help="busy processes beside the suite")
    parser.add_argument("--runs", type=int, default=3, help="runs of the suite in a row")
    args = parser.parse_args(ours)
    if args.hogs < 0 or args.runs < 1:
        parser.error("--hogs must be >= 0 and --runs >= 1")
    command = [sys.executable, "-m", "pytest", "-q", "-m", "", *pytest_args]
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            lines = done.stdout.strip().splitlines()
            summary = lines[-1] if lines else "(no output)"
            print(
                f"run {run}/{args.runs}: exit {done.returncode} in "
                f"{time.monotonic() - started:.0f} s: {summary}",
                flush=True,
            )
            if done.returncode != 0:
                failed += 1
                for line in lines:
                    if line.startswith(("FAILED", "ERROR")):
                        print(f"  {line}", flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
