"""Build and run the lease server: a function builds it, the caller serves it."""

from __future__ import annotations

from dataclasses import dataclass

from fencing._server import BuiltServer, Service, build_server, require_durability
from fencing.v1 import lease_pb2_grpc
from lease_server.backends import LeaseBackend, open_backend
from lease_server.service import LeaseService

SERVICE_NAME = "fencing.v1.LeaseService"


@dataclass
class LeaseServer:
    """A started lease server. ``address`` is host:port as bound."""

    built: BuiltServer
    backend: LeaseBackend
    service: LeaseService
    address: str

    @property
    def port(self) -> int:
        return self.built.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: health NOT_SERVING, drain for ``grace`` seconds, close the backend."""
        await self.built.set_serving(False)
        await self.built.server.stop(grace)
        await self.backend.close()


def lease_services(backend: LeaseBackend) -> tuple[LeaseService, list[Service]]:
    service = LeaseService(backend)
    return service, [
        Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)
    ]


async def start_lease_server(
    backend: LeaseBackend | str,
    address: str = "127.0.0.1:50051",
    *,
    reflection: bool = False,
    require_durable: bool = False,
) -> LeaseServer:
    """Open ``backend`` (an object or a URL), bind ``address`` (port 0 picks one), start."""
    be = open_backend(backend) if isinstance(backend, str) else backend
    await be.open()
    try:
        require_durability(be, "lease backend " + be.name, require_durable)
        service, services = lease_services(be)
        built = await build_server(address, services, reflection_enabled=reflection)
        await built.server.start()
    except BaseException:
        await be.close()
        raise
    host = address.rsplit(":", 1)[0]
    return LeaseServer(built, be, service, f"{host}:{built.port}")
