"""Scheduling an attempt: one attempt per (step, attempt number), the worker slot re-checked.

Two dispatchers (real processes) race over overlapping scheduling requests: A
dispatches steps 0-7, B steps 4-11, both starting with steps 4-7 at the same instant.
For each step a dispatcher picks the best worker from a snapshot (a pure choice: it
reserves nothing), then

1. reserves a slot of that worker: a lease ``worker/<w>/slot/<k>``, taken only if free
   now (``acquire_nowait``), so the capacity is re-checked where it is held, not in
   the snapshot; no free slot on any worker: "no eligible worker", tried later;
2. creates the attempt: a job enqueued with the idempotency key ``<step>:<attempt>``,
   so the loser of a race gets the winner's attempt back (``created=False``), reuses
   it, and gives its slot back.

Three workers with three slots each: at most 9 of the 12 steps can be placed, and
every step may have at most one attempt 1.

Run against ``fencing serve``::

    python -m examples.scheduling [--lease-addr 127.0.0.1:50051]

It prints each dispatcher's decisions and exits 0 when every step has at most one
attempt and no worker holds more attempts than its slots. Controls:
``--no-attempt-key`` (no idempotency key: the overlapping steps get two attempts),
``--no-slot-check`` (trust the snapshot: workers get more attempts than slots).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from examples._common import Child, Verdicts, emit, parse, parser, say, wait_until
from fencing import Lease, LeaseClient, LeaseHeldError, QueueClient

WORKERS = {"w1": 3, "w2": 3, "w3": 3}
# Both start with the steps they share (4-7), so those requests race.
STEPS = {"A": [4, 5, 6, 7, 0, 1, 2, 3], "B": [4, 5, 6, 7, 8, 9, 10, 11]}


def reserve_slot(leases: LeaseClient, run: str, worker: str) -> Lease | None:
    """A free slot of ``worker``, now held by us, or None: the capacity re-check."""
    for k in range(WORKERS[worker]):
        try:  # held for the attempt's life (here: longer than the example)
            return leases.acquire_nowait(f"{run}/worker/{worker}/slot/{k}", ttl=60)
        except LeaseHeldError:
            continue
    return None


def dispatch(args: argparse.Namespace, name: str) -> None:
    leases = LeaseClient(args.lease_addr, holder=f"dispatcher-{name}")
    queue = QueueClient(args.lease_addr, worker=f"dispatcher-{name}")
    snapshot = Counter[str]()  # what this dispatcher believes each worker runs
    wait_until(args.start_at)
    for step in STEPS[name]:
        ranked = sorted(WORKERS, key=lambda w: (snapshot[w] - WORKERS[w], w))  # the pure choice
        slot: Lease | None = None
        placed = ""
        for worker in ranked:
            if args.no_slot_check:  # control: the snapshot said it had room
                placed = worker
                break
            slot = reserve_slot(leases, args.run, worker)
            if slot is not None:
                placed = worker
                break
        if not placed:
            emit(event="no_worker", dispatcher=name, step=step)
            continue
        payload = json.dumps({"step": step, "attempt": 1, "worker": placed})
        key = "" if args.no_attempt_key else f"step-{step}:1"
        job = queue.enqueue(f"{args.run}-attempts", payload, idempotency_key=key)
        if job.created:
            snapshot[placed] += 1
            emit(event="created", dispatcher=name, step=step, job=job.id, worker=placed)
        else:  # the other dispatcher created it first: reuse it, free the slot we took
            if slot is not None:
                slot.release()
            emit(event="reused", dispatcher=name, step=step, job=job.id)
    leases.close()
    queue.close()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--no-attempt-key", action="store_true", help="control: no idempotency key")
    p.add_argument("--no-slot-check", action="store_true", help="control: trust the snapshot")
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parse(p)
    if args.role != "main":
        dispatch(args, args.role)
        return
    extra = ["--no-attempt-key"] * args.no_attempt_key + ["--no-slot-check"] * args.no_slot_check
    start = time.time() + 1.5  # both dispatchers import and connect, then start together
    children = [
        Child("examples.scheduling", args, name, "--start-at", str(start), *extra) for name in STEPS
    ]
    events = [e for child in children for e in child.finish()]
    for e in events:
        if e["event"] == "created":
            text = f"created attempt 1 of step {e['step']} on {e['worker']}"
        elif e["event"] == "reused":
            text = f"step {e['step']}: attempt 1 exists (job {e['job']}), reused it"
        else:
            text = f"step {e['step']}: no eligible worker, tried later"
        say(f"dispatcher-{e['dispatcher']}", text)

    created = [e for e in events if e["event"] == "created"]
    per_step = Counter(e["step"] for e in created)
    per_worker = Counter(e["worker"] for e in created)
    print()
    v = Verdicts()
    v.check(
        "one attempt per (step, attempt number)",
        all(n == 1 for n in per_step.values()),
        f"attempts created per step {dict(sorted(per_step.items()))}",
    )
    v.check(
        "no worker runs more attempts than its slots",
        all(per_worker[w] <= cap for w, cap in WORKERS.items()),
        f"attempts per worker {dict(sorted(per_worker.items()))}, slots {WORKERS}",
    )
    v.exit()


if __name__ == "__main__":
    main()
