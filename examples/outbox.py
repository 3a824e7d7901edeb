"""The transactional outbox on PostgreSQL: several publishers, owner-checked acknowledgement,
and a publisher paused past its claim whose late publish and late acknowledgement are refused.

The application writes each event in the same transaction as the change it announces
(``INSERT INTO <schema>.outbox``, a view over the queue's jobs): a rolled-back order
leaves no event. Publishers (:class:`fencing.outbox.OutboxPublisher`, the engine of
``fencing outbox run``) claim events with an attempt token and a deadline, publish each
through the guard (resource ``outbox/<aggregate>``, fenced by the token, idempotent by
event id), and acknowledge it with the same token.

One publisher (a real process) claims the first event and is frozen (SIGSTOP) past
its claim; two others rescue that event and publish everything. Woken up (SIGCONT),
the old publisher publishes late (refused: ``STALE_TOKEN``, a newer claim published
to that aggregate) and acknowledges late (refused: ``LEASE_LOST``, the claim is no
longer its own). The database claim alone could not stop the late publish; the token
checked downstream does.

This example needs the application's own PostgreSQL database (and the ``postgres``
extra: ``pip install 'fencing-guard[postgres]'``). Run the servers with the queue (and
so the outbox) in it, then the example with the same URL::

    fencing serve --queue 'postgresql://postgres@127.0.0.1:5432/test?schema=shop'
    python -m examples.outbox --dsn 'postgresql://postgres@127.0.0.1:5432/test?schema=shop'

Exit 0 when every committed event (and no rolled-back one) was published, and both
late calls were refused. Control: ``--no-fencing`` (its own ``fencing serve
--fence-mode off`` on the same database): the late publish is accepted; the
acknowledgement stays owner-checked by the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from examples._common import Child, Verdicts, emit, parse, parser, say, unfenced_servers
from fencing import GuardClient, Job, LeaseLost, Put, QueueClient, StaleTokenError
from fencing.outbox import OUTBOX_QUEUE, GuardSink, OutboxPublisher, event_id

ORDERS = ["order-1", "order-2", "order-3", "order-4"]  # prefixed with the run id in the database


def connect(url: str) -> tuple[psycopg.Connection[tuple[object, ...]], str]:
    """A connection to the application database, and the fencing schema named in ``url``."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema", "fencing")
    return psycopg.connect(urlunsplit(parts._replace(query=urlencode(query)))), schema


def place_orders(url: str, run: str) -> None:
    """The business transactions: each order and its events commit together, or neither."""
    conn, schema = connect(url)
    with conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.orders (id text PRIMARY KEY, "
                             "status text)").format(sql.Identifier(schema)))  # fmt: skip
        insert = sql.SQL("INSERT INTO {}.outbox (aggregate_key, event_id, payload) "
                         "VALUES (%s, %s, %s)").format(sql.Identifier(schema))  # fmt: skip
        for order in [f"{run}-{o}" for o in [*ORDERS, "rolled-back"]]:
            with conn.transaction(force_rollback=order.endswith("rolled-back")):
                conn.execute(sql.SQL("INSERT INTO {}.orders VALUES (%s, 'paid')").format(
                    sql.Identifier(schema)), (order,))  # fmt: skip
                for what in ("created", "paid"):
                    body = json.dumps({"order": order, "event": what}).encode()
                    conn.execute(insert, (order, f"{order}-{what}", body))


def outbox_states(url: str, run: str) -> dict[str, str]:
    conn, schema = connect(url)
    with conn:
        rows = conn.execute(sql.SQL("SELECT event_id, state FROM {}.outbox WHERE event_id LIKE %s")
                            .format(sql.Identifier(schema)), (f"{run}-%",)).fetchall()  # fmt: skip
    return {str(e): str(s) for e, s in rows}


def paused_publisher(args: argparse.Namespace) -> None:
    """Claims one event, is frozen before publishing it, then publishes and acks late."""
    queue, guard = QueueClient(args.lease_addr, worker=args.role), GuardClient(args.guard_addr)
    [job] = queue.claim(OUTBOX_QUEUE, ttl=args.ttl, wait=10)
    eid = event_id(job)
    emit(event="claimed", event_id=eid, token=job.token)
    time.sleep(3 * args.ttl)  # the main role freezes this process right here
    try:
        guard.write(job, Put(f"events/{eid}", job.payload), idempotency_key=eid)
        emit(event="late_publish", refused=False)
    except StaleTokenError as exc:
        emit(event="late_publish", refused=True, why=f"STALE_TOKEN (fence {exc.current_token})")
    try:
        queue.complete(job)
        emit(event="late_ack", refused=False)
    except LeaseLost:
        emit(event="late_ack", refused=True, why="LEASE_LOST")


class BrokerSink(GuardSink):
    """The guard as the broker, with a broker's round trip."""

    async def deliver(self, event: Job) -> None:
        await asyncio.sleep(0.05)
        await super().deliver(event)


async def publisher(args: argparse.Namespace) -> None:
    sink = BrokerSink(args.guard_addr)
    outbox = OutboxPublisher(args.lease_addr, sink, batch=1, ttl=args.ttl, poll=0.2, grace=2)
    await outbox.run()  # until SIGTERM
    emit(event="counts", **outbox.counts)


def main() -> None:
    p = parser(__doc__, fencing_control=True)
    p.add_argument("--dsn", required=True, help="the application database, ?schema= of fencing")
    args = parse(p)
    if args.role == "paused":
        paused_publisher(args)
        return
    if args.role != "main":
        asyncio.run(publisher(args))
        return
    if args.no_fencing:
        unfenced_servers(args, "--queue", args.dsn)
    place_orders(args.dsn, args.run)
    events = outbox_states(args.dsn, args.run)
    say(
        "app",
        f"{len(ORDERS)} orders committed with their events, one rolled back: {len(events)} events",
    )
    slow = Child("examples.outbox", args, "paused", "--dsn", args.dsn)
    _, claimed = slow.inbox.expect("claimed")
    slow.signal(signal.SIGSTOP)
    say("paused", f"claimed {claimed['event_id']} with token {claimed['token']}, then SIGSTOP")
    pubs = [Child("examples.outbox", args, f"publisher-{i}", "--dsn", args.dsn) for i in (1, 2)]
    deadline = time.monotonic() + 60
    while (
        set(outbox_states(args.dsn, args.run).values()) != {"succeeded"}
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    guard = GuardClient(args.guard_addr)
    late_eid = claimed["event_id"]
    rescued = guard.read(f"outbox/{late_eid.rsplit('-', 1)[0]}", f"events/{late_eid}")
    by = rescued.written_by_token if rescued else None
    say("publishers", f"rescued {late_eid}, published it with token {by}; all published")
    slow.signal(signal.SIGCONT)
    publish, ack = slow.inbox.expect("late_publish")[1], slow.inbox.expect("late_ack")[1]
    for what, e in (("publish", publish), ("acknowledgement", ack)):
        say(
            "paused",
            f"SIGCONT: late {what}: {'refused ' + e['why'] if e['refused'] else 'ACCEPTED'}",
        )
    for pub in pubs:
        pub.signal(signal.SIGTERM)
    counts = [next((e for e in pub.finish() if e["event"] == "counts"), {}) for pub in pubs]
    published = {
        eid: guard.read(f"outbox/{eid.rsplit('-', 1)[0]}", f"events/{eid}") is not None
        for eid in events
    }
    print()
    v = Verdicts()
    v.check("events written in the business transaction", sorted(events) == sorted(
        f"{args.run}-{o}-{w}" for o in ORDERS for w in ("created", "paid")),
        f"{len(events)} events of {len(ORDERS)} orders committed, none rolled back")  # fmt: skip
    v.check("several publishers publish every event", all(published.values()),
            f"published {sum(published.values())}/{len(events)}; completed per publisher "
            f"{[c.get('completed', 0) for c in counts]}")  # fmt: skip
    v.check("the paused publisher's late publish is refused", publish["refused"],
            publish.get("why", "accepted"))  # fmt: skip
    v.check("its late acknowledgement is refused (owner-checked)", ack["refused"],
            ack.get("why", "accepted"))  # fmt: skip
    v.exit()


if __name__ == "__main__":
    main()
