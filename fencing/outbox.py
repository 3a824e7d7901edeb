"""The outbox publisher: deliver every event written to the outbox at least once, in order
per aggregate, each delivery fenced by its claim's token.

Events are written by your own transactions into the ``outbox`` view of the fencing
schema in PostgreSQL (installed by ``fencing migrate``; see
``serving/migrations/0004_outbox.sql``): each is a job of queue ``outbox`` whose
idempotency key is the event id and whose ordering key is the aggregate key. The
lease server on that database serves them through the queue service, and
:class:`OutboxPublisher` (``fencing outbox run``) claims them in batches with
attempt tokens and hands each to a :class:`Sink`. The default sink,
:class:`GuardSink`, writes the event through a guard::

    resource = "outbox/<aggregate key>"      (the event's claim token fences it)
    key      = "events/<event id>"           value = the payload
    idempotency_key = the event id           (a redelivery is applied once)

A publisher that pauses past its lease can neither deliver late (its token is older
than the one that delivered the event, or a later event of the aggregate) nor mark the
event published. Delivery is at least once; never exactly once: a sink outside the
guard must deduplicate by event id itself.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc.aio

from fencing.client import _core
from fencing.client._queue import Job
from fencing.client.async_guard import AsyncGuardClient
from fencing.client.async_queue import AsyncQueueClient
from fencing.tls import TLSConfig
from fencing.types import Put
from fencing.worker.aio import AsyncWorker

log = logging.getLogger("fencing.outbox")

#: The queue the ``outbox`` view writes to.
OUTBOX_QUEUE = "outbox"


class Sink(Protocol):
    """Where events go. ``deliver`` may be called more than once per event (with a larger
    token each time); raise to have the event retried after a backoff."""

    async def deliver(self, event: Job) -> None: ...


def event_id(event: Job) -> str:
    """The id the event was written with (its idempotency key), or its job id."""
    return event.idempotency_key or f"job-{event.id}"


class GuardSink:
    """Deliver each event as a fenced, idempotent write to a guard (see the module doc)."""

    def __init__(
        self,
        target: str,
        *,
        key_prefix: str = "events/",
        tls: TLSConfig | None = None,
        token: str | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.target = target
        self.key_prefix = key_prefix
        self.rpc_timeout = rpc_timeout
        self.guard = AsyncGuardClient(
            target, tls=tls, token=token, rpc_timeout=rpc_timeout, channel=channel
        )

    async def deliver(self, event: Job) -> None:
        eid = event_id(event)
        # The event's claim is the fence: a job names its resource and carries its token.
        result = await self.guard.write(
            event, Put(f"{self.key_prefix}{eid}", event.payload), idempotency_key=eid
        )
        log.info(
            "event delivered event_id=%s job_id=%d token=%d%s",
            eid,
            event.id,
            event.token,
            " (replayed)" if result.replayed else "",
        )

    async def aclose(self) -> None:
        await self.guard.aclose()


class OutboxPublisher:
    """Claims outbox events in batches of up to ``batch`` and delivers each to ``sink``.

    ``queue`` is an :class:`AsyncQueueClient` or the address of the lease server whose
    queue backend is the database your transactions write the outbox in. Runs until
    :meth:`stop` or SIGTERM/SIGINT; then finishes the deliveries in flight within
    ``grace`` seconds and gives the rest back.
    """

    def __init__(
        self,
        queue: AsyncQueueClient | str,
        sink: Sink,
        *,
        queue_name: str = OUTBOX_QUEUE,
        batch: int = 100,
        ttl: float = 30.0,
        grace: float = 10.0,
        poll: float = 1.0,
        handle_signals: bool = True,
    ) -> None:
        self.sink = sink
        self.worker = AsyncWorker(
            queue,
            queue_name,
            sink.deliver,
            concurrency=batch,
            ttl=ttl,
            grace=grace,
            poll=poll,
            handle_signals=handle_signals,
        )

    @property
    def counts(self) -> dict[str, int]:
        """Events claimed, completed (published), failed, dead, lost, released..."""
        return self.worker.counts

    async def run(self) -> None:
        await self.worker.run()

    def stop(self, grace: float | None = None) -> None:
        self.worker.stop(grace)


__all__ = ["OUTBOX_QUEUE", "GuardSink", "OutboxPublisher", "Sink", "event_id"]
