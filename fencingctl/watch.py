"""``fencing watch [RESOURCE | --prefix P] [--from REV] [--json]``: stream lease events.

Prints one line per event of the lease server's ``Watch`` stream, in revision order,
until interrupted (Ctrl-C exits 130) or the stream fails, e.g. when the server stops
(then it exits with the error's code in ``fencing --help``'s table)::

    revision=7 kind=ACQUIRED resource=orders token=3 holder=worker-1 ttl_ms=10000

``kind`` is ACQUIRED, RELEASED, EXPIRED (renewals are not events), or RESYNC (the
server could not serve the requested start: events were missed, re-read with
``fencing lease describe``). Without ``--from`` the stream starts now; ``--from REV`` resumes after
revision REV (the revision of the last line you saw: the stream goes on with the next
event), replaying what the server still keeps of the log, then live; ``--from 0``
replays it from revision 1. With ``--json`` each line is one JSON object with the same
fields.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fencing.client import LeaseEvent
from fencing.errors import FencingError
from fencingctl import connect, flags, hints


def event_fields(event: LeaseEvent) -> dict[str, Any]:
    """One line of ``fencing watch``."""
    return {
        "revision": event.revision,
        "kind": event.kind.name,
        "resource": event.resource,
        "token": event.token,
        "holder": event.holder,
        "ttl_ms": event.ttl_ms,
    }


def _run(args: argparse.Namespace) -> int:
    try:
        if args.resource and args.prefix:
            raise flags.UsageError("give RESOURCE or --prefix, not both")
        # The stream is closed on every way out (Ctrl-C, a closed stdout): it cancels it.
        with (
            connect.lease_client(args) as client,
            client.watch_stream(
                args.resource, prefix=args.prefix, after_revision=args.start
            ) as stream,
        ):
            for event in stream:
                fields = event_fields(event)
                if args.json:
                    print(json.dumps(fields), flush=True)
                else:
                    print(" ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    except KeyboardInterrupt:
        return 130
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return hints.fail(args, exc)
    return 0


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch",
        help="stream lease events of a resource or prefix, one line each",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("resource", nargs="?", default="", metavar="RESOURCE")
    p.add_argument("--prefix", default="", help="every resource starting with it ('' : all)")
    p.add_argument(
        "--from",
        dest="start",
        type=flags.count,
        default=None,
        metavar="REV",
        help="resume after revision REV, the last one seen (0: from revision 1, the whole "
        "log the server keeps; default: from now)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    connect.add_lease_address(p, "the lease server to watch")
    connect.add_options(p)
    p.set_defaults(run=_run)
