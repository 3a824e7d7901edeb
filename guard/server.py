"""Build and run the guard: a function builds it, the caller serves it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from fencing._server import (
    BuiltServer,
    ServerOptions,
    Service,
    build_server,
    require_durability,
)
from fencing._storage import StorageMetrics, with_deadline
from fencing.errors import InvalidArgumentError
from fencing.metrics import Metrics
from fencing.v1 import guard_pb2_grpc
from guard.fence import FenceMode
from guard.metrics import GuardMetrics
from guard.service import GuardService
from guard.stores import GuardStore, open_store

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
) -> GuardServer:
    """Open ``store`` (an object or a URL), bind ``address`` (port 0 picks one), start.

    ``options`` sets TLS, authentication, per-client caps, metrics and the store
    deadline (see :class:`~fencing._server.ServerOptions`).
    """
    options, metrics = (options or ServerOptions()).with_metrics()
    st = open_store(store) if isinstance(store, str) else store
    check_mode(st, mode)
    await st.open()
    try:
        require_durability(st, "guard store " + st.name, require_durable)
        timeouts = metrics.group(StorageMetrics).timeouts.labels("guard")
        bounded = with_deadline(st, options.backend_timeout, "guard store", timeouts.inc)
        service, services = guard_services(bounded, mode, metrics.group(GuardMetrics))
        built = await build_server(
            address, services, reflection_enabled=reflection, options=options
        )
        await built.server.start()
    except BaseException:
        await st.close()
        raise
    if mode is FenceMode.OFF:
        log.warning("FENCING IS OFF: this guard accepts stale tokens. Use only as a chaos control.")
    host = address.rsplit(":", 1)[0]
    running = GuardServer(built, st, service, f"{host}:{built.port}", retention_s)
    built.probe_storage(st, "guard", options.backend_timeout, options.health_interval)
    built.spawn(running._prune_forever())
    return running
