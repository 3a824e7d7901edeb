"""``fencing queue schedules|schedule add|schedule remove``: periodic jobs from a shell.

``schedules [QUEUE]`` prints one line per schedule (name, queue, cron or interval,
time zone, catch-up, next run, last period enqueued and its job), or JSON lines with
``--json`` (times in ms); ``schedule add NAME --queue Q (--cron EXPR | --every
DURATION)`` puts one (a schedule of that name is replaced); ``schedule remove NAME``
deletes one (exit ``NOT_FOUND`` if there is none). Errors print ``error: REASON:
message`` and exit with the reason's code in :data:`serving.exits.TABLE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from fencing.client import ScheduleInfo
from fencing.errors import FencingError
from fencingctl import connect, flags, hints, output
from serving import exits


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


COLUMNS: tuple[tuple[str, Callable[[ScheduleInfo], str]], ...] = (
    ("name", lambda s: s.name),
    ("queue", lambda s: s.queue),
    ("schedule", lambda s: s.cron or f"every {flags.show_seconds(s.every)}"),
    ("tz", lambda s: s.timezone or "UTC"),
    ("catch_up", lambda s: str(s.catch_up)),
    ("next_run", lambda s: _when(s.next_run)),
    ("last_period", lambda s: _when(s.last_period)),
    ("last_job", lambda s: str(s.last_job_id or "-")),
)


def _as_json(s: ScheduleInfo) -> dict[str, Any]:
    fields = dataclasses.asdict(s)
    fields["payload"] = s.payload.decode("utf-8", errors="replace")
    return output.in_ms(fields, ("every", "created_at", "next_run", "last_period"))


def _list(args: argparse.Namespace) -> int:
    try:
        with connect.queue_client(args) as client:
            found = client.list_schedules(args.queue or "")
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if args.json:
        for s in found:
            output.print_json(_as_json(s))
        return 0
    rows = [[title for title, _ in COLUMNS], *([cell(s) for _, cell in COLUMNS] for s in found)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not found:
        print(f"(no schedules{' of ' + repr(args.queue) if args.queue else ''})")
    return 0


def _add(args: argparse.Namespace) -> int:
    payload = sys.stdin.buffer.read() if args.payload == "-" else args.payload.encode()
    try:
        with connect.queue_client(args) as client:
            info = client.put_schedule(
                args.name,
                args.queue,
                cron=args.cron or "",
                every=args.every or 0.0,
                timezone=args.timezone,
                payload=payload,
                priority=args.priority,
                max_attempts=args.max_attempts,
                resource=args.resource,
                catch_up=args.catch_up,
            )
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if args.json:
        print(json.dumps(_as_json(info)))
    else:
        print(f"name={info.name} queue={info.queue} next_run={_when(info.next_run)}")
    return 0


class NoSuchSchedule(FencingError):
    """``schedule remove`` of a name the server has no schedule of (exit NOT_FOUND)."""

    reason = "NOT_FOUND"


def _remove(args: argparse.Namespace) -> int:
    try:
        with connect.queue_client(args) as client:
            deleted = client.delete_schedule(args.name, queue=args.queue)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if not deleted:
        where = f" of queue {args.queue!r}" if args.queue else ""
        return exits.fail(NoSuchSchedule(f"no schedule {args.name!r}{where}"), as_json=args.json)
    print(json.dumps({"name": args.name, "deleted": True}) if args.json else f"removed {args.name}")
    return 0


def register(qsub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``schedules`` and ``schedule add|remove`` to ``fencing queue``; ``common`` adds
    the connection options and ``--json`` as the other queue commands have them."""
    p = qsub.add_parser("schedules", help="list the schedules of periodic jobs")
    p.add_argument("queue", nargs="?", default="", help="one queue (default: all)")
    common(p)
    p.set_defaults(run=_list)

    schedule = qsub.add_parser("schedule", help="add or remove a periodic job's schedule")
    ssub = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")

    p = ssub.add_parser(
        "add",
        help="add a schedule, or replace the one of that name",
        description="Every lease server on the queue backend enqueues one job per period "
        "(idempotency key periodic:NAME:PERIOD_MS). After downtime only the latest "
        "missed period is enqueued, unless --catch-up N.",
    )
    p.add_argument("name", help="the schedule's name (1-128 bytes)")
    p.add_argument("--queue", required=True, help="the queue its jobs go to")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="5 fields: minute hour day-of-month month day-of-week")
    when.add_argument(
        "--every",
        type=flags.every,
        metavar="DURATION",
        help="a fixed interval: 90, 30s, 5m, 1h, 1d (at least 1s)",
    )
    p.add_argument("--timezone", default="", help="IANA time zone of --cron (default UTC)")
    p.add_argument("--payload", default="", help="each job's payload; '-' reads stdin")
    p.add_argument("--priority", type=flags.priority, default=0, help="higher first (-1000..1000)")
    p.add_argument(
        "--max-attempts", type=flags.max_attempts, default=0, help="default: the server's (5)"
    )
    p.add_argument("--resource", default="", help="guard resource the jobs' tokens fence")
    p.add_argument(
        "--catch-up",
        type=flags.integer(0, 100),
        default=0,
        help="after downtime, enqueue each missed period, the latest N (0..100; default 0: "
        "only the latest)",
    )
    common(p)
    p.set_defaults(run=_add)

    p = ssub.add_parser("remove", help="remove a schedule (its jobs stay)")
    p.add_argument("name")
    p.add_argument("--queue", default="", help="only if it is this queue's (auth scope)")
    common(p)
    p.set_defaults(run=_remove)
