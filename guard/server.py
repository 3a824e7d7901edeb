"""Build and run the guard: a function builds it, the caller serves it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from fencing._version import VERSION
from fencing.errors import InvalidArgumentError
from fencing.tls import TLSConfig
from fencing.v1 import guard_pb2_grpc
from guard.fence import FenceMode
from guard.follower import HEALTH_SERVICE as WATCH_HEALTH_SERVICE
from guard.follower import FollowerStatus, LeaseFollower
from guard.metrics import GuardMetrics
from guard.service import GuardService
from guard.stores import GuardStore, open_store
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

SERVICE_NAME = "fencing.v1.GuardService"
#: How long a write's idempotency key is remembered (and so deduplicated) by default.
DEFAULT_IDEMPOTENCY_RETENTION_S = 24 * 3600
PRUNE_INTERVAL_S = 60.0


@dataclass
class GuardServer:
    """A started guard. ``address`` is host:port as bound."""

    built: BuiltServer
    store: GuardStore
    service: GuardService
    address: str
    retention_s: float = DEFAULT_IDEMPOTENCY_RETENTION_S
    #: In watch mode, the task following the lease server; its ``status`` says whether
    #: fences currently follow takeovers (see :mod:`guard.follower`).
    follower: LeaseFollower | None = None

    @property
    def port(self) -> int:
        return self.built.port

    @property
    def metrics(self) -> Metrics:
        return self.built.metrics

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_INTERVAL_S)
            cutoff = time.time_ns() // 1_000_000 - int(self.retention_s * 1000)
            try:
                pruned = await self.store.prune_idempotency(cutoff)
            except Exception:
                log.exception("pruning idempotency keys failed; will retry")
            else:
                if pruned:
                    log.info(
                        "pruned %d idempotency keys older than %.0f s", pruned, self.retention_s
                    )

    async def _watch_health(self, status: FollowerStatus) -> None:
        serving = (
            health_pb2.HealthCheckResponse.SERVING
            if status.following
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        # Why it is not following, for `fencing healthcheck` (the reason's metadata).
        self.built.health.set_reason(
            WATCH_HEALTH_SERVICE, "" if status.following else status.last_error or status.state
        )
        await self.built.health.set(WATCH_HEALTH_SERVICE, serving)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: health NOT_SERVING, drain for ``grace`` seconds, close the store."""
        await self.built.enter_shutdown()
        await self.built.server.stop(grace)
        await self.store.close()


def check_mode(store: GuardStore, mode: FenceMode) -> None:
    """``InvalidArgumentError`` unless ``store`` can judge writes in fence ``mode``."""
    if mode is FenceMode.STRICT and not store.supports_strict:
        raise InvalidArgumentError(
            f"fence mode strict needs a store that shares a database with the lease backend "
            f"(postgres or redis); {store.name} cannot check the live lease",
            field="fence_mode",
        )


def guard_services(
    store: GuardStore, mode: FenceMode, metrics: GuardMetrics | None = None
) -> tuple[GuardService, list[Service]]:
    service = GuardService(store, mode, metrics)
    return service, [
        Service(SERVICE_NAME, service, guard_pb2_grpc.add_GuardServiceServicer_to_server)
    ]


async def start_guard(
    store: GuardStore | str,
    address: str = "127.0.0.1:50052",
    *,
    mode: FenceMode = FenceMode.MONOTONIC,
    retention_s: float = DEFAULT_IDEMPOTENCY_RETENTION_S,
    reflection: bool = False,
    options: ServerOptions | None = None,
    require_durable: bool = False,
    lease_server: str = "",
    watch_prefix: str = "",
    lease_credentials: grpc.ChannelCredentials | None = None,
    lease_tls: TLSConfig | None = None,
    lease_token: str | None = None,
    local_socket: str = "",
) -> GuardServer:
    """Open ``store`` (an object or a URL), bind ``address`` (port 0 picks one), start.
    ``local_socket``: a Unix socket it also listens on (see :func:`serving.server.build_server`).

    ``options`` sets TLS, authentication, per-client caps, metrics and the store
    deadline (see :class:`~serving.server.ServerOptions`).

    ``mode=FenceMode.WATCH`` needs ``lease_server`` (host:port; reached with ``lease_tls``
    and ``lease_token`` when auth is on there, or with any ``lease_credentials``): a
    follower task then advances fences from its ``Watch`` stream on ``watch_prefix`` (all
    resources by default) and reports through ``GuardServer.follower.status`` and the
    health entry ``fencing.v1.GuardService/watch``.
    """
    if mode is FenceMode.WATCH and not lease_server:
        raise InvalidArgumentError(
            "fence mode watch needs the lease server's address to follow", field="lease_server"
        )
    options, metrics = (options or ServerOptions()).with_metrics()
    st = open_store(store) if isinstance(store, str) else store
    check_mode(st, mode)
    await st.open()
    try:
        warning = require_durability(st, "guard store " + st.name, require_durable)
        timeouts = metrics.group(StorageMetrics).timeouts.labels("guard")
        bounded = with_deadline(st, options.backend_timeout, "guard store", timeouts.inc)
        service, services = guard_services(bounded, mode, metrics.group(GuardMetrics))
        service.store_name = st.name
        service.durability_warning = warning or ""
        built = await build_server(
            address,
            services,
            reflection_enabled=reflection,
            options=options,
            local_socket=local_socket,
        )
        await built.server.start()
    except BaseException:
        await st.close()
        raise
    if mode is FenceMode.OFF:
        log.warning("FENCING IS OFF: this guard accepts stale tokens. Use only as a chaos control.")
    host = address.rsplit(":", 1)[0]
    running = GuardServer(built, st, service, f"{host}:{built.port}", retention_s)
    log.info(
        "guard version %s serving on %s (store %s, fence mode %s)",
        VERSION,
        running.address,
        st.name,
        mode.value,
    )
    built.probe_storage(st, "guard", options.backend_timeout, options.health_interval)
    built.spawn(running._prune_forever())
    if mode is FenceMode.WATCH:
        await built.health.set(WATCH_HEALTH_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        running.follower = LeaseFollower(
            bounded,
            lease_server,
            prefix=watch_prefix,
            credentials=lease_credentials,
            tls=lease_tls,
            token=lease_token,
            on_state=running._watch_health,
        )
        service.grants = running.follower  # tokens above those seen granted are asked about
        service.follower = running.follower
        built.spawn(running.follower.run())
    return running
