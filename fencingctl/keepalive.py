"""``fencing lease keep-alive RESOURCE TOKEN [--ttl S]``: keep a lease taken elsewhere alive.

Like ``etcdctl lease keep-alive``: renews the lease (by its resource and token, as
``fencing lease renew`` does) at once and then every ttl/3, each renewal for the lease's
own ttl (the one it was acquired with; ``--ttl`` names another), printing a line per
renewal, until SIGINT or SIGTERM, and exits 0 then, leaving the lease held for its
last ttl (``fencing lease release`` gives it up at once). A renewal that fails for a
while (server unreachable, its backend down, a deadline) is retried sooner, up to
the lease's local deadline (the schedule the SDK keeps, :mod:`fencing._renewal`).

Exits 5 (``LEASE_LOST``) as soon as the lease is not the caller's any more: a renewal
refused (expired, released, taken over), or the local deadline passed with no renewal
through; another refusal exits with its own code (:data:`serving.exits.TABLE`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from fencing._renewal import RenewalSchedule
from fencing.client import LeaseClient
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    LeaseLost,
    ResourceExhaustedError,
)
from fencingctl import connect, flags
from serving import exits

#: Renewal failures that do not prove the lease lost: retried until the local deadline.
TRANSIENT = (BackendUnavailableError, DeadlineExceededError, ResourceExhaustedError)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _print(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    line = json.dumps(fields) if args.json else " ".join(f"{k}={v}" for k, v in fields.items())
    print(line, flush=True)


def keep_alive(args: argparse.Namespace, client: LeaseClient) -> int:
    """Renew until a stop signal (0) or the lease is lost (LEASE_LOST)."""
    schedule: RenewalSchedule | None = None
    while True:
        now = time.monotonic()
        if schedule is not None:
            if schedule.expired(now):
                return exits.fail(
                    LeaseLost(
                        f"lease on {args.resource!r} with token {args.token}: its ttl ran "
                        "out before a renewal got through",
                        resource=args.resource,
                        token=args.token,
                    ),
                    as_json=args.json,
                )
            # Sleeping here doubles as waiting for the stop signals (blocked, so no
            # handler races the renewal in flight): one arriving ends the loop at once.
            if signal.sigtimedwait(STOP_SIGNALS, schedule.sleep_for(now)) is not None:
                return exits.OK
        sent = time.monotonic()
        try:
            ttl_ms = client.renew(args.resource, args.token, args.ttl)
        except TRANSIENT as exc:
            if schedule is None:  # not even once: nothing is known to keep alive
                return exits.fail(exc, as_json=args.json)
            schedule.failed(time.monotonic())
            print(f"warning: renewal failed, retrying: {exc}", flush=True, file=sys.stderr)
            continue
        if schedule is None:
            schedule = RenewalSchedule(ttl_ms, sent)
        else:
            schedule.renewed(sent, ttl_ms)
        _print(args, {"resource": args.resource, "token": args.token, "ttl_ms": ttl_ms})


def _run(args: argparse.Namespace) -> int:
    # Block the stop signals before any gRPC thread starts (threads inherit the mask),
    # so they stay pending for sigtimedwait in this thread.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with connect.lease_client(args) as client:
            return keep_alive(args, client)
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return exits.fail(exc, as_json=args.json)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def register_action(lsub: Any) -> None:
    """Add ``keep-alive`` to the ``fencing lease`` actions."""
    p = lsub.add_parser(
        "keep-alive",
        help="renew a lease by its token until SIGINT/SIGTERM (like etcdctl lease keep-alive)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("resource")
    p.add_argument("token", type=flags.token)
    p.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=None,
        help="the ttl each renewal asks for: 30s, 1m... (default: the lease's own, the ttl "
        "it was acquired with)",
    )
    connect.add_lease_address(p)
    p.add_argument("--json", action="store_true", help="print JSON lines")
    connect.add_options(p)
    p.set_defaults(run=_run)
