"""``fencing chaos``: run a fault scenario against real processes, with its unfenced control.

``fencing chaos run --scenario pause-holder`` starts a lease server and a guard
(SQLite, or a throwaway PostgreSQL or Redis), N client processes contending for M
resources through leases and guarded read-modify-writes, and injects the
scenario's faults while they run. Then it runs everything again with the guard's
fencing turned off (the control). Both histories are checked with the fence mode
under test: the fenced run must be valid and the control must show violations,
or the faults were too weak to prove anything. Prints a verdict table and writes
``result.json`` and ``timeline.html`` (open it in a browser) to ``--out``.

Exit status: 0 if the scenario passed, 1 if it failed, 2 for bad arguments.
``fencing chaos list`` names the scenarios. Needs a source checkout (the harness
runs ``python -m chaos.workload``); loopback only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "chaos",
        help="run a chaos scenario (faults on real processes) with its unfenced control",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chaos_sub = p.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    run = chaos_sub.add_parser("run", help="run one scenario and its control")
    run.add_argument("--scenario", required=True, help="see `fencing chaos list`")
    run.add_argument("--backend", choices=["sqlite", "postgres", "redis"], default="sqlite")
    run.add_argument(
        "--fence-mode",
        default="monotonic",
        help="the mode under test: monotonic (default), strict (postgres or redis), watch, "
        "promise (a monotonic guard and hold(fence=[guard])), as this build has them",
    )
    run.add_argument("--clients", type=_positive_int, default=4)
    run.add_argument("--resources", type=_positive_int, default=2)
    run.add_argument("--duration", type=_positive_float, default=10.0, help="seconds per run")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--no-control", action="store_true", help="skip the unfenced control run")
    run.add_argument("--out", type=Path, help="directory for results (default: a temp dir)")
    run.add_argument("--json", action="store_true", help="print result.json to stdout too")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.set_defaults(run=run_command)
    listing = chaos_sub.add_parser("list", help="list the scenarios")
    listing.set_defaults(run=list_command)
    report = chaos_sub.add_parser(
        "report", help="check a finished run's histories again and redraw its report"
    )
    report.add_argument("out", type=Path, help="the --out directory of a run")
    report.set_defaults(run=report_command)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def list_command(args: argparse.Namespace) -> int:
    from chaos.scenarios import SCENARIOS

    width = max(len(name) for name in SCENARIOS)
    for name, scenario in SCENARIOS.items():
        print(f"{name:<{width}}  {scenario.summary}")
    return 0


class _ProgressLine:
    """One status line on stderr, rewritten in place on a terminal, every 2 s otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self._shown = False

    def __call__(
        self, label: str, elapsed: float, duration: float, lines: int, faults: list[str]
    ) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self._last < 2.0:
            return
        self._last = now
        phase = "running" if elapsed <= duration else "stopping"
        text = (
            f"[{label}] {phase} {min(elapsed, duration):5.1f}/{duration:g} s  "
            f"events {lines}  faults: {', '.join(faults) or '-'}"
        )
        if self.tty:
            sys.stderr.write("\r\033[K" + text[:160])
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run_command(args: argparse.Namespace) -> int:
    import json

    from chaos.report import result_json, verdict_table, write_report
    from chaos.scenarios import SCENARIOS, RunConfig, run_scenario

    if args.scenario not in SCENARIOS:
        print(
            f"unknown scenario {args.scenario!r}; one of: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    out: Path = args.out or Path(tempfile.mkdtemp(prefix=f"fencing-chaos-{args.scenario}-"))
    config = RunConfig(
        scenario=args.scenario,
        backend=args.backend,
        fence_mode=args.fence_mode,
        clients=args.clients,
        resources=args.resources,
        duration=args.duration,
        seed=args.seed,
        control=not args.no_control,
    )
    progress = _ProgressLine(args.quiet)

    def on_term(signum: int, frame: object) -> None:
        # Unwind, so every process and proxy the harness started is stopped.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        result = run_scenario(config, out, progress=progress)
    except ValueError as exc:
        progress.done()
        print(f"fencing chaos: {exc}", file=sys.stderr)
        return 2
    progress.done()
    json_path, html_path = write_report(result, out)
    print(verdict_table(result))
    print(f"results: {json_path}\ntimeline: {html_path}")
    if args.json:
        print(json.dumps(result_json(result), indent=2))
    return 0 if result.passed else 1


def report_command(args: argparse.Namespace) -> int:
    from chaos.report import load_result, verdict_table, write_report

    try:
        result = load_result(args.out)
    except (OSError, KeyError, ValueError) as exc:
        print(f"fencing chaos report: cannot read {args.out}: {exc}", file=sys.stderr)
        return 2
    json_path, html_path = write_report(result, args.out)
    print(verdict_table(result))
    print(f"results: {json_path}\ntimeline: {html_path}")
    return 0 if result.passed else 1
