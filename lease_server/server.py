"""Build and run the lease server: a function builds it, the caller serves it.

The lease server also hosts the queue service (``fencing.v1.QueueService``) and its
reaper: a claim of a job is a lease on that job, so they live in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from fencing._server import BuiltServer, Service, build_server
from fencing.v1 import lease_pb2_grpc, queue_pb2_grpc
from lease_server.backends import LeaseBackend, open_backend
from lease_server.queue_service import QueueOptions, QueueService
from lease_server.queues import QueueBackend, open_queue, queue_url_for
from lease_server.reaper import Reaper
from lease_server.service import LeaseService

SERVICE_NAME = "fencing.v1.LeaseService"
QUEUE_SERVICE_NAME = "fencing.v1.QueueService"
#: ``queue=QUEUE_OFF`` starts a lease server without the queue service.
QUEUE_OFF = "off"


@dataclass
class LeaseServer:
    """A started lease server. ``address`` is host:port as bound."""

    built: BuiltServer
    backend: LeaseBackend
    service: LeaseService
    address: str
    queue: QueueBackend | None = None
    queue_service: QueueService | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.built.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: health NOT_SERVING, drain for ``grace`` seconds, stop the reaper,
        close the backends."""
        await self.built.set_serving(False)
        await self.built.server.stop(grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.backend.close()
        if self.queue is not None:
            await self.queue.close()


def lease_services(backend: LeaseBackend) -> tuple[LeaseService, list[Service]]:
    service = LeaseService(backend)
    return service, [
        Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)
    ]


def queue_services(
    backend: QueueBackend, options: QueueOptions | None = None
) -> tuple[QueueService, list[Service]]:
    service = QueueService(backend, options)
    return service, [
        Service(QUEUE_SERVICE_NAME, service, queue_pb2_grpc.add_QueueServiceServicer_to_server)
    ]


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
    queue: QueueBackend | str | None = None,
    queue_options: QueueOptions | None = None,
) -> LeaseServer:
    """Open ``backend`` (an object or a URL), bind ``address`` (port 0 picks one), start.

    ``queue`` is the queue service's backend (an object or a URL); by default it is
    derived from a backend URL (:func:`lease_server.queues.queue_url_for`: beside the
    leases), and there is none for a backend object. ``"off"``: no queue service.
    """
    be = open_backend(backend) if isinstance(backend, str) else backend
    qb = _queue_backend(backend, queue)
    await be.open()
    try:
        if qb is not None:
            await qb.open()
        service, services = lease_services(be)
        qservice: QueueService | None = None
        if qb is not None:
            qservice, more = queue_services(qb, queue_options)
            services += more
        built = await build_server(address, services, reflection_enabled=reflection)
        await built.server.start()
    except BaseException:
        await be.close()
        if qb is not None:
            await qb.close()
        raise
    host = address.rsplit(":", 1)[0]
    running = LeaseServer(built, be, service, f"{host}:{built.port}", qb, qservice)
    if qb is not None and qservice is not None:
        running._tasks.append(asyncio.create_task(Reaper(qb, qservice.options).run()))
    return running
