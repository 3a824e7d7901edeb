"""``fencing elect NAME --value ADDR -- CMD`` and ``fencing leader NAME [--watch]``.

``elect`` campaigns in the election NAME (:class:`fencing.election.Election`): it waits
until it leads (up to ``--timeout``), proclaims ``--value`` (fenced by the term), and
runs CMD as ``fencing lock`` does: ``FENCING_RESOURCE`` (NAME), ``FENCING_TOKEN`` (the
term: the guard refuses the writes of every earlier term), ``FENCING_HOLDER``,
``FENCING_LEADER_VALUE`` and the addresses in its environment; renewed while it runs,
SIGTERM then SIGKILL once the leadership is lost, resigned when CMD exits. Exit codes
as ``fencing lock``'s (75 not elected within the timeout, 76 leadership lost).

``leader`` prints the current leader and exits 0, or ``leader=false`` and exits 1
(``FAILURE``: the question "who leads?" found nobody, as ``pgrep`` finding nothing);
with ``--watch`` it prints it, then a line per change, until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from fencing.client import GuardClient, LeaseClient
from fencing.election import Election, Leader
from fencing.errors import AcquireTimeoutError, FencingError, LeaseLost
from fencingctl import connect, flags, hints, lock
from serving import exits


def _clients(args: argparse.Namespace, stack: ExitStack) -> tuple[LeaseClient, GuardClient]:
    leases = stack.enter_context(connect.lease_client(args, holder=getattr(args, "holder", "")))
    return leases, stack.enter_context(connect.guard_client(args))


def _elect(args: argparse.Namespace) -> int:
    command = lock.command_of(args)
    try:
        with ExitStack() as stack:
            leases, guard = _clients(args, stack)
            election = Election(leases, guard, args.name, ttl=args.ttl)
            try:
                with election.campaign(args.value, timeout=args.timeout) as leadership:
                    return lock.run_while_held(
                        args,
                        leadership.lease,
                        command,
                        extra_env={"FENCING_LEADER_VALUE": args.value},
                    )
            except LeaseLost:
                return lock.EXIT_LOST
    except AcquireTimeoutError as exc:
        print(f"fencing elect: not elected: {exc}", file=sys.stderr)
        return lock.EXIT_NOT_ACQUIRED
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return hints.fail(args, exc)
    except KeyboardInterrupt:  # while waiting for the lease: nothing was started
        return exits.CODES["INTERRUPTED"]


def leader_fields(name: str, leader: Leader | None) -> dict[str, Any]:
    """One line of ``fencing leader``: who leads ``name``, with which term and value."""
    if leader is None:
        return {"name": name, "leader": False}
    return {
        "name": name,
        "leader": True,
        "term": leader.term,
        "holder": leader.holder,
        "value": leader.value if leader.value is not None else "",
    }


def _print(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(fields), flush=True)
    else:
        text = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in fields.items()}
        print(" ".join(f"{k}={v}" for k, v in text.items()), flush=True)


def _leader(args: argparse.Namespace) -> int:
    try:
        with ExitStack() as stack:
            leases, guard = _clients(args, stack)
            election = Election(leases, guard, args.name)
            if not args.watch:
                leader = election.leader()
                _print(args, leader_fields(args.name, leader))
                return exits.OK if leader is not None else exits.FAILURE
            for leader in election.observe():
                _print(args, leader_fields(args.name, leader))
    except KeyboardInterrupt:
        return exits.CODES["INTERRUPTED"]
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return hints.fail(args, exc)
    return 0


def _addresses(p: argparse.ArgumentParser) -> None:
    connect.add_lease_address(p, "the lease server the election's lease is on")
    connect.add_guard_address(p, "the guard holding the proclaimed value and fencing the terms")
    connect.add_options(p)


def register(sub: Any) -> None:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--value", default="", help="what to proclaim as the leader's (e.g. its address)"
    )
    options.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=10.0,
        help="the leadership lease's ttl (default 10s)",
    )
    options.add_argument(
        "--timeout",
        type=flags.seconds,
        metavar="DURATION",
        default=None,
        help="how long to wait to be elected (default: forever); then exit "
        f"{lock.EXIT_NOT_ACQUIRED}",
    )
    lock.add_run_options(options, addresses=_addresses)
    p = lock.runner_parser(
        sub,
        "elect",
        options,
        help="campaign in an election and run a command while leading",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.set_defaults(run=_elect)

    p = sub.add_parser(
        "leader",
        help="who leads an election (exit 1 if nobody does; --watch: and each change)",
        description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
    )
    p.add_argument("name")
    p.add_argument("--watch", action="store_true", help="print each change until interrupted")
    p.add_argument("--json", action="store_true", help="print JSON")
    _addresses(p)
    p.set_defaults(run=_leader)
