"""``fencing migrate``: create or upgrade the PostgreSQL schema (tables and SQL functions).

Servers migrate on start too; run this once as the schema owner when the servers'
role may not create objects, or to install ``fencing.check_and_advance`` for your
own transactions before any server runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from fencing.errors import FencingError, InvalidArgumentError
from serving import exits
from serving.extras import MissingExtraError, needs_extra


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "migrate",
        help="create or upgrade the PostgreSQL schema",
        description=__doc__,
    )
    p.add_argument(
        "dsn",
        nargs="?",
        default=os.environ.get("FENCING_BACKEND", ""),
        help="postgresql:// URL (env FENCING_BACKEND)",
    )
    p.add_argument(
        "--schema", default=None, help="schema name (default: the URL's ?schema=, else 'fencing')"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.dsn.startswith(("postgres://", "postgresql://")):
        print(
            "error: INVALID_ARGUMENT: migrate needs a postgresql:// URL "
            "(SQLite and Redis need no migration step)",
            file=sys.stderr,
        )
        return exits.USAGE
    try:
        with needs_extra("postgres", "fencing migrate"):
            from serving.postgres_db import migrate
    except MissingExtraError as exc:
        print(f"error: USAGE: {exc}", file=sys.stderr)
        return exits.USAGE
    try:
        applied = asyncio.run(migrate(args.dsn, args.schema))
    except InvalidArgumentError as exc:  # the URL itself: a usage error
        print(f"error: USAGE: {exc.message}", file=sys.stderr)
        return exits.USAGE
    except (FencingError, exits.StartupError) as exc:
        return exits.fail(exc)
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0
