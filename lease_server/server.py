"""Build and run the lease server: a function builds it, the caller serves it.

The lease server also hosts the queue service (``fencing.v1.QueueService``) and its
reaper: a claim of a job is a lease on that job, so they live in one process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fencing._version import VERSION
from fencing.v1 import lease_pb2_grpc, queue_pb2_grpc
from lease_server.backends import LeaseBackend, open_backend
from lease_server.backends.base import event_log_of
from lease_server.expiry import DEFAULT_EVENT_RETENTION
from lease_server.metrics import LeaseMetrics
from lease_server.queue.backends import QueueBackend, open_queue, queue_url_for
from lease_server.queue.backends.base import LogsJobEvents
from lease_server.queue.metrics import QueueMetrics
from lease_server.queue.reaper import Reaper
from lease_server.queue.resources import LeaseCalls, counts_job_claims
from lease_server.queue.scheduler import Scheduler
from lease_server.queue.service import QueueOptions, QueueService
from lease_server.service import LeaseService
from serving.admission import DEFAULT_MAX_SESSION_IN_FLIGHT
from serving.metrics import Metrics
from serving.server import (
    BuiltServer,
    ServerOptions,
    Service,
    build_server,
    require_durability,
)
from serving.storage import StorageMetrics, with_deadline

log = logging.getLogger(__name__)

SERVICE_NAME = "fencing.v1.LeaseService"
QUEUE_SERVICE_NAME = "fencing.v1.QueueService"
#: ``queue=QUEUE_OFF`` starts a lease server without the queue service.
QUEUE_OFF = "off"
#: Seconds between sweeps of the ``leases held`` gauge.
SWEEP_INTERVAL_S = 1.0


@dataclass
class LeaseServer:
    """A started lease server. ``address`` is host:port as bound."""

    built: BuiltServer
    backend: LeaseBackend
    service: LeaseService
    address: str
    queue: QueueBackend | None = None
    queue_service: QueueService | None = None

    @property
    def port(self) -> int:
        return self.built.port

    @property
    def metrics(self) -> Metrics:
        return self.built.metrics

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: health NOT_SERVING, answer waiters, drain for ``grace`` s, close.

        Calls already running get up to ``grace`` seconds to finish; Acquire calls
        waiting in line for a held resource are answered at once with
        ``BACKEND_UNAVAILABLE`` (retry, with the same request id, elsewhere or later)
        rather than cut off at the end of the drain. New calls are refused, and Watch
        streams end at once with ``UNAVAILABLE`` (a follower resumes elsewhere or later).
        The queue's reaper and scheduler stop with the other background tasks; Claims waiting for
        work return what they have (nothing) when the drain ends.
        """
        await self.built.enter_shutdown()
        self.service.waiters.close()
        self.service.close()
        await self.built.server.stop(grace)
        await self.backend.close()
        if self.queue is not None:
            await self.queue.close()


def lease_services(
    backend: LeaseBackend,
    metrics: LeaseMetrics | None = None,
    *,
    event_retention: int = DEFAULT_EVENT_RETENTION,
    session_max_in_flight: int = DEFAULT_MAX_SESSION_IN_FLIGHT,
) -> tuple[LeaseService, list[Service]]:
    service = LeaseService(
        backend,
        metrics=metrics,
        event_retention=event_retention,
        session_max_in_flight=session_max_in_flight,
    )
    return service, [
        Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)
    ]


def queue_services(
    backend: QueueBackend,
    options: QueueOptions | None = None,
    metrics: QueueMetrics | None = None,
    leases: LeaseCalls | None = None,
) -> tuple[QueueService, list[Service]]:
    """The queue service; with ``leases`` (the lease service beside it), jobs may name
    their own resource, and their claims hold the lease on it."""
    service = QueueService(backend, options, metrics=metrics, leases=leases)
    return service, [
        Service(QUEUE_SERVICE_NAME, service, queue_pb2_grpc.add_QueueServiceServicer_to_server)
    ]


def _default_claims(queue: QueueBackend) -> Callable[[str], Awaitable[int]]:
    """Describe's job claims of a resource: the queue's own tokens count only for a job's
    default resource; a resource a job names has all its tokens from its leases."""

    async def claims(resource: str) -> int:
        return await queue.last_claim_token(resource) if counts_job_claims(resource) else 0

    return claims


def _queue_backend(
    backend: LeaseBackend | str, queue: QueueBackend | str | None
) -> QueueBackend | None:
    if queue is None:
        url = queue_url_for(backend) if isinstance(backend, str) else ""
        return open_queue(url) if url else None
    if isinstance(queue, str):
        return None if queue == QUEUE_OFF else open_queue(queue)
    return queue


async def start_lease_server(
    backend: LeaseBackend | str,
    address: str = "127.0.0.1:50051",
    *,
    reflection: bool = False,
    options: ServerOptions | None = None,
    require_durable: bool = False,
    event_retention: int = DEFAULT_EVENT_RETENTION,
    queue: QueueBackend | str | None = None,
    queue_options: QueueOptions | None = None,
    local_socket: str = "",
) -> LeaseServer:
    """Open ``backend`` (an object or a URL), bind ``address`` (port 0 picks one), start.
    ``local_socket``: a Unix socket it also listens on (see :func:`serving.server.build_server`).

    ``options`` sets TLS, authentication, per-client caps, metrics and the backend
    deadline (see :class:`~serving.server.ServerOptions`). Also starts the expiry
    sweeper and the event feed (:meth:`LeaseService.run`); the event log keeps the
    newest ``event_retention`` events.

    ``queue`` is the queue service's backend (an object or a URL); by default it is
    derived from a backend URL (:func:`lease_server.queue.backends.queue_url_for`: beside the
    leases), and there is none for a backend object. ``"off"``: no queue service.
    Its calls get the same deadline as the lease backend's; the reaper runs as a
    background task, and so does the scheduler of periodic jobs (``queue_options``: retry
    backoff, retention, reap interval, schedule refresh).
    """
    options, metrics = (options or ServerOptions()).with_metrics()
    be = open_backend(backend) if isinstance(backend, str) else backend
    qb = _queue_backend(backend, queue)
    if qb is not None:
        _link_job_events(qb, be)
    await be.open()
    try:
        require_durability(be, "lease backend " + be.name, require_durable)
        timeouts = metrics.group(StorageMetrics).timeouts.labels("lease")
        bounded = with_deadline(be, options.backend_timeout, "lease backend", timeouts.inc)
        lease_metrics = metrics.group(LeaseMetrics)
        service, services = lease_services(
            bounded,
            lease_metrics,
            event_retention=event_retention,
            session_max_in_flight=options.session_max_in_flight,
        )
        qservice: QueueService | None = None
        if qb is not None:
            await qb.open()
            require_durability(qb, "queue backend " + qb.name, require_durable)
            qtimeouts = metrics.group(StorageMetrics).timeouts.labels("queue")
            qbounded = with_deadline(qb, options.backend_timeout, "queue backend", qtimeouts.inc)
            qservice, more = queue_services(
                qbounded, queue_options, metrics.group(QueueMetrics), leases=service
            )
            service.job_claims = _default_claims(qbounded)
            services += more
        built = await build_server(
            address,
            services,
            reflection_enabled=reflection,
            options=options,
            local_socket=local_socket,
        )
        await built.server.start()
    except BaseException:
        await be.close()
        if qb is not None:
            await qb.close()
        raise
    built.probe_storage(be, "lease", options.backend_timeout, options.health_interval)
    built.spawn(_sweep_forever(lease_metrics))
    built.spawn(service.run())
    if qservice is not None:
        built.spawn(Reaper(qservice.backend, qservice.options).run())
        scheduler = Scheduler(qservice.backend, qservice.options, qservice.metrics)
        qservice.schedules_changed = scheduler.wake
        built.spawn(scheduler.run())
        built.spawn(qservice.refresh_gauges_forever())
    host = address.rsplit(":", 1)[0]
    bound = f"{host}:{built.port}"
    log.info(
        "lease server version %s serving on %s (backend %s, queue %s)",
        VERSION,
        bound,
        be.name,
        qb.name if qb is not None else "off",
    )
    return LeaseServer(built, be, service, bound, qb, qservice)


def _link_job_events(queue: QueueBackend, backend: LeaseBackend) -> None:
    """Have the queue append its claims' events to the lease backend's log (before either
    opens), so ``Watch`` and ``watch``-mode guards see jobs; say so when it cannot."""
    if event_log_of(backend) is None:
        return  # no global log to share (none, or one per resource): nothing to follow
    if isinstance(queue, LogsJobEvents) and queue.log_events_to(backend):
        return
    log.warning(
        "queue backend %s cannot append to the event log of lease backend %s: job claims "
        "are not Watch events, so guards in watch mode fence jobs only monotonically "
        "(keep the queue beside the leases: the default queue URL)",
        queue.name,
        backend.name,
    )


async def _sweep_forever(metrics: LeaseMetrics) -> None:
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        metrics.sweep()
