"""``fencing queue stats|enqueue``: look at queues and add jobs from a shell.

``stats`` prints one line per queue (ready, scheduled, waiting, running, expired
leases, succeeded, dead, oldest ready age, retrying jobs, retry rate), or JSON with
``--json``; ``enqueue`` adds one job and prints its id. Errors print
``error: REASON: message`` to stderr (and a JSON object on stdout with ``--json``) and
exit with the reason's code in :data:`serving.exits.TABLE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import grpc

from fencing.client.queue import QueueClient
from fencing.errors import FencingError
from fencingctl import connect, schedules
from serving import exits

COLUMNS = (
    ("queue", "queue"),
    ("ready", "ready"),
    ("scheduled", "sched"),
    ("waiting", "waiting"),
    ("running", "running"),
    ("expired", "expired"),
    ("succeeded", "succeeded"),
    ("dead", "dead"),
    ("oldest_ready_age", "oldest_s"),
    ("retrying", "retrying"),
    ("retry_rate", "retry_rate"),
)


def _client(args: argparse.Namespace) -> QueueClient:
    return connect.queue_client(args)


def _stats(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            stats = client.stats(args.queue or "", window=args.window)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return exits.fail(exc, as_json=args.json)
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in stats]))
        return 0
    rows: list[list[str]] = [[title for _, title in COLUMNS]]
    for s in stats:
        row = []
        for attr, _ in COLUMNS:
            value: Any = getattr(s, attr)
            row.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for r in rows:
        cells = [
            r[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)),
        ]
        print("  ".join(cells))
    if not stats:
        print(f"(no jobs{' in ' + repr(args.queue) if args.queue else ''})")
    return 0


def _enqueue(args: argparse.Namespace) -> int:
    payload = sys.stdin.buffer.read() if args.payload == "-" else args.payload.encode()
    try:
        with _client(args) as client:
            job = client.enqueue(
                args.queue,
                payload,
                idempotency_key=args.idempotency_key,
                ordering_key=args.ordering_key,
                priority=args.priority,
                max_attempts=args.max_attempts,
                delay=args.delay,
                resource=args.resource,
            )
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return exits.fail(exc, as_json=args.json)
    fields = {"queue": args.queue, "id": job.id, "created": job.created, "state": job.state}
    print(json.dumps(fields) if args.json else " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    connect.add_lease_address(
        p,
        "the lease server hosting the queues",
        old_flags=["--addr"],
        old_envs=["FENCING_QUEUE_ADDR"],
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    connect.add_options(p)


def register(sub: Any) -> None:
    queue = sub.add_parser("queue", help="queue stats, enqueue a job, periodic jobs")
    qsub = queue.add_subparsers(dest="queue_command", required=True, metavar="ACTION")

    p = qsub.add_parser("stats", help="ready, running, expired, dead, oldest ready age per queue")
    p.add_argument("queue", nargs="?", default="", help="one queue (default: all)")
    p.add_argument(
        "--window", type=float, default=0.0, help="seconds of history for retry_rate (default 300)"
    )
    _common(p)
    p.set_defaults(run=_stats)

    p = qsub.add_parser("enqueue", help="add one job; PAYLOAD '-' reads stdin")
    p.add_argument("queue")
    p.add_argument("payload")
    p.add_argument("--idempotency-key", default="", help="a second enqueue returns the first job")
    p.add_argument("--ordering-key", default="", help="jobs of one key run one at a time, in order")
    p.add_argument("--priority", type=int, default=0, help="higher first (-1000..1000)")
    p.add_argument("--max-attempts", type=int, default=0, help="default: the server's (5)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before it is due")
    p.add_argument("--resource", default="", help="guard resource its token fences")
    _common(p)
    p.set_defaults(run=_enqueue)

    schedules.register(qsub, _common)
