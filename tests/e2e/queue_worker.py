"""A queue worker process for the end-to-end tests: ``python -m tests.e2e.queue_worker``.

It runs :class:`fencing.worker.Worker` with one of the handlers below and prints one
JSON object per line on stdout (flushed), so the test can follow it; at exit it
prints ``{"event": "exit", "counts": {...}}``. Times are ``time.monotonic()``, which
on Linux is one clock for every process of the host, so intervals compare across
processes.

Handlers:

``record``  sleep ``--work`` seconds between a ``start`` and an ``end`` line.
``effect``  write the job's effect through the guard (idempotency key per job), then
            print ``effect``; with ``--hang`` sleep for ever before returning (a crash
            after the effect, before Complete, when the test kills it).
``late``    print ``start``, sleep ``--work`` seconds (the test freezes the process
            meanwhile), then write ``result`` through the guard and print
            ``effect`` with ``landed`` or ``rejected`` (and the refusal's error
            class); return normally, so the worker sends Complete (and counts
            ``lost`` if it is refused). With ``--early``, first write ``result``
            once while the claim is live and print ``early`` with its outcome.
``hold``    print ``start``, then wait up to ``--work`` seconds for the job to be
            given back (``job.lost``), print ``end``.

``--linger SECONDS`` keeps the process alive that long after ``run()`` returned, so a
handler abandoned at shutdown (past ``--grace``) goes on, as it would in a process
that does more than run the worker.

``--fence`` runs the worker with ``fence=[guard]``: each job's resource is fenced at
the guard before its handler starts (``start`` is printed after the promise).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from fencing import FencingError, GuardClient, Job, QueueClient, StaleTokenError
from fencing.types import Put
from fencing.worker import Worker

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), "at": time.monotonic(), **fields})
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def job_fields(job: Job) -> dict[str, Any]:
    return {
        "job": job.id,
        "token": job.token,
        "attempt": job.attempt,
        "key": job.ordering_key,
        "payload": job.payload.decode(),
    }


def attempt_write(guard: GuardClient, job: Job, value: str) -> dict[str, Any]:
    """Write ``result`` with the job's claim; what happened, as fields of a line."""
    try:
        guard.put(job, "result", value.encode())
    except StaleTokenError as exc:
        out = {"outcome": "rejected", "error": type(exc).__name__, "fence": exc.current_token}
    except FencingError as exc:  # strict mode: the claim is not the live one
        out = {"outcome": "rejected", "error": type(exc).__name__, "fence": None}
    else:
        out = {"outcome": "landed"}
    return {**out, **job_fields(job)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--guard", default="")
    p.add_argument("--queue", default="e2e")
    p.add_argument("--handler", choices=["record", "effect", "late", "hold"], default="record")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--ttl", type=float, default=30.0)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--early", action="store_true")
    p.add_argument("--fence", action="store_true")
    p.add_argument("--linger", type=float, default=0.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    guard = GuardClient(args.guard) if args.guard else None

    def handler(job: Job) -> None:
        emit("start", **job_fields(job))
        if args.handler == "record":
            time.sleep(args.work)
        elif args.handler == "effect":
            assert guard is not None
            result = guard.write(
                job,
                Put(f"effect/{job.id}/{job.token}", str(os.getpid()).encode()),
                idempotency_key=f"effect-{job.id}",
            )
            emit("effect", replayed=result.replayed, **job_fields(job))
            if args.hang:
                while True:
                    time.sleep(1)
        elif args.handler == "late":
            assert guard is not None
            if args.early:
                emit("early", **attempt_write(guard, job, f"early:{job.token}"))
            time.sleep(args.work)
            emit("effect", **attempt_write(guard, job, f"late:{job.token}"))
        elif args.handler == "hold":
            job.lost.wait(args.work)
        emit("end", lost=job.lost.is_set(), **job_fields(job))

    client = QueueClient(args.addr, worker=f"e2e-{os.getpid()}")
    # Only when asked, so the script also runs against a Worker without the option.
    promise: dict[str, Any] = {"fence": [guard]} if args.fence and guard is not None else {}
    worker = Worker(
        client,
        args.queue,
        handler,
        concurrency=args.concurrency,
        ttl=args.ttl,
        grace=args.grace,
        poll=0.2,
        **promise,
    )
    # A SIGTERM between "ready" and run() installing its handlers must stop, not kill.
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    emit("ready")
    try:
        worker.run()
    except BaseException as exc:
        emit("crash", error=repr(exc))
        raise
    emit("exit", counts=worker.counts)
    time.sleep(args.linger)
    client.close()
    if guard is not None:
        guard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
