"""``fencing chaos``: run a fault scenario against real processes, with its unfenced control.

``fencing chaos run --scenario pause-holder`` starts a lease server and a guard
(SQLite, or a throwaway PostgreSQL or Redis), N client processes contending for M
resources through leases and guarded read-modify-writes, and injects the
scenario's faults while they run. Then it runs everything again with the guard's
fencing turned off (the control). Both histories are checked with the fence mode
under test: the fenced run must be valid and the control must show violations,
or the faults were too weak to prove anything. Prints a verdict table and writes
``result.json`` and ``timeline.html`` (open it in a browser) to ``--out``.

``fencing chaos run --matrix`` runs every scenario on every backend (SQLite,
PostgreSQL, Redis) in every fence mode (monotonic, promise, watch, strict) it
applies to, each with its control, and prints one verdict table; ``--short`` runs
the few cells CI runs. ``--scenario``, ``--backend`` and ``--fence-mode`` given
with ``--matrix`` keep only those cells.

Exit status: 0 if the scenario (every cell) passed, 1 if one failed (a fenced run
with a violation, or a control that caught nothing), 2 for bad arguments.
``fencing chaos soak --duration 30m`` runs every workload at once (lock-counter
clients, guarded writes with an idempotent effect log, queue workers) while a
seeded nemesis pauses and kills clients, lease servers, the guard and the
database and partitions clients; the checker judges the history during the run
and at the end, and every server's health (memory, descriptors, tasks, waiters,
streams, connections) is sampled: a metric still growing over the last half fails
the run. ``--control`` turns the guard's fencing off: that run must show
violations. Writes ``result.json`` and ``health.html`` (with ``plots/*.svg``).

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

from fencingctl import flags


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "chaos",
        help="run a chaos scenario (faults on real processes) with its unfenced control",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chaos_sub = p.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    run = chaos_sub.add_parser("run", help="run one scenario and its control, or the matrix")
    run.add_argument("--scenario", help="see `fencing chaos list`")
    run.add_argument("--backend", choices=["sqlite", "postgres", "redis"], help="default sqlite")
    run.add_argument(
        "--fence-mode",
        help="the mode under test: monotonic (default), strict (postgres or redis), watch, "
        "promise (a monotonic guard and hold(fence=[guard])), as this build has them",
    )
    run.add_argument(
        "--matrix",
        action="store_true",
        help="every scenario x backend x fence mode that applies, each with its control",
    )
    run.add_argument("--short", action="store_true", help="with --matrix: the cells CI runs")
    run.add_argument("--clients", type=flags.integer(1), default=4)
    run.add_argument("--resources", type=flags.integer(1), default=2)
    run.add_argument(
        "--duration",
        type=flags.duration(0.0, above=True),
        metavar="DURATION",
        help="how long each run takes: 10, 30s, 2m (default 10s; 6s with --matrix)",
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--no-control", action="store_true", help="skip the unfenced control run")
    run.add_argument("--out", type=Path, help="directory for results (default: a temp dir)")
    run.add_argument("--json", action="store_true", help="print result.json to stdout too")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.set_defaults(run=run_command)
    listing = chaos_sub.add_parser("list", help="list the scenarios")
    listing.set_defaults(run=list_command)
    report = chaos_sub.add_parser(
        "report", help="check a finished run's (or soak's) histories again and redraw its report"
    )
    report.add_argument("out", type=Path, help="the --out directory of a run or a soak")
    report.set_defaults(run=report_command)
    soak = chaos_sub.add_parser(
        "soak",
        help="every workload at once under a random nemesis, with checker and health watch",
    )
    soak.add_argument("--backend", choices=["sqlite", "postgres", "redis"], default="sqlite")
    soak.add_argument(
        "--fence-mode",
        default="monotonic",
        help="monotonic (default), promise, watch, strict (postgres or redis)",
    )
    soak.add_argument(
        "--duration",
        type=flags.duration(0.0, above=True),
        default=300.0,
        help="how long the clients run: seconds, or with a unit (90s, 30m, 2h); default 5m",
    )
    soak.add_argument("--seed", type=flags.integer(0), default=1)
    soak.add_argument(
        "--lease-servers",
        type=flags.integer(1),
        help="lease servers sharing the backend (default: 1 on sqlite, 2 otherwise)",
    )
    soak.add_argument(
        "--clients", type=flags.integer(1), default=3, help="lock-counter clients (default 3)"
    )
    soak.add_argument(
        "--effect-clients",
        type=flags.integer(0),
        default=2,
        help="counter + effect-log clients (default 2)",
    )
    soak.add_argument(
        "--workers",
        type=flags.integer(0),
        default=2,
        help="queue workers (sqlite, postgres; default 2)",
    )
    soak.add_argument(
        "--many-clients",
        type=flags.integer(0),
        default=2,
        help="clients holding several leases at once with hold_many (default 2)",
    )
    soak.add_argument(
        "--candidates",
        type=flags.integer(0),
        default=2,
        help="election candidates, one election per resource (default 2)",
    )
    soak.add_argument(
        "--sample-every",
        type=flags.duration(0.0, above=True),
        default=2.0,
        help="seconds between health samples (default 2)",
    )
    soak.add_argument("--no-faults", action="store_true", help="no nemesis (a baseline)")
    soak.add_argument(
        "--control",
        action="store_true",
        help="the guard's fencing off: the run must show violations (exit 1 when it does)",
    )
    # The health check's control: servers that keep one object per call (chaos.leaky).
    soak.add_argument("--leak", choices=["task", "fd", "memory"], help=argparse.SUPPRESS)
    soak.add_argument("--out", type=Path, help="directory for results (default: a temp dir)")
    soak.add_argument("--quiet", action="store_true", help="no progress lines")
    soak.set_defaults(run=soak_command)


def soak_command(args: argparse.Namespace) -> int:
    from chaos.soak import SoakConfig, run_soak, verdict_lines

    config = SoakConfig(
        backend=args.backend,
        fence_mode=args.fence_mode,
        duration=args.duration,
        seed=args.seed,
        counter_clients=args.clients,
        effect_clients=args.effect_clients,
        workers=args.workers,
        many_clients=args.many_clients,
        candidates=args.candidates,
        lease_servers=args.lease_servers or 0,
        sample_every=args.sample_every,
        faults=not args.no_faults,
        fencing=not args.control,
        leak=args.leak or "",
    )
    try:
        config.validate()
    except ValueError as exc:
        print(f"fencing chaos soak: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="fencing-chaos-soak-"))

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"[soak] {text}", file=sys.stderr, flush=True)

    _unwind_on_sigterm()
    result = run_soak(config, out, progress=progress)
    print("\n".join(verdict_lines(result)))
    print(f"results: {out / 'result.json'}\nhealth: {out / 'health.html'}")
    return 0 if result.passed else 1


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

    if args.scenario is not None and args.scenario not in SCENARIOS:
        print(
            f"unknown scenario {args.scenario!r}; one of: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    if args.short and not args.matrix:
        print("fencing chaos: --short goes with --matrix", file=sys.stderr)
        return 2
    if args.matrix:
        return _matrix_command(args)
    if args.scenario is None:
        print("fencing chaos: give --scenario NAME, or --matrix", file=sys.stderr)
        return 2
    out: Path = args.out or Path(tempfile.mkdtemp(prefix=f"fencing-chaos-{args.scenario}-"))
    config = RunConfig(
        scenario=args.scenario,
        backend=args.backend or "sqlite",
        fence_mode=args.fence_mode or "monotonic",
        clients=args.clients,
        resources=args.resources,
        duration=args.duration or 10.0,
        seed=args.seed,
        control=not args.no_control,
    )
    progress = _ProgressLine(args.quiet)
    _unwind_on_sigterm()
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


def _unwind_on_sigterm() -> None:
    def on_term(signum: int, frame: object) -> None:
        # Unwind, so every process and proxy the harness started is stopped.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def _matrix_command(args: argparse.Namespace) -> int:
    from chaos.matrix import Cell, cell_row, cells, matrix_table, run_matrix
    from chaos.scenarios import RunConfig, available_modes

    if args.fence_mode is not None and args.fence_mode not in available_modes():
        print(
            f"fencing chaos: fence mode {args.fence_mode!r} is not available here "
            f"(expected one of {available_modes()})",
            file=sys.stderr,
        )
        return 2
    base = RunConfig(
        scenario="",
        clients=args.clients,
        resources=args.resources,
        duration=args.duration or 6.0,
        seed=args.seed,
        control=not args.no_control,
    )
    todo = cells(
        short=args.short,
        scenarios=None if args.scenario is None else [args.scenario],
        backends=None if args.backend is None else [args.backend],
        modes=None if args.fence_mode is None else [args.fence_mode],
        base=base,
    )
    if not todo:
        print("fencing chaos: no cell of the matrix applies to that selection", file=sys.stderr)
        return 2
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="fencing-chaos-matrix-"))
    progress = _ProgressLine(args.quiet)
    _unwind_on_sigterm()

    def on_cell(cell: Cell) -> None:
        progress.done()
        if not args.quiet:
            row = cell_row(cell)
            print(
                f"[{len(done_so_far) + 1}/{len(todo)}] {row['scenario']} {row['backend']} "
                f"{row['mode']}: {row['verdict']} ({row['s']} s)",
                file=sys.stderr,
            )
        done_so_far.append(cell)

    done_so_far: list[Cell] = []
    done = run_matrix(todo, out, progress=progress, on_cell=on_cell)
    progress.done()
    print(matrix_table(done))
    print(f"results: {out / 'matrix.json'} (and one directory per cell)")
    return 0 if all(c.result.passed for c in done) else 1


def report_command(args: argparse.Namespace) -> int:
    from chaos.report import load_result, verdict_table, write_report

    if (args.out / "health.jsonl").exists():  # a soak's directory
        return _soak_report(args.out)

    try:
        result = load_result(args.out)
    except (OSError, KeyError, ValueError) as exc:
        print(f"fencing chaos report: cannot read {args.out}: {exc}", file=sys.stderr)
        return 2
    json_path, html_path = write_report(result, args.out)
    print(verdict_table(result))
    print(f"results: {json_path}\ntimeline: {html_path}")
    return 0 if result.passed else 1


def _soak_report(out: Path) -> int:
    from chaos.soak import rejudge, verdict_lines

    try:
        result = rejudge(out)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        print(f"fencing chaos report: cannot read the soak in {out}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict_lines(result)))
    print(f"results: {out / 'result.json'}\nhealth: {out / 'health.html'}")
    return 0 if result.passed else 1
