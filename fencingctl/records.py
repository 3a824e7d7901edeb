"""The guard's records from the shell: ``fencing get RESOURCE [--prefix P]`` lists keys,
``fencing delete RESOURCE KEY`` removes one, fenced.

``fencing get RESOURCE`` without a KEY (or with ``--prefix P``) prints every record of
RESOURCE whose key starts with P, one line each in key order (``--json``: JSON lines;
``--keys-only``: the keys), paging through the guard's ``ListRecords`` (``--page-size``
records per call, at most 1,000). ``fencing delete RESOURCE KEY`` is a guarded write
of one ``Delete``: the token from ``--token`` or ``FENCING_TOKEN`` (as ``fencing put``),
refused as stale like any write.
"""

from __future__ import annotations

import argparse
from typing import Any

from fencing.errors import FencingError
from fencing.types import Claim, Delete
from fencingctl import connect, flags, ops
from serving import exits


def list_records(args: argparse.Namespace) -> int:
    """``fencing get RESOURCE [--prefix P]``: one line per record, in key order."""
    prefix = args.prefix or ""
    try:
        with connect.guard_client(args) as guard:
            for key, record in guard.list_records(args.resource, prefix, page_size=args.page_size):
                fields: dict[str, Any] = {"resource": args.resource, "key": key}
                if not args.keys_only:
                    fields["value"] = record.value.decode(errors="backslashreplace")
                    fields["written_by_token"] = record.written_by_token
                ops._emit(args, fields)
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return exits.fail(exc, as_json=args.json)
    return exits.OK


def add_list_options(p: argparse.ArgumentParser) -> None:
    """``fencing get``'s listing options (the parser is ``ops``'s)."""
    p.add_argument(
        "--prefix",
        default=None,
        help="list every key of RESOURCE starting with it, in key order (no KEY given: all)",
    )
    p.add_argument("--keys-only", action="store_true", help="when listing: print keys only")
    p.add_argument(
        "--page-size",
        type=flags.page_size,
        default=0,
        help="when listing: records per call to the guard (1-1000; default the guard's, 100)",
    )


@ops._guarded
def _delete(args: argparse.Namespace) -> dict[str, Any]:
    with connect.guard_client(args) as guard:
        result = guard.write(
            Claim(args.resource, ops.token_of(args)),
            Delete(args.key),
            idempotency_key=args.idempotency_key,
        )
        return {
            "resource": args.resource,
            "key": args.key,
            "deleted": True,
            "fence": result.fence,
            "replayed": result.replayed,
        }


def register(sub: Any) -> None:
    p = sub.add_parser(
        "delete",
        help="guarded delete of one key with a token",
        description="Remove KEY from RESOURCE at the guard, fenced by the token (--token, "
        "else FENCING_TOKEN as 'fencing lock' sets): a stale token deletes nothing and "
        "exits STALE_TOKEN (3). Deleting a missing key is a write all the same.",
    )
    p.add_argument("resource")
    p.add_argument("key")
    p.add_argument(
        "--token",
        type=flags.token,
        default=None,
        help="the writer's fencing token (default: env FENCING_TOKEN, as 'fencing lock' sets)",
    )
    p.add_argument("--idempotency-key", default="", help="apply at most once per key")
    connect.add_guard_address(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    connect.add_options(p)
    p.set_defaults(run=_delete)
