"""What the Python drivers share: the scenario file, the error names, the expectations.

A driver runs one scenario's steps through its SDK's public API only and prints one JSON
line: ``{"ok": true}`` or ``{"ok": false, "step": "...", "why": "..."}``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fencing import FencingError, LeaseHeldError, LeaseLost, StaleTokenError

Step = dict[str, Any]


class Mismatch(Exception):
    """A step's outcome is not what the scenario expects."""


class BodyError(Exception):
    """The ``raise`` step's own error (the body failing, not the lease)."""


def error_name(exc: BaseException) -> str:
    if isinstance(exc, StaleTokenError):
        return "StaleToken"
    if isinstance(exc, LeaseHeldError):
        return "LeaseHeld"
    if isinstance(exc, LeaseLost):
        return "LeaseLost"
    if isinstance(exc, BodyError):
        return "Body"
    return type(exc).__name__


@dataclass
class Context:
    lease_addr: str
    guard_addr: str
    prefix: str
    knob: str
    leases: dict[str, Any] = field(default_factory=dict)
    #: When each lease's acquire was sent (monotonic) and its ttl: the
    #: ``request_deadline`` control counts the lease's life from it, as an SDK that
    #: ignores the wait would.
    requested_at: dict[str, tuple[float, float]] = field(default_factory=dict)

    def resource(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def queue(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def token_of(self, var: str) -> int:
        return int(self.leases[var].token)


def check_error(ctx: Context, step: Step, exc: BaseException | None) -> None:
    """Judge a step's failure (or success) against its ``expect``."""
    expect = step.get("expect", {})
    want = expect.get("error")
    if exc is None:
        if want is not None:
            raise Mismatch(f"expected {want}, got success")
        return
    if want is None or error_name(exc) != want:
        raise Mismatch(f"expected {want or 'success'}, got {error_name(exc)}: {exc}")
    if "current_token_of" in expect:
        current = ctx.token_of(expect["current_token_of"])
        if getattr(exc, "current_token", None) != current:
            raise Mismatch(f"current_token {getattr(exc, 'current_token', None)} != {current}")
    if "key_applied" in expect and getattr(exc, "key_applied", None) != expect["key_applied"]:
        raise Mismatch(f"key_applied {getattr(exc, 'key_applied', None)}")
    if "applied_by_of" in expect:
        want_token = ctx.token_of(expect["applied_by_of"])
        if getattr(exc, "applied_by_token", None) != want_token:
            raise Mismatch(f"applied_by_token {getattr(exc, 'applied_by_token', None)}")


def judge(ctx: Context, step: Step, exc: BaseException | None, result: Any) -> None:
    """Judge a step that ran (in the foreground, or a background one at its ``join``)."""
    if isinstance(exc, Mismatch):
        raise exc
    check_error(ctx, step, exc)
    if exc is None:
        check_result(ctx, step, result or {})


def check_deadline_from_request(ctx: Context, var: str) -> None:
    """The ``request_deadline`` control: the rule broken, a lease's local deadline counted
    from its request instead of its grant, so a grant after a long wait is lost at once."""
    if ctx.knob != "request_deadline" or var not in ctx.requested_at:
        return
    lease = ctx.leases[var]
    sent, ttl = ctx.requested_at[var]
    if time.monotonic() - sent > ttl:
        raise LeaseLost(
            "the deadline counted from the request passed",
            resource=lease.resource,
            token=int(lease.token),
        )


#: The ``requeue`` control: an acquire that gives up its place in line and asks again
#: (waits of this many seconds), as an SDK polling instead of waiting would.
REQUEUE_WAIT_S = 0.2


def check_result(ctx: Context, step: Step, result: dict[str, Any]) -> None:
    """Judge a successful step's result fields (``replayed``, ``value``...)."""
    expect = step.get("expect", {})
    if "replayed" in expect and result.get("replayed") != expect["replayed"]:
        raise Mismatch(f"replayed {result.get('replayed')}")
    if "replayed_by_of" in expect:
        token = ctx.token_of(expect["replayed_by_of"])
        if result.get("replayed_by_token") != token:
            raise Mismatch(f"replayed_by_token {result.get('replayed_by_token')} != {token}")
    if "value" in expect and result.get("value") != expect["value"]:
        raise Mismatch(f"value {result.get('value')!r} != {expect['value']!r}")


def load() -> tuple[list[Step], Context]:
    """The scenario (argv[1]) and the run's context (servers from the environment)."""
    scenario = json.loads(Path(sys.argv[1]).read_text())
    knob = sys.argv[2] if len(sys.argv) > 2 else ""
    guard = os.environ["CONFORMANCE_UNFENCED" if knob == "unfenced" else "CONFORMANCE_GUARD"]
    ctx = Context(os.environ["CONFORMANCE_LEASE"], guard, os.environ["CONFORMANCE_PREFIX"], knob)
    if knob == "fresh_request_id":
        break_request_ids()
    return scenario["steps"], ctx


def send_fault(action: str) -> None:
    """Act on the link to the lease server (a ``fault`` step): one line to the runner's
    fault proxy, which answers once the fault is in force."""
    addr = os.environ.get("CONFORMANCE_FAULTS")
    if not addr:
        raise ValueError('a fault step needs "lease_via_fault_proxy": true in its scenario')
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as conn:
        conn.sendall(action.encode() + b"\n")
        answer = conn.makefile().readline().strip()
    if answer != "ok":
        raise RuntimeError(f"fault {action!r}: {answer or 'no answer'}")


def break_request_ids() -> None:
    """The ``fresh_request_id`` control: every attempt of an acquire carries a new request
    id, as an SDK whose retry is a new request would, so the server cannot tell a retry
    of a lost attempt from another acquire."""
    from fencing.client import _core
    from fencing.v1 import lease_pb2

    original = _core.AcquirePlan.request

    def request(plan: _core.AcquirePlan) -> lease_pb2.AcquireRequest:
        plan.request_id = _core.new_request_id()
        return original(plan)

    _core.AcquirePlan.request = request  # type: ignore[method-assign,assignment]


def report(error: BaseException | None, where: str = "") -> None:
    if error is None:
        print(json.dumps({"ok": True}))
    else:
        print(json.dumps({"ok": False, "step": where, "why": f"{error_name(error)}: {error}"}))


def pause_process(seconds: float) -> None:
    """Freeze this whole process (every thread and the event loop: renewals too) for
    ``seconds``: a helper process sends SIGCONT."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


__all__ = [
    "REQUEUE_WAIT_S",
    "BodyError",
    "Context",
    "FencingError",
    "Mismatch",
    "check_deadline_from_request",
    "check_error",
    "check_result",
    "judge",
    "send_fault",
]
