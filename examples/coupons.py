"""Scheduled coupons with three replicas: issued once per (user, campaign), SMS sent once.

Three replicas of a coupon sender (real processes) each run the campaign's scheduler
tick and a worker. A mutex in each replica would protect nothing: they are three
processes. Instead:

- the tick enqueues one job per user with the idempotency key ``<campaign>:<user>``:
  three replicas scheduling the same campaign make one job per user;
- the worker issues the coupon as a fenced guard write whose idempotency key is the
  same (user, campaign) fact, so a job that runs again (a rescue) issues nothing new;
- the SMS provider (a table standing for the remote service) drops a message whose
  stable key ``sms:<campaign>:<user>`` it has seen;
- "sent" is recorded as a guard write fenced by the claim's token, then the job is
  completed (owner-checked): one replica, paused (SIGSTOP) past its claim after
  sending, wakes up to find both its late "sent" and its late completion refused.

Run against ``fencing serve``::

    python -m examples.coupons [--lease-addr 127.0.0.1:50051 --guard-addr 127.0.0.1:50052]

Exit 0 when every user got one coupon and one SMS and the paused replica's "sent"
was refused. Controls: ``--no-unique-key`` (keys per job: every replica issues),
``--unstable-sms-key`` (the message key names the attempt: the rescued user gets a
second SMS), ``--no-fencing`` (its own ``fencing serve --fence-mode off``: the late
"sent" lands).
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

from examples._common import (
    Child,
    Inbox,
    Verdicts,
    emit,
    parse,
    parser,
    say,
    scratch,
    unfenced_servers,
    wait_drained,
)
from fencing import GuardClient, Job, Put, QueueClient, StaleTokenError
from fencing.worker import Worker

USERS = [f"user-{i}" for i in range(6)]
PAUSED_USER = "user-0"  # the replica that sends this user's first attempt is paused
REPLICAS = ["replica-1", "replica-2", "replica-3"]
CAMPAIGN = "spring"


def provider_send(db: Path, key: str, user: str, replica: str) -> bool:
    """The SMS provider: delivers a message unless it has seen its key (its idempotency)."""
    with sqlite3.connect(db, timeout=30) as conn:
        cur = conn.execute("INSERT OR IGNORE INTO sms VALUES (?, ?, ?)", (key, user, replica))
        return cur.rowcount == 1


def replica(args: argparse.Namespace) -> None:
    name, queue_name = args.role, f"{args.run}-coupons"
    queue = QueueClient(args.lease_addr, worker=name)
    guard = GuardClient(args.guard_addr)
    for user in USERS:  # the scheduler tick, run by every replica
        key = f"job-of-{name}-{user}" if args.no_unique_key else f"{CAMPAIGN}:{user}"
        job = queue.enqueue(queue_name, user, idempotency_key=key, resource=f"{args.run}/{user}")
        emit(event="scheduled", user=user, job=job.id, created=job.created)

    def issue_and_send(job: Job) -> None:
        user = job.payload.decode()
        fact = f"job-{job.id}" if args.no_unique_key else f"{CAMPAIGN}:{user}"
        issued = guard.write(job, Put(f"coupon/{CAMPAIGN}", f"C-{job.id}".encode()),
                             idempotency_key=f"issue:{fact}")  # fmt: skip
        if not issued.replayed:
            emit(event="issued", user=user, job=job.id, token=job.token)
        sms_key = f"sms:{CAMPAIGN}:{user}" + (f":{job.token}" if args.unstable_sms_key else "")
        delivered = provider_send(args.provider, sms_key, user, name)
        emit(event="sms", user=user, delivered=delivered, token=job.token)
        if user == PAUSED_USER and job.attempt == 1:
            emit(event="pausing", user=user, token=job.token)
            time.sleep(3 * args.ttl)  # the main role freezes this process right here
        try:  # no job.check() on purpose: the guard's verdict is what counts
            guard.write(job, Put(f"sent/{CAMPAIGN}", name.encode()))
            emit(event="sent", user=user, token=job.token, late=job.lost.is_set())
        except StaleTokenError as exc:
            emit(event="sent_refused", user=user, token=job.token, fence=exc.current_token)
            raise

    # One handler thread: a frozen replica must not freeze inside the provider's table.
    worker = Worker(queue, queue_name, issue_and_send, concurrency=1, ttl=args.ttl,
                    poll=0.2, grace=2, fence=[guard])  # fmt: skip
    worker.run()  # until SIGTERM
    emit(event="counts", **worker.counts)


def main() -> None:
    p = parser(__doc__, fencing_control=True)
    p.add_argument("--no-unique-key", action="store_true", help="control: a key per job")
    p.add_argument("--unstable-sms-key", action="store_true", help="control: key per attempt")
    p.add_argument("--provider", type=Path, help=argparse.SUPPRESS)
    args = parse(p)
    if args.role != "main":
        replica(args)
        return
    if args.no_fencing:
        unfenced_servers(args)
    provider = scratch() / "sms.db"
    with sqlite3.connect(provider) as conn:
        conn.execute("CREATE TABLE sms (message_key TEXT PRIMARY KEY, user TEXT, replica TEXT)")
    flags = ["--provider", str(provider)] + [
        flag for flag, on in [("--no-unique-key", args.no_unique_key),
                              ("--unstable-sms-key", args.unstable_sms_key)] if on
    ]  # fmt: skip
    inbox = Inbox()
    children = [Child("examples.coupons", args, name, *flags, inbox=inbox) for name in REPLICAS]
    paused, event = inbox.expect("pausing")
    paused.signal(signal.SIGSTOP)
    say(paused.role, f"sent {PAUSED_USER}'s SMS with token {event['token']}, then SIGSTOP")
    rescued = inbox.expect("sent", user=PAUSED_USER)[1]  # a live replica, after the ttl
    say("main", f"{PAUSED_USER}'s job rescued and marked sent with token {rescued['token']}")
    paused.signal(signal.SIGCONT)
    _, late = inbox.expect("sent", "sent_refused", user=PAUSED_USER, token=event["token"])
    refused = late["event"] == "sent_refused"
    verdict = f"refused (fence {late.get('fence')})" if refused else "ACCEPTED"
    say(paused.role, f"SIGCONT: late 'sent' with token {late['token']}: {verdict}")
    wait_drained(QueueClient(args.lease_addr), f"{args.run}-coupons")  # the rest finish
    for child in children:
        child.signal(signal.SIGTERM)
    events = [e | {"replica": c.role} for c in children for e in c.finish()]

    scheduled = [e for e in events if e["event"] == "scheduled"]
    jobs = sum(e["created"] for e in scheduled)
    say("main", f"{len(REPLICAS)} replicas scheduled {len(scheduled)} times: {jobs} jobs")
    issued = Counter(e["user"] for e in events if e["event"] == "issued")
    with sqlite3.connect(provider) as conn:
        sms = Counter(user for (user,) in conn.execute("SELECT user FROM sms"))
    lost = sum(e.get("lost", 0) for e in events if e["event"] == "counts")
    print()
    v = Verdicts()
    v.check(
        "each coupon issued once per (user, campaign)",
        all(issued[u] == 1 for u in USERS),
        f"coupons issued per user {dict(sorted(issued.items()))}",
    )
    v.check(
        "the SMS provider sends each user one message",
        all(sms[u] == 1 for u in USERS),
        f"SMS delivered per user {dict(sorted(sms.items()))}",
    )
    v.check("the paused replica's late 'sent' is refused", refused,
            f"token {late['token']}: {verdict}; late completions refused: {lost}")  # fmt: skip
    print("""
  issued twice? never: the (user, campaign) key is one fact, checked where it is stored.
  sent twice?   the job runs at least once, so the sender may send again; the user gets
                one SMS only because the provider drops a repeated message key.""")
    v.exit()


if __name__ == "__main__":
    main()
