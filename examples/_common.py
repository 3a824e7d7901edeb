"""What every example shares: the server addresses, its child processes, its verdicts.

Each example is one module that plays several roles: the main role (no ``--role``)
tells the story and judges it; other roles are the replicas, publishers or workers
it starts as real processes (``python -m examples.NAME --role ...``), which report
what they did as JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from fencing import QueueClient

ROOT = Path(__file__).resolve().parents[1]


def parser(doc: str | None, *, fencing_control: bool = False) -> argparse.ArgumentParser:
    """The flags every example takes: where ``fencing serve`` listens (the flags, else
    ``FENCING_LEASE_ADDR`` / ``FENCING_GUARD_ADDR``), and a run id;
    with ``fencing_control``, also ``--no-fencing`` (see :func:`unfenced_servers`)."""
    p = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The variables the fencing commands read, so an exported address serves both.
    lease = os.environ.get("FENCING_LEASE_ADDR") or "127.0.0.1:50051"
    guard = os.environ.get("FENCING_GUARD_ADDR") or "127.0.0.1:50052"
    p.add_argument(
        "--lease-addr", default=lease, help="lease server (and queue) (env FENCING_LEASE_ADDR)"
    )
    p.add_argument("--guard-addr", default=guard, help="guard (env FENCING_GUARD_ADDR)")
    p.add_argument("--ttl", type=float, default=1.0, help="lease/claim ttl in seconds")
    # Names are scoped by a run id, so runs against one long-lived server never meet.
    p.add_argument("--run", default=secrets.token_hex(3), help=argparse.SUPPRESS)
    p.add_argument("--role", default="main", help=argparse.SUPPRESS)
    if fencing_control:
        p.add_argument(
            "--no-fencing",
            action="store_true",
            help="control: run against a fencing serve of its own whose guard accepts every "
            "token (--fence-mode off), to show what fencing prevents",
        )
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments; in a child role, its SDK log lines named after the role."""
    args = p.parse_args()
    if args.role != "main":
        logging.basicConfig(format=f"{args.role:>12}  (log) %(message)s", level=logging.WARNING)
    return args


def unfenced_servers(args: argparse.Namespace, *serve_flags: str) -> None:
    """For ``--no-fencing``: start ``fencing serve --fence-mode off`` (ports of its own, a
    scratch data directory, killed at exit) and point ``args`` at it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencingctl", "serve", "--data-dir", str(scratch()),
         "--lease-listen", "127.0.0.1:0", "--guard-listen", "127.0.0.1:0",
         "--fence-mode", "off", *serve_flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    _servers.append(proc)
    assert proc.stdout is not None
    # The banner: "lease server listening on ADDR", then "guard listening on ADDR (...)".
    lease_line, guard_line = proc.stdout.readline(), proc.stdout.readline()
    if "listening on" not in lease_line:
        sys.exit(f"fencing serve --fence-mode off did not start: {lease_line!r}")
    args.lease_addr, args.guard_addr = lease_line.split()[-1], guard_line.split()[3]
    say("main", f"--no-fencing: lease server {args.lease_addr}, guard {args.guard_addr} "
        "with fencing off")  # fmt: skip


_emitting = threading.Lock()
_children: list[Child] = []
_servers: list[subprocess.Popen[str]] = []


def emit(**event: Any) -> None:
    """A child's report to the main role: one JSON line (whole, from any thread)."""
    with _emitting:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


@atexit.register
def _reap() -> None:
    """Children (and servers) never outlive the main role, whatever ended it."""
    for proc in [c.proc for c in _children] + _servers:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def say(who: str, text: str) -> None:
    print(f"{who:>12}  {text}", flush=True)


class Child:
    """A role of this example running as its own process; its JSON lines are events,
    kept in ``events`` and also put on ``inbox`` (which several children may share)."""

    def __init__(
        self,
        module: str,
        args: argparse.Namespace,
        role: str,
        *extra: str,
        inbox: Inbox | None = None,
    ) -> None:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        self.role = role
        self.events: list[dict[str, Any]] = []
        self.inbox = inbox or Inbox()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--role", role, "--run", args.run,
             "--ttl", str(args.ttl), "--lease-addr", args.lease_addr,
             "--guard-addr", args.guard_addr, *extra],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=path), cwd=ROOT,
        )  # fmt: skip
        _children.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.events.append(event)
                self.inbox.put((self, event))

    def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Wait for the process to end; all its events."""
        self.proc.wait(timeout)
        self._reader.join(timeout)
        return self.events

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


class Inbox:
    """The events of several children, in arrival order."""

    def __init__(self) -> None:
        self._arrivals: queue.Queue[tuple[Child, dict[str, Any]]] = queue.Queue()
        self._skipped: list[tuple[Child, dict[str, Any]]] = []

    def put(self, item: tuple[Child, dict[str, Any]]) -> None:
        self._arrivals.put(item)

    def expect(
        self, *kinds: str, timeout: float = 60, **fields: object
    ) -> tuple[Child, dict[str, Any]]:
        """The oldest event not yet expected of one of ``kinds`` with these ``fields``,
        waiting up to ``timeout`` seconds for it; with the child that sent it."""

        def wanted(event: dict[str, Any]) -> bool:
            return event.get("event") in kinds and all(event.get(k) == v for k, v in fields.items())

        for n, (child, event) in enumerate(self._skipped):
            if wanted(event):
                del self._skipped[n]
                return child, event
        deadline = time.monotonic() + timeout
        while True:
            try:
                child, event = self._arrivals.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {kinds} event with {fields} in {timeout} s") from None
            if wanted(event):
                return child, event
            self._skipped.append((child, event))


class Verdicts:
    """The example's claims, each printed with what showed it; exit 0 only if all held."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, claim: str, held: bool, shown_by: str) -> None:
        print(f"{'OK' if held else 'VIOLATED':>12}  {claim}: {shown_by}", flush=True)
        if not held:
            self.failed.append(claim)

    def exit(self) -> NoReturn:
        print()
        print("all claims held" if not self.failed else f"{len(self.failed)} claim(s) violated")
        sys.exit(1 if self.failed else 0)


_scratch: list[tempfile.TemporaryDirectory[str]] = []


def scratch() -> Path:
    """A directory for the example's own files (its app database, the broker's table),
    removed when the example exits."""
    _scratch.append(tempfile.TemporaryDirectory(prefix="fencing-example-"))
    return Path(_scratch[-1].name)


def wait_drained(queue: QueueClient, name: str, timeout: float = 60) -> None:
    """Until queue ``name`` has no job left to run (only succeeded and dead ones)."""
    deadline = time.monotonic() + timeout
    while (s := queue.stats(name)[0]).ready + s.scheduled + s.waiting + s.running:
        if time.monotonic() > deadline:
            raise TimeoutError(f"queue {name} still has work after {timeout} s: {s}")
        time.sleep(0.1)


def wait_until(deadline: float) -> None:
    """Sleep until ``deadline`` (a ``time.time()``): how racing children start together."""
    time.sleep(max(0.0, deadline - time.time()))
