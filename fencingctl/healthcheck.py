"""``fencing healthcheck ADDR...``: exit 0 if every server reports SERVING, 1 otherwise.

Only 0 and 1 (2 for a usage error), whatever the failure, unlike the other commands:
that is the contract of a container healthcheck (Docker reserves 2).

For container healthchecks (``grpc_health_probe`` without the Go binary): asks the
standard ``grpc.health.v1.Health/Check`` for ``--service`` (default "", the whole
server; or ``fencing.v1.LeaseService``, ``fencing.v1.GuardService``). A server reports
NOT_SERVING while its backend is unreachable and from the moment it starts draining.
Several addresses (``fencing serve``'s lease server and guard) are asked in turn.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencing.client import _core
from fencingctl import connect, flags
from serving.server import HEALTH_REASON_KEY


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "healthcheck",
        help="exit 0 if a server reports SERVING (for container healthchecks)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "addresses",
        nargs="+",
        metavar="ADDR",
        type=connect.checker(connect.DEFAULT_LEASE_ADDR),
        help="host:port of a lease server or guard",
    )
    p.add_argument("--service", default="", help="service to ask about (default: the whole server)")
    p.add_argument(
        "--timeout",
        type=flags.duration(0.0, above=True),
        metavar="DURATION",
        default=3.0,
        help="how long each check may take (default 3s)",
    )
    connect.add_options(p)
    p.set_defaults(run=run)


def check(address: str, service: str, timeout: float, args: argparse.Namespace) -> str:
    """The serving status's name (``SERVING``, ``NOT_SERVING``...), followed by why in
    parentheses when the server says (a guard's watch entry while it does not follow)."""
    tls = connect.tls_of(args)
    secure = _core.channel_credentials(address, tls=tls, token=args.auth_token)
    options = _core.channel_options(tls)
    channel = (
        grpc.secure_channel(address, secure, options)
        if secure is not None
        else grpc.insecure_channel(address, options)
    )
    with channel:
        reply, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    status = str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    reasons = [str(v) for k, v in call.trailing_metadata() or () if k == HEALTH_REASON_KEY]
    return f"{status} ({reasons[0]})" if reasons else status


def run(args: argparse.Namespace) -> int:
    worst = 0
    for address in args.addresses:
        try:
            status = check(address, args.service, args.timeout, args)
        except grpc.RpcError as err:
            call: Any = err
            print(f"{address}: {call.code().name}: {call.details()}", file=sys.stderr)
            worst = max(worst, 1)
            continue
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{address} {args.service or '(server)'}: {status}")
        if status.split()[0] != "SERVING":
            worst = max(worst, 1)
    return worst
