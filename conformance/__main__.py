"""Run every scenario on every SDK's driver against real servers; print a Markdown table.

    python -m conformance [--only NAME] [--driver python-sync|python-asyncio|typescript]

Starts a lease server, a guard and a guard with fencing off (the controls' guard) as
``python -m`` processes on free ports, SQLite in a temporary directory. Each scenario
(``conformance/scenarios/*.json``) runs on each driver twice: as written (must pass)
and as its control, the same steps with the rule broken (``unfenced``: writes go to the
guard with fencing off; ``no_renew``: ``hold`` acquires without renewals; ``no_release``:
``hold`` does not release on exit; and the others in conformance/README.md), which must
fail (a control run that passes is run once more: some violations are races the broken
rule only usually loses): a control that passes twice means the scenario would not catch
the violation. The TypeScript driver needs the SDK built
(``npm run build`` in clients/typescript). Exit status 1 unless every cell is PASS with
its control flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

from conformance.faults import fault_proxy

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DRIVERS: dict[str, list[str]] = {
    "python-sync": [sys.executable, "-m", "conformance.drivers.python_sync"],
    "python-asyncio": [sys.executable, "-m", "conformance.drivers.python_async"],
    "typescript": ["node", str(ROOT / "conformance" / "drivers" / "typescript.mjs")],
}
#: Seconds one driver run may take before it counts as failed (a hung driver).
RUN_TIMEOUT = 60.0
START_TIMEOUT = 60.0


@contextmanager
def server(module: str, *args: str) -> Iterator[str]:
    """``python -m module --listen 127.0.0.1:0 ARGS``; yields its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"{module} did not start: {line!r}")
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.kill()
        proc.wait(START_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


def run_one(driver: str, scenario: Path, knob: str, env: dict[str, str]) -> tuple[bool, str]:
    """One driver run: (passed, why it did not). A scenario that acts on the link gets a
    fault proxy of its own in front of the lease server for this run."""
    run_env = {**env, "CONFORMANCE_PREFIX": f"conf-{uuid.uuid4().hex[:12]}"}
    if not json.loads(scenario.read_text()).get("lease_via_fault_proxy"):
        return _run(driver, scenario, knob, run_env)
    with fault_proxy(env["CONFORMANCE_LEASE"]) as (proxy, control):
        return _run(
            driver,
            scenario,
            knob,
            {**run_env, "CONFORMANCE_LEASE": proxy, "CONFORMANCE_FAULTS": control},
        )


def run_control(driver: str, scenario: Path, knob: str, env: dict[str, str]) -> tuple[bool, str]:
    """The scenario's control: a run that passes is run once more. Some violations are
    races the broken rule loses only most of the time (a polling acquire may still ask
    in the instant the resource is free): the control is flagged if either run shows it."""
    passed, why = run_one(driver, scenario, knob, env)
    if passed:
        passed, why = run_one(driver, scenario, knob, env)
    return passed, why


def _run(driver: str, scenario: Path, knob: str, run_env: dict[str, str]) -> tuple[bool, str]:
    cmd = [*DRIVERS[driver], str(scenario), *([knob] if knob else [])]
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return False, "timed out"
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            verdict = json.loads(line)
            return bool(verdict["ok"]), str(verdict.get("why", ""))
    return False, f"no verdict (exit {out.returncode}): {out.stderr.strip()[-300:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only scenarios whose file name contains this")
    parser.add_argument("--driver", action="append", choices=sorted(DRIVERS))
    parser.add_argument("--jobs", type=int, default=3, help="driver runs at once")
    args = parser.parse_args()
    drivers = args.driver or list(DRIVERS)
    scenarios = sorted(p for p in SCENARIOS.glob("*.json") if not args.only or args.only in p.name)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        lease = stack.enter_context(server("lease_server", "--backend", f"sqlite:{tmp / 'l.db'}"))
        guard = stack.enter_context(server("guard", "--store", f"sqlite:{tmp / 'g.db'}"))
        unfenced = stack.enter_context(
            server("guard", "--store", f"sqlite:{tmp / 'u.db'}", "--fence-mode", "off")
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CONFORMANCE_LEASE": lease,
            "CONFORMANCE_GUARD": guard,
            "CONFORMANCE_UNFENCED": unfenced,
        }
        jobs = []
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for scenario in scenarios:
                knob = json.loads(scenario.read_text())["control"]["knob"]
                for driver in drivers:
                    jobs.append(
                        (
                            scenario,
                            driver,
                            pool.submit(run_one, driver, scenario, "", env),
                            pool.submit(run_control, driver, scenario, knob, env),
                        )
                    )
            results = {(s, d): (r.result(), c.result()) for s, d, r, c in jobs}
    failed = False
    print("| scenario | control | " + " | ".join(drivers) + " |")
    print("|---|---|" + "---|" * len(drivers))
    notes: list[str] = []
    for scenario in scenarios:
        data = json.loads(scenario.read_text())
        cells = []
        for driver in drivers:
            (ok, why), (control_ok, control_why) = results[(scenario, driver)]
            # A control is flagged only by the violation itself (an expectation not met),
            # never by a driver that crashed.
            flagged = not control_ok and control_why.startswith("Mismatch")
            cell = ("PASS" if ok else "FAIL") + (
                ", control flagged" if flagged else ", control NOT flagged"
            )
            if not ok or not flagged:
                failed = True
                notes.append(
                    f"- {scenario.stem} on {driver}: {why or control_why or 'control passed'}"
                )
            cells.append(cell)
        print(f"| {data['name']} | {data['control']['knob']} | " + " | ".join(cells) + " |")
    if notes:
        print("\n" + "\n".join(notes))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
