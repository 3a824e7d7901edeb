"""Build and run the lease server: a function builds it, the caller serves it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fencing._server import (
    BuiltServer,
    ServerOptions,
    Service,
    build_server,
    require_durability,
)
from fencing._storage import StorageMetrics, with_deadline
from fencing.metrics import Metrics
from fencing.v1 import lease_pb2_grpc
from lease_server.backends import LeaseBackend, open_backend
from lease_server.expiry import DEFAULT_EVENT_RETENTION
from lease_server.metrics import LeaseMetrics
from lease_server.service import LeaseService

SERVICE_NAME = "fencing.v1.LeaseService"
#: Seconds between sweeps of the ``leases held`` gauge.
SWEEP_INTERVAL_S = 1.0


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
        """
        await self.built.enter_shutdown()
        self.service.waiters.close()
        self.service.close()
        await self.built.server.stop(grace)
        await self.backend.close()


def lease_services(
    backend: LeaseBackend,
    metrics: LeaseMetrics | None = None,
    *,
    event_retention: int = DEFAULT_EVENT_RETENTION,
) -> tuple[LeaseService, list[Service]]:
    service = LeaseService(backend, metrics=metrics, event_retention=event_retention)
    return service, [
        Service(SERVICE_NAME, service, lease_pb2_grpc.add_LeaseServiceServicer_to_server)
    ]


async def start_lease_server(
    backend: LeaseBackend | str,
    address: str = "127.0.0.1:50051",
    *,
    reflection: bool = False,
    options: ServerOptions | None = None,
    require_durable: bool = False,
    event_retention: int = DEFAULT_EVENT_RETENTION,
) -> LeaseServer:
    """Open ``backend`` (an object or a URL), bind ``address`` (port 0 picks one), start.

    ``options`` sets TLS, authentication, per-client caps, metrics and the backend
    deadline (see :class:`~fencing._server.ServerOptions`). Also starts the expiry
    sweeper and the event feed (:meth:`LeaseService.run`); the event log keeps the
    newest ``event_retention`` events.
    """
    options, metrics = (options or ServerOptions()).with_metrics()
    be = open_backend(backend) if isinstance(backend, str) else backend
    await be.open()
    try:
        require_durability(be, "lease backend " + be.name, require_durable)
        timeouts = metrics.group(StorageMetrics).timeouts.labels("lease")
        bounded = with_deadline(be, options.backend_timeout, "lease backend", timeouts.inc)
        lease_metrics = metrics.group(LeaseMetrics)
        service, services = lease_services(bounded, lease_metrics, event_retention=event_retention)
        built = await build_server(
            address, services, reflection_enabled=reflection, options=options
        )
        await built.server.start()
    except BaseException:
        await be.close()
        raise
    built.probe_storage(be, "lease", options.backend_timeout, options.health_interval)
    built.spawn(_sweep_forever(lease_metrics))
    built.spawn(service.run())
    host = address.rsplit(":", 1)[0]
    return LeaseServer(built, be, service, f"{host}:{built.port}")


async def _sweep_forever(metrics: LeaseMetrics) -> None:
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        metrics.sweep()
