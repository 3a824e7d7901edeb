"""Build and run the lease server: a function builds it, the caller serves it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from fencing._server import BuiltServer, Service, build_server, require_durability
from fencing.v1 import lease_pb2_grpc
from lease_server.backends import LeaseBackend, open_backend
from lease_server.expiry import DEFAULT_EVENT_RETENTION
from lease_server.service import LeaseService

SERVICE_NAME = "fencing.v1.LeaseService"


@dataclass
class LeaseServer:
    """A started lease server. ``address`` is host:port as bound."""

    built: BuiltServer
    backend: LeaseBackend
    service: LeaseService
    address: str
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.built.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: health NOT_SERVING, end Watch streams, drain for ``grace``
        seconds, stop the sweeper, close the backend."""
        await self.built.set_serving(False)
        self.service.close()
        await self.built.server.stop(grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.backend.close()


def lease_services(
    backend: LeaseBackend, *, event_retention: int = DEFAULT_EVENT_RETENTION
) -> tuple[LeaseService, list[Service]]:
    service = LeaseService(backend, event_retention=event_retention)
    return service, [
        Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)
    ]


async def start_lease_server(
    backend: LeaseBackend | str,
    address: str = "127.0.0.1:50051",
    *,
    reflection: bool = False,
    event_retention: int = DEFAULT_EVENT_RETENTION,
    require_durable: bool = False,
) -> LeaseServer:
    """Open ``backend`` (an object or a URL), bind ``address`` (port 0 picks one), start.

    Also starts the expiry sweeper and the event feed (see :meth:`LeaseService.run`);
    the event log keeps the newest ``event_retention`` events.
    """
    be = open_backend(backend) if isinstance(backend, str) else backend
    await be.open()
    try:
        require_durability(be, "lease backend " + be.name, require_durable)
        service, services = lease_services(be, event_retention=event_retention)
        built = await build_server(address, services, reflection_enabled=reflection)
        await built.server.start()
    except BaseException:
        await be.close()
        raise
    host = address.rsplit(":", 1)[0]
    running = LeaseServer(built, be, service, f"{host}:{built.port}")
    running._tasks.append(asyncio.create_task(service.run()))
    return running
