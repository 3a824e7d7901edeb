"""An outbox sent by a single leader, order per aggregate kept, duplicates dropped by id.

Three pods (real processes) campaign for one election (:class:`fencing.Election`);
the leader sends the outbox, in id order, in batches: it appends each batch to the
broker, then advances the outbox cursor, a guard record written with its *term*
(the election lease's token). The broker (a table standing for Kafka) takes whatever
it is sent, so delivery is at least once: the consumer drops duplicates by event id.

The first leader is frozen (SIGSTOP) in the middle of a batch, past its ttl. Another
pod is elected and sends the rest. Then the old leader wakes up: its late batch still
reaches the broker (a broker does not check terms), but its cursor write is refused
(STALE_TOKEN: a newer term was promised to the guard), so it stops sending; the
consumer drops its batch as duplicates, and keeps each aggregate's events in order.

Run against ``fencing serve``::

    python -m examples.outbox_leader [--lease-addr 127.0.0.1:50051 --guard-addr ...]

Exit 0 when terms only grew, the deposed leader's cursor write was refused, and the
consumer processed every event once, in order per aggregate. Controls: ``--no-dedup``
(the consumer processes what the broker holds: duplicates, order broken) and
``--no-fencing`` (its own ``fencing serve --fence-mode off``: the deposed leader's
cursor write lands).
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

from examples._common import Child, Verdicts, emit, parse, parser, say, scratch, unfenced_servers
from fencing import Election, GuardClient, LeaseClient, StaleTokenError

AGGREGATES = ["order-1", "order-2", "order-3"]
EVENTS_EACH = 4
BATCH = 3


def send_while_leading(args: argparse.Namespace, db: sqlite3.Connection) -> None:
    leases, guard = LeaseClient(args.lease_addr, holder=args.role), GuardClient(args.guard_addr)
    election = Election(leases, guard, f"{args.run}/outbox-sender", ttl=args.ttl)
    with election.campaign(args.role) as leader:  # blocks until this pod leads
        emit(event="leader", term=leader.term)
        for batch_no in range(1, 1000):
            record = guard.read(election.name, "cursor")
            cursor = int(record.value) if record else 0
            rows = db.execute("SELECT id, event_id, aggregate, seq FROM outbox WHERE id > ? "
                              "ORDER BY id LIMIT ?", (cursor, BATCH)).fetchall()  # fmt: skip
            if not rows:
                time.sleep(0.05)
                continue
            if args.role == "pod-1" and batch_no == 2:
                emit(event="pausing", term=leader.term, batch=[r[1] for r in rows])
                time.sleep(3 * args.ttl)  # the main role freezes this process right here
            # No leader.check() here on purpose: it would narrow the window, not close it.
            with db:  # the broker takes every message, from anyone: at least once
                db.executemany(
                    "INSERT INTO broker (event_id, aggregate, seq, sender) VALUES (?, ?, ?, ?)",
                    [(eid, agg, seq, args.role) for _, eid, agg, seq in rows],
                )
            try:  # the cursor is fenced by the term: a deposed leader cannot move it
                guard.put(leader, "cursor", str(rows[-1][0]).encode())
            except StaleTokenError as exc:
                emit(event="deposed", term=leader.term, fence=exc.current_token)
                return
            emit(event="sent", term=leader.term, last=rows[-1][0], late=leader.lost.is_set())


def consume(db: sqlite3.Connection, dedup: bool) -> tuple[list[tuple[str, int]], int]:
    """The consumer: reads the broker in order, drops an event id it has processed."""
    seen: set[str] = set()
    processed, dropped = [], 0
    for eid, agg, seq in db.execute("SELECT event_id, aggregate, seq FROM broker ORDER BY n"):
        if dedup and eid in seen:
            dropped += 1
            continue
        seen.add(eid)
        processed.append((agg, seq))
    return processed, dropped


def main() -> None:
    p = parser(__doc__, fencing_control=True)
    p.add_argument("--no-dedup", action="store_true", help="control: process duplicates")
    p.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parse(p)
    if args.role != "main":
        send_while_leading(args, sqlite3.connect(args.db, timeout=30))
        return
    if args.no_fencing:
        unfenced_servers(args)
    path = scratch() / "app.db"
    db = sqlite3.connect(path)
    with db:  # the application's writes, each with its event (several aggregates)
        db.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY, event_id TEXT UNIQUE, "
                   "aggregate TEXT, seq INTEGER)")  # fmt: skip
        db.execute("CREATE TABLE broker (n INTEGER PRIMARY KEY, event_id TEXT, aggregate TEXT, "
                   "seq INTEGER, sender TEXT)")  # fmt: skip
        for seq in range(1, EVENTS_EACH + 1):
            for agg in AGGREGATES:
                db.execute("INSERT INTO outbox (event_id, aggregate, seq) VALUES (?, ?, ?)",
                           (f"{agg}-ev{seq}", agg, seq))  # fmt: skip
    total = EVENTS_EACH * len(AGGREGATES)
    pods = [Child("examples.outbox_leader", args, "pod-1", "--db", str(path))]
    inbox = pods[0].inbox
    say("pod-1", f"elected, term {inbox.expect('leader')[1]['term']}")
    pods += [Child("examples.outbox_leader", args, f"pod-{i}", "--db", str(path), inbox=inbox)
             for i in (2, 3)]  # fmt: skip
    _, pausing = inbox.expect("pausing")
    pods[0].signal(signal.SIGSTOP)
    say("pod-1", f"SIGSTOP in the middle of sending {pausing['batch']}")
    new, elected = inbox.expect("leader")
    say(new.role, f"elected, term {elected['term']}")
    while inbox.expect("sent")[1]["last"] < total:
        pass
    say(new.role, f"sent through outbox id {total}")
    pods[0].signal(signal.SIGCONT)
    _, late = inbox.expect("deposed", "sent", term=pausing["term"])
    refused = late["event"] == "deposed"
    verdict = f"refused (fence {late['fence']})" if refused else "ACCEPTED"
    say("pod-1", f"SIGCONT: its batch reached the broker; its cursor write: {verdict}")
    for pod in pods:
        pod.signal(signal.SIGKILL)
        pod.finish()

    terms = [e["term"] for pod in pods for e in pod.events if e["event"] == "leader"]
    broker = db.execute("SELECT count(*) FROM broker").fetchone()[0]
    processed, dropped = consume(db, dedup=not args.no_dedup)
    in_order = all(
        [seq for a, seq in processed if a == agg] == list(range(1, EVENTS_EACH + 1))
        for agg in AGGREGATES
    )
    print()
    v = Verdicts()
    v.check("one sender at a time, by leadership", refused and len(set(terms)) == len(terms),
            f"terms {sorted(terms)}; the deposed leader's cursor write {verdict}")  # fmt: skip
    v.check("the consumer drops duplicates by event id",
            len(processed) == total and max(Counter(processed).values()) == 1,
            f"broker holds {broker} messages, consumer processed {len(processed)} "
            f"of {total} events, dropped {dropped}")  # fmt: skip
    v.check("order per aggregate kept", in_order,
            "each aggregate's events processed in seq order 1.." + str(EVENTS_EACH))  # fmt: skip
    v.exit()


if __name__ == "__main__":
    main()
