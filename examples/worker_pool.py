"""A robust worker pool: the final checklist of a PostgreSQL-backed Go pool, each line
shown true by what three worker processes do.

Three workers (real processes, :class:`fencing.worker.Worker`, two handler threads
each) share one queue. The handler works in slices and stops when its claim is lost;
its one effect is a guard write fenced by the claim's token and idempotent by the
job's key. The main role then breaks things on purpose:

- SIGKILL a worker in the middle of a job (a crash): another claims it after the ttl;
- SIGSTOP another past its claim (a pause): on SIGCONT its heartbeat is refused, the
  handler sees ``job.lost`` and stops; the rescuer's effect is the only one;
- a job that always fails (backs off, then dead); one that fails after its effect
  landed once (the retry's effect is replayed, not applied again);
- SIGTERM a worker running a long job: no new work starts, the job is given back
  after the grace and runs elsewhere.

Run against ``fencing serve``::

    python -m examples.worker_pool [--lease-addr 127.0.0.1:50051 --guard-addr ...]

Exit 0 when every line of the checklist held. Control: ``--no-idempotency-key`` (the
retried job's effect is applied twice).
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import time
from collections import Counter, defaultdict
from typing import Any

from examples._common import Child, Inbox, Verdicts, emit, parse, parser, say, wait_drained
from fencing import GuardClient, Job, Put, QueueClient, StaleTokenError
from fencing.worker import Worker

LONG = 6.0  # a long job's work, in ttls


def worker(args: argparse.Namespace) -> None:
    name, ttl = args.role, args.ttl
    rpc, poll, grace = ttl / 3, ttl / 5, ttl / 2  # every wait well under the lease
    queue = QueueClient(args.lease_addr, worker=name, rpc_timeout=rpc)
    guard = GuardClient(args.guard_addr, rpc_timeout=rpc)

    def handle(job: Job) -> None:
        p, key = json.loads(job.payload), job.idempotency_key
        emit(event="started", key=key, worker=name, token=job.token, attempt=job.attempt,
             t=time.time())  # fmt: skip
        if not p.get("message"):
            raise ValueError("message is required")
        end = time.monotonic() + p["work"] * ttl
        while time.monotonic() < end:  # work in slices; stop as soon as the claim is lost
            if job.lost.wait(0.05):
                emit(event="stopped_on_loss", key=key, worker=name, token=job.token,
                     why=job.lost_reason)  # fmt: skip
                job.check()  # raises LeaseLost: the worker drops the job
        try:
            effect = Put(f"processed/{key}", p["message"].encode())
            result = guard.write(
                job, effect, idempotency_key="" if args.no_idempotency_key else key
            )
            emit(event="effect", key=key, token=job.token, replayed=result.replayed)
        except StaleTokenError:
            emit(event="effect_refused", key=key, token=job.token)
            raise
        if p.get("fail_after_effect") and job.attempt == 1:  # a crash between effect and ack
            raise RuntimeError("failed after the effect")

    pool = Worker(queue, f"{args.run}-pool", handle, concurrency=2, ttl=ttl, poll=poll,
                  grace=grace, handle_signals=False, fence=[guard])  # fmt: skip

    def on_sigterm(signum: int, frame: object) -> None:
        pool.stop()  # before telling anyone: work that appears from here on is not ours
        emit(event="stopping", worker=name, t=time.time())

    signal.signal(signal.SIGTERM, on_sigterm)
    emit(event="ready", worker=name, rpc=rpc, poll=poll, grace=grace, heartbeat=ttl / 3)
    pool.run()
    emit(event="stopped", worker=name, t=time.time())


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--no-idempotency-key", action="store_true", help="control: effects unkeyed")
    args = parse(p)
    if args.role != "main":
        worker(args)
        return
    flags = ["--no-idempotency-key"] * args.no_idempotency_key
    inbox = Inbox()
    workers = [Child("examples.worker_pool", args, f"w{i}", *flags, inbox=inbox) for i in (1, 2, 3)]
    ready = [inbox.expect("ready")[1] for _ in workers]
    queue, qname = QueueClient(args.lease_addr), f"{args.run}-pool"

    def enqueue(key: str, priority: int = 0, max_attempts: int = 5, **payload: Any) -> bool:
        body = json.dumps({"message": f"hello {key}", "work": 0.2} | payload)
        job = queue.enqueue(qname, body, idempotency_key=key, priority=priority,
                            max_attempts=max_attempts)  # fmt: skip
        return job.created

    enqueue("crash-me", priority=10, work=LONG)
    enqueue("pause-me", priority=9, work=LONG)
    for i in range(8):
        enqueue(f"welcome-{i}")
    duplicate_created = enqueue("welcome-0")  # a repeated delivery of the same request
    enqueue("effect-then-fail", fail_after_effect=True)

    crashed = inbox.expect("started", key="crash-me")[0]
    crashed.signal(signal.SIGKILL)
    t_kill = time.time()
    say(crashed.role, "SIGKILL in the middle of crash-me")
    paused = inbox.expect("started", key="pause-me")[0]
    while paused is crashed:  # it ran both: wait for pause-me's rescue by a live worker
        paused = inbox.expect("started", key="pause-me")[0]
    paused.signal(signal.SIGSTOP)
    say(paused.role, "SIGSTOP in the middle of pause-me")
    time.sleep(3 * args.ttl)
    paused.signal(signal.SIGCONT)
    stop = inbox.expect("stopped_on_loss", key="pause-me", worker=paused.role)[1]
    say(paused.role, f"SIGCONT: its claim was lost ({stop['why']}); the handler stopped")
    wait_drained(queue, qname)

    enqueue("invalid", max_attempts=3, message="")  # on idle workers: its gaps are the backoff
    wait_drained(queue, qname)

    enqueue("shutdown-me", priority=10, work=LONG)
    leaving = inbox.expect("started", key="shutdown-me")[0]
    leaving.signal(signal.SIGTERM)
    t_term = time.time()
    inbox.expect("stopping", worker=leaving.role)
    for i in range(4):  # work that appears once the shutdown began
        enqueue(f"after-shutdown-{i}")
    leaving.finish()
    say(leaving.role, f"SIGTERM during shutdown-me: exited after {time.time() - t_term:.2f} s")
    wait_drained(queue, qname)
    stats = queue.stats(qname)[0]
    for w in workers:
        if w.proc.poll() is None:
            w.signal(signal.SIGTERM)
        w.finish()
    events = [e for w in workers for e in w.events]

    starts = defaultdict(list)
    for e in (e for e in events if e["event"] == "started"):
        starts[e["key"]].append(e)
    tokens = [e["token"] for runs in starts.values() for e in runs]
    broken = {crashed.role, paused.role, leaving.role}  # runs that may be cut short
    reruns_explained = all(
        e["worker"] in broken or k in ("invalid", "effect-then-fail")
        for k, runs in starts.items()
        for e in sorted(runs, key=lambda e: e["t"])[:-1]
    )
    rescue = [e for e in starts["crash-me"] if e["worker"] != crashed.role]
    late_starts = [e for k, runs in starts.items() if k.startswith("after-shutdown")
                   for e in runs if e["worker"] == leaving.role]  # fmt: skip
    invalid = sorted(e["t"] for e in starts["invalid"])
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(invalid)]
    effects = Counter(e["key"] for e in events if e["event"] == "effect" and not e["replayed"])
    retried = "effect-then-fail"
    rescuer, rescued_after = (rescue[0]["worker"], rescue[0]["t"] - t_kill) if rescue else ("", 0)
    limits = ready[0]
    waits = f"rpc {limits['rpc']:.2f} s, claim wait {limits['poll']:.2f} s"
    waits += f", grace {limits['grace']:.2f} s, heartbeat every {limits['heartbeat']:.2f} s"
    print()
    v = Verdicts()
    v.check(
        "concurrent workers never share a live claim",
        len(set(tokens)) == len(tokens) and reruns_explained,
        f"{len(tokens)} claims, each with its own token; a job ran again only after its "
        "worker crashed, paused or stopped, or it failed",
    )
    v.check(
        "a graceful shutdown starts no new work",
        not late_starts,
        f"{leaving.role} started {len(late_starts)} of the jobs enqueued after SIGTERM; "
        f"shutdown-me ran on {[e['worker'] for e in starts['shutdown-me']]}",
    )
    v.check(
        "a crashed worker's job is claimed again after its lease",
        bool(rescue),
        f"crash-me rescued by {rescuer} {rescued_after:.2f} s after SIGKILL (ttl {args.ttl:g} s)",
    )
    v.check(
        "the heartbeat stops work when the claim is lost",
        not [e for e in events if e["event"] == "effect" and e["token"] == stop["token"]],
        f"{paused.role} stopped pause-me without its effect; the rescuer wrote it",
    )
    v.check(
        "failed jobs retry with backoff and end dead",
        len(gaps) == 2 and gaps[1] > gaps[0] and stats.dead == 1,
        f"invalid: {len(invalid)} attempts, gaps {gaps} s, dead jobs {stats.dead}",
    )
    v.check(
        "repeated delivery makes one effect per idempotency key",
        not duplicate_created and all(n == 1 for n in effects.values()),
        f"duplicate enqueue created={duplicate_created}; {retried} ran "
        f"{len(starts[retried])} times, its effect applied {effects[retried]} time(s)",
    )
    v.check(
        "timeouts stay under the lease",
        max(limits["rpc"], limits["poll"], limits["grace"], limits["heartbeat"]) < args.ttl,
        f"{waits} < ttl {args.ttl:g} s",
    )
    print(f"\n  queue stats: succeeded {stats.succeeded}, dead {stats.dead}")
    v.exit()


if __name__ == "__main__":
    main()
