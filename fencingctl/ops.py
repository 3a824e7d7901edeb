"""Operator commands: ``fencing lease acquire|renew|release|describe|list``, ``put``, ``get``,
``fence``.

Each prints one line of ``key=value`` pairs (or JSON with ``--json``; ``lease list`` a
line per lease) and exits 0, or prints ``error: REASON: message`` to stderr (with
``--json`` also an object ``{reason, message, metadata, exit_code}`` on stdout) and
exits with the reason's code in :data:`serving.exits.TABLE`.

``fencing fence reset RESOURCE`` is the recovery from a fence a token nobody was
granted wedged: it asks the lease server for the resource's ``last_token`` (the
highest token it ever granted) and sets the guard's fence to exactly that, so the
next holder can write and every former holder stays fenced. The guard needs the
caller to hold the ``reset_fence`` permission and logs the reset at WARNING.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import grpc

from fencing.client import GuardClient, LeaseClient
from fencing.errors import FencingError
from fencing.types import Claim, Put
from fencingctl import connect, flags, hints, keepalive
from serving import exits


def _emit(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(fields))
    else:
        print(" ".join(f"{k}={v}" for k, v in fields.items()))


def _guarded(
    fn: Callable[[argparse.Namespace], dict[str, Any]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            _emit(args, fn(args))
        except (FencingError, grpc.RpcError, ValueError) as exc:
            # ValueError: unreadable certificate files (a usage error).
            return hints.fail(args, exc, as_json=args.json)
        return exits.OK

    return run


def _lease_client(args: argparse.Namespace) -> LeaseClient:
    return connect.lease_client(args, holder=getattr(args, "holder", None))


def _guard_client(args: argparse.Namespace) -> GuardClient:
    return connect.guard_client(args)


@_guarded
def _acquire(args: argparse.Namespace) -> dict[str, Any]:
    with _lease_client(args) as client:
        if args.wait > 0:
            lease = client.acquire(args.resource, args.ttl, timeout=args.wait)
        else:
            lease = client.acquire_nowait(args.resource, args.ttl)
        return {
            "resource": lease.resource,
            "token": lease.token,
            "holder": lease.holder,
            "ttl_ms": lease.ttl_ms,
        }


def _list(args: argparse.Namespace) -> int:
    """``fencing lease list``: one line (or JSON object) per held lease, in resource order."""
    try:
        with _lease_client(args) as client:
            for s in client.list_held(args.prefix, page_size=args.page_size):
                _emit(
                    args,
                    {
                        "resource": s.resource,
                        "holder": s.holder,
                        "token": s.token,
                        "remaining_ms": s.remaining_ms,
                        "last_token": s.last_token,
                        "ttl_ms": s.ttl_ms,
                    },
                )
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    return 0


@_guarded
def _renew(args: argparse.Namespace) -> dict[str, Any]:
    with _lease_client(args) as client:
        ttl_ms = client.renew(args.resource, args.token, args.ttl)
        return {"resource": args.resource, "token": args.token, "ttl_ms": ttl_ms}


@_guarded
def _release(args: argparse.Namespace) -> dict[str, Any]:
    with _lease_client(args) as client:
        client.release(args.resource, args.token)
        return {"resource": args.resource, "token": args.token, "released": True}


@_guarded
def _describe(args: argparse.Namespace) -> dict[str, Any]:
    with _lease_client(args) as client:
        s = client.describe(args.resource)
        return {
            "resource": s.resource,
            "held": s.held,
            "holder": s.holder,
            "token": s.token,
            "remaining_ms": s.remaining_ms,
            "last_token": s.last_token,
            "ttl_ms": s.ttl_ms,
        }


def token_of(args: argparse.Namespace) -> int:
    """The writer's token: ``--token``, else ``FENCING_TOKEN`` (set by ``fencing lock`` and
    ``fencing elect`` for their command), which must then be for this resource."""
    if args.token is not None:
        return int(args.token)
    raw = os.environ.get("FENCING_TOKEN", "")
    if not raw:
        raise flags.UsageError(
            "no token: give --token, or run inside 'fencing lock' (FENCING_TOKEN)"
        )
    try:
        token = flags.token(raw)  # the rule --token is held to
    except argparse.ArgumentTypeError as exc:
        raise flags.UsageError(f"FENCING_TOKEN {exc}") from None
    held = os.environ.get("FENCING_RESOURCE", "")
    if held and held != args.resource:
        # A token means something only for its own resource: writing it to another
        # would raise that resource's fence to a number nobody was granted there.
        raise flags.UsageError(
            f"FENCING_TOKEN is a token of {held!r}, not of {args.resource!r}: give --token"
        )
    return token


@_guarded
def _put(args: argparse.Namespace) -> dict[str, Any]:
    with _guard_client(args) as guard:
        result = guard.write(
            Claim(args.resource, token_of(args)),
            Put(args.key, args.value.encode()),
            idempotency_key=args.idempotency_key,
        )
        return {
            "resource": args.resource,
            "key": args.key,
            "fence": result.fence,
            "replayed": result.replayed,
        }


@_guarded
def _get(args: argparse.Namespace) -> dict[str, Any]:
    with _guard_client(args) as guard:
        record = guard.read(args.resource, args.key)
        if record is None:
            return {"resource": args.resource, "key": args.key, "found": False}
        return {
            "resource": args.resource,
            "key": args.key,
            "found": True,
            "value": record.value.decode(errors="backslashreplace"),
            "written_by_token": record.written_by_token,
        }


def _get_or_list(args: argparse.Namespace) -> int:
    """``get RESOURCE KEY`` reads one key; without KEY, or with ``--prefix``, it lists."""
    from fencingctl import records  # it builds on this module's helpers

    if args.key is None or args.prefix is not None:
        if args.key is not None:
            print("fencing get: error: give KEY or --prefix, not both", file=sys.stderr)
            return exits.USAGE
        return records.list_records(args)
    return _get(args)


@_guarded
def _fence(args: argparse.Namespace) -> dict[str, Any]:
    resource, token = args.resource, args.token
    # "fence reset RESOURCE" (or "fence RESOURCE --reset"); "fence reset 5" still fences
    # a resource named "reset" to 5.
    if resource == "reset" and token is not None and not token.isdigit():
        resource, token, args.reset = token, None, True
    if args.reset:
        if token is not None:
            raise flags.UsageError("a reset takes no token: it uses the lease server's last_token")
        return _reset(args, resource)
    with _guard_client(args) as guard:
        if token is None:
            return {"resource": resource, "fence": guard.describe_fence(resource)}
        if not token.isdigit():
            raise flags.UsageError(f"token must be a number, not {token!r}")
        return {"resource": resource, "fence": guard.fence(Claim(resource, int(token)))}


def _reset(args: argparse.Namespace, resource: str) -> dict[str, Any]:
    with _lease_client(args) as leases:
        last_token = leases.describe(resource).last_token
    with _guard_client(args) as guard:
        reset = guard.reset_fence(resource, last_token)
    return {
        "resource": resource,
        "previous_fence": reset.previous_fence,
        "fence": reset.fence,
        "last_token": last_token,
    }


def _common(p: argparse.ArgumentParser, *, lease: bool) -> None:
    if lease:
        connect.add_lease_address(p)
    else:
        connect.add_guard_address(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    connect.add_options(p)


def register(sub: Any) -> None:
    lease = sub.add_parser("lease", help="acquire, renew, release, describe or list leases")
    lsub = lease.add_subparsers(dest="lease_command", required=True, metavar="ACTION")

    p = lsub.add_parser("acquire", help="acquire a lease and print its token")
    p.add_argument("resource")
    p.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=10.0,
        help="the lease's ttl: 30s, 1m... (default 10s)",
    )
    p.add_argument(
        "--wait",
        type=flags.wait,
        metavar="DURATION",
        default=0.0,
        help="how long to wait if held (default 0)",
    )
    p.add_argument("--holder", default="", help="holder name (default host-pid-random)")
    _common(p, lease=True)
    p.set_defaults(run=_acquire)

    p = lsub.add_parser("renew", help="renew a lease by its token")
    p.add_argument("resource")
    p.add_argument("token", type=flags.token)
    p.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=None,
        help="the ttl to renew for: 30s, 1m... (default: the lease's own, the ttl it was "
        "acquired or last renewed with)",
    )
    _common(p, lease=True)
    p.set_defaults(run=_renew)

    p = lsub.add_parser("release", help="release a lease by its token")
    p.add_argument("resource")
    p.add_argument("token", type=flags.token)
    _common(p, lease=True)
    p.set_defaults(run=_release)

    p = lsub.add_parser(
        "list",
        help="the held leases, one line each, in resource order",
        description="List the held (unexpired) leases whose resource starts with --prefix, "
        "one line each (JSON lines with --json), in resource order; the lease server is "
        "asked a page at a time. Needs the describe permission on the prefix.",
    )
    p.add_argument("--prefix", default="", help="only resources starting with it")
    p.add_argument(
        "--page-size",
        type=flags.page_size,
        default=0,
        help="leases per call to the server (1-1000; default the server's, 100)",
    )
    _common(p, lease=True)
    p.set_defaults(run=_list)

    p = lsub.add_parser("describe", help="who holds a resource, with which token")
    p.add_argument("resource")
    _common(p, lease=True)
    p.set_defaults(run=_describe)

    keepalive.register_action(lsub)

    p = sub.add_parser("put", help="guarded write of one key with a token")
    p.add_argument("resource")
    p.add_argument("key")
    p.add_argument("value")
    p.add_argument(
        "--token",
        type=flags.token,
        default=None,
        help="the writer's fencing token (default: env FENCING_TOKEN, as 'fencing lock' sets)",
    )
    p.add_argument("--idempotency-key", default="", help="apply at most once per key")
    _common(p, lease=False)
    p.set_defaults(run=_put)

    p = sub.add_parser("get", help="read one key and the token that wrote it, or list keys")
    p.add_argument("resource")
    p.add_argument("key", nargs="?", default=None, help="the key (none: list RESOURCE's keys)")
    from fencingctl import records  # it builds on this module's helpers

    records.add_list_options(p)
    _common(p, lease=False)
    p.set_defaults(run=_get_or_list)

    p = sub.add_parser(
        "fence",
        help="advance a resource's fence to TOKEN, show it, or reset it ('fence reset RESOURCE')",
        description="fencing fence RESOURCE [TOKEN]: show the fence, or advance it to TOKEN. "
        "fencing fence reset RESOURCE (or RESOURCE --reset): set the fence to the lease "
        "server's last_token for RESOURCE, lowering a fence a token nobody was granted "
        "wedged; needs the reset_fence permission, and the guard audits it.",
    )
    p.add_argument("resource")
    p.add_argument("token", nargs="?", default=None)
    p.add_argument(
        "--reset",
        action="store_true",
        help="reset the fence to the lease server's last_token for RESOURCE",
    )
    connect.add_lease_address(p, "the lease server a reset asks for last_token")
    _common(p, lease=False)
    p.set_defaults(run=_fence)
