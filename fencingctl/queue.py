"""``fencing queue stats|enqueue|jobs|job|retry|cancel|requeue|pause|resume``: queues from a shell.

``stats`` prints one line per queue (ready, scheduled, waiting, running, expired
leases, succeeded, dead, cancelled, oldest ready age, retrying jobs, retry rate), or
JSON lines with ``--json`` (durations in ms); ``enqueue`` adds one job and prints its
id. The operator's commands: ``jobs QUEUE [--state S]`` lists a queue's jobs (a page
at a time, in id order), ``job ID`` shows one with its attempts (a table: number, outcome,
worker, token, start, end, error; the newest 20 are kept), ``retry ID`` makes a dead, cancelled or
failed job due now, ``cancel ID [--guard-addr A ...]`` cancels a waiting, ready or
running job (and fences the named monotonic guards to the cancel's token), ``requeue
QUEUE`` retries the queue's dead jobs, ``pause QUEUE`` / ``resume QUEUE`` stop and
restart its claims (enqueues and running jobs go on). ``retry`` and ``cancel`` of a job in no state
they apply to change nothing and exit 1 (``FAILURE``); an unknown job is
``NOT_FOUND``. Errors print ``error: REASON: message`` to stderr (and a JSON object on
stdout with ``--json``) and exit with the reason's code in
:data:`serving.exits.TABLE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import UTC, datetime
from typing import Any

import grpc

from fencing.client.guard import GuardClient
from fencing.client.queue import JobAction, JobInfo, QueueClient
from fencing.errors import FencingError
from fencingctl import connect, flags, hints, output, schedules, worker
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
    ("cancelled", "cancelled"),
    ("oldest_ready_age", "oldest_s"),
    ("retrying", "retrying"),
    ("retry_rate", "retry_rate"),
    ("paused", "paused"),
)


def _client(args: argparse.Namespace) -> QueueClient:
    return connect.queue_client(args)


def _stats(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            stats = client.stats(args.queue or "", window=args.window)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if args.json:
        for s in stats:
            output.print_json(output.in_ms(dataclasses.asdict(s), ("oldest_ready_age", "window")))
        return 0
    rows: list[list[str]] = [[title for _, title in COLUMNS]]
    for s in stats:
        row = []
        for attr, _ in COLUMNS:
            value: Any = getattr(s, attr)
            if isinstance(value, bool):
                row.append("yes" if value else "-")
            else:
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
        return hints.fail(args, exc, as_json=args.json)
    fields = {"queue": args.queue, "id": job.id, "created": job.created, "state": job.state}
    print(json.dumps(fields) if args.json else " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


JOB_COLUMNS = ("id", "state", "attempts", "max_attempts", "token", "lease_owner", "last_error")


def _time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _jobs(args: argparse.Namespace) -> int:
    shown = 0
    rows: list[list[str]] = [list(JOB_COLUMNS)]
    try:
        with _client(args) as client:
            for info in client.list_jobs(args.queue, state=args.state, page_size=args.page_size):
                if args.json:
                    print(json.dumps(_info_json(info)), flush=True)  # one object a line
                else:
                    row = [str(getattr(info, c)) for c in JOB_COLUMNS]
                    row[-1] = row[-1][:60]
                    rows.append(row)
                shown += 1
                if args.limit and shown >= args.limit:
                    break
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if not args.json:
        if shown:
            _table(rows)
        else:
            state = f" {args.state}" if args.state else ""
            print(f"(no{state} jobs in {args.queue!r})")
    return 0


def _info_json(info: JobInfo) -> dict[str, Any]:
    fields = dataclasses.asdict(info)
    fields["payload"] = info.payload.decode("utf-8", "replace")
    return fields


#: Columns of ``job ID``'s attempts table (``JobInfo.history``).
ATTEMPT_COLUMNS = ("attempt", "outcome", "worker", "token", "started", "ended", "error")


def _attempt_rows(info: JobInfo) -> list[list[str]]:
    """The attempts table of a job, heading first; errors on one line, cut to 60 chars
    (``--json`` has them whole)."""
    rows = [list(ATTEMPT_COLUMNS)]
    for a in info.history:
        error = " ".join(a.error.split())
        rows.append(
            [
                str(a.attempt),
                a.outcome,
                a.worker,
                str(a.token),
                _time(a.started_at_ms),
                _time(a.ended_at_ms),
                error if len(error) <= 60 else error[:57] + "...",
            ]
        )
    return rows


def _print_info(info: JobInfo) -> None:
    times = ("enqueued_at_ms", "run_at_ms", "claimed_at_ms", "finished_at_ms")
    for name, value in _info_json(info).items():
        if (name == "payload" and not info.payload) or name == "history":
            continue
        if name in times or name == "lease_expires_at_ms":
            value = _time(value)
            name = name.removesuffix("_ms")
        print(f"{name + ':':<22}{value}")
    if info.history:
        print("history:")
        _table(_attempt_rows(info))
    else:
        print(f"{'history:':<22}(no attempts kept)")


def _job(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            info = client.get_job(args.id, queue=args.queue, include_payload=args.payload)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if args.json:
        print(json.dumps(_info_json(info)))
    else:
        _print_info(info)
    return 0


def _acted(args: argparse.Namespace, verb: str, action: JobAction, fenced: list[str]) -> int:
    job = action.job
    if args.json:
        print(
            json.dumps(
                {
                    "id": job.id,
                    "queue": job.queue,
                    "changed": action.changed,
                    "state": job.state,
                    "token": job.token,
                    "fence_token": action.fence_token,
                    "resource": job.resource,
                    "fenced_guards": fenced,
                }
            )
        )
    elif action.changed:
        line = f"{verb} job {job.id} of {job.queue!r}: now {job.state}"
        if action.fence_token:
            line += f"; its claim fenced with token {action.fence_token} ({job.resource})"
        print(line)
        for addr in fenced:
            print(f"fenced {job.resource} to {job.token} at the guard {addr}")
    if not action.changed:
        print(f"error: FAILURE: job {job.id} is {job.state}: nothing to {verb}", file=sys.stderr)
        return exits.FAILURE
    return exits.OK


def _retry(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            action = client.retry_job(args.id, queue=args.queue)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    return _acted(args, "retry", action, [])


def _cancel(args: argparse.Namespace) -> int:
    guards = [GuardClient(addr, **connect.client_options(args)) for addr in args.guard_addr]
    try:
        with _client(args) as client:
            action = client.cancel_job(args.id, queue=args.queue, reason=args.reason, fence=guards)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    finally:
        for guard in guards:
            guard.close()
    fenced = list(args.guard_addr) if action.fence is not None else []
    return _acted(args, "cancel", action, fenced)


def _requeue(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            requeued = client.requeue_dead(args.queue, limit=args.limit)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    if args.json:
        print(json.dumps({"queue": args.queue, "requeued": requeued}))
    else:
        print(f"requeued {requeued} dead jobs of {args.queue!r}")
    return 0


def _pause(args: argparse.Namespace) -> int:
    pausing = args.queue_command == "pause"
    try:
        with _client(args) as client:
            changed = client.pause(args.queue) if pausing else client.resume(args.queue)
    except (FencingError, grpc.RpcError, ValueError) as exc:
        return hints.fail(args, exc, as_json=args.json)
    state = "paused" if pausing else "resumed"
    if args.json:
        print(json.dumps({"queue": args.queue, "paused": pausing, "changed": changed}))
    else:
        print(f"{args.queue!r} {state}" if changed else f"{args.queue!r} already {state}")
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
    queue = sub.add_parser(
        "queue",
        help="queue stats, enqueue a job; list, show, retry, cancel, requeue jobs; periodic jobs",
    )
    qsub = queue.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    worker.register_action(qsub)

    p = qsub.add_parser(
        "stats", help="ready, running, expired, dead, cancelled, oldest age per queue"
    )
    p.add_argument("queue", nargs="?", default="", help="one queue (default: all)")
    p.add_argument(
        "--window",
        type=flags.seconds,
        metavar="DURATION",
        default=0.0,
        help="how much history retry_rate covers: 1h, 30m... (default 5m)",
    )
    _common(p)
    p.set_defaults(run=_stats)

    p = qsub.add_parser("enqueue", help="add one job; PAYLOAD '-' reads stdin")
    p.add_argument("queue")
    p.add_argument("payload")
    p.add_argument("--idempotency-key", default="", help="a second enqueue returns the first job")
    p.add_argument("--ordering-key", default="", help="jobs of one key run one at a time, in order")
    p.add_argument("--priority", type=flags.priority, default=0, help="higher first (-1000..1000)")
    p.add_argument(
        "--max-attempts", type=flags.max_attempts, default=0, help="default: the server's (5)"
    )
    p.add_argument(
        "--delay",
        type=flags.delay,
        metavar="DURATION",
        default=0.0,
        help="how long until it is due: 30s, 5m...",
    )
    p.add_argument("--resource", default="", help="guard resource its token fences")
    _common(p)
    p.set_defaults(run=_enqueue)

    p = qsub.add_parser("jobs", help="list a queue's jobs in id order (one JSON a line: --json)")
    p.add_argument("queue")
    p.add_argument(
        "--state",
        default="",
        choices=["waiting", "scheduled", "ready", "running", "succeeded", "dead", "cancelled"],
        help="only jobs in this state (default: every state); scheduled: ready but not yet "
        "due (a delay, a run_at, a retry's backoff), ready: due now",
    )
    p.add_argument(
        "--page-size", type=flags.page_size, default=0, help="jobs per request (1..1000)"
    )
    p.add_argument("--limit", type=flags.count, default=0, help="stop after this many (0: all)")
    _common(p)
    p.set_defaults(run=_jobs)

    p = qsub.add_parser(
        "job", help="one job: state, last error, token, worker, times, its attempts (a table)"
    )
    p.add_argument("id", type=flags.job_id)
    p.add_argument("--queue", default="", help="the job's queue (auth policies scope by it)")
    p.add_argument("--payload", action="store_true", help="show the payload too")
    _common(p)
    p.set_defaults(run=_job)

    p = qsub.add_parser(
        "retry",
        help="make a dead, cancelled or failed job due now (attempts kept, one more allowed)",
    )
    p.add_argument("id", type=flags.job_id)
    p.add_argument("--queue", default="", help="the job's queue (auth policies scope by it)")
    _common(p)
    p.set_defaults(run=_retry)

    p = qsub.add_parser(
        "cancel",
        help="cancel a waiting, ready or running job; a running job's claim is fenced",
    )
    p.add_argument("id", type=flags.job_id)
    p.add_argument("--queue", default="", help="the job's queue (auth policies scope by it)")
    p.add_argument("--reason", default="", help="kept as the job's last_error")
    p.add_argument(
        "--guard-addr",
        action="append",
        default=[],
        metavar="HOST:PORT",
        type=connect.checker(connect.DEFAULT_GUARD_ADDR),
        help="a monotonic guard to fence to the cancel's token (repeatable); strict and "
        "watch guards fence the cancelled claim by themselves",
    )
    _common(p)
    p.set_defaults(run=_cancel)

    p = qsub.add_parser("requeue", help="retry the dead jobs of a queue (up to --limit a call)")
    p.add_argument("queue")
    p.add_argument(
        "--limit",
        type=flags.integer(0, 1000),
        default=0,
        help="at most this many (1..1000; 0: 1000)",
    )
    _common(p)
    p.set_defaults(run=_requeue)

    for action, what in (
        ("pause", "pause a queue: enqueues go on, no claims until resumed"),
        ("resume", "resume a paused queue"),
    ):
        p = qsub.add_parser(action, help=what)
        p.add_argument("queue")
        _common(p)
        p.set_defaults(run=_pause)

    schedules.register(qsub, _common)
