"""What every server process shares: error mapping for handlers, and building a grpc.aio server.

Servers are asyncio only. A handler raises :class:`~fencing.errors.FencingError`
subclasses; :func:`rpc` turns them into statuses through the one registry in
:mod:`fencing._status`. ``build_server`` binds (port 0 in tests), adds the standard
health service (one entry per service, plus the overall "") and, on request,
server reflection; ``serve`` is separate, as in grpc's own examples.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fencing import _status
from fencing.errors import FencingError
from fencing.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self_ = TypeVar("Self_")

Handler = Callable[[Self_, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]


def rpc(fn: Handler[Self_, Req, Resp]) -> Handler[Self_, Req, Resp]:
    """Decorate an async unary handler: ``FencingError`` -> its status with ErrorInfo."""

    @functools.wraps(fn)
    async def wrapper(
        self: Self_, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Resp:
        try:
            return await fn(self, request, context)
        except FencingError as exc:
            await _status.abort(context, exc)

    return wrapper


#: Registers a servicer on a server, e.g. ``lease_pb2_grpc.add_LeaseServiceServicer_to_server``.
Registrar = Callable[[Any, grpc.aio.Server], None]


@dataclass
class Service:
    """One gRPC service to host: its full name, servicer, and generated registrar."""

    name: str
    servicer: object
    register: Registrar


@dataclass
class BuiltServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self.service_names:
            await self.health.set(name, status)

    service_names: Sequence[str] = ()


def server_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]


async def build_server(
    address: str,
    services: Sequence[Service],
    *,
    reflection_enabled: bool = False,
) -> BuiltServer:
    """Create a grpc.aio server with ``services`` and health, bound to ``address``.

    Returns it with the bound port, so ``127.0.0.1:0`` works in tests. Not started.
    """
    srv = grpc.aio.server(options=server_options())
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, srv)
    names = [s.name for s in services]
    for svc in services:
        svc.register(svc.servicer, srv)
    if reflection_enabled:
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], srv
        )
    port = srv.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    built = BuiltServer(srv, port, health_servicer, service_names=["", *names])
    await built.set_serving(True)
    return built


def require_durability(component: object, what: str, require: bool) -> str | None:
    """Log (and with ``require``, refuse) a backend or store that may forget what it acked.

    A component says so through an optional ``durability_warning`` attribute (set by
    ``open()``; None when tokens and fences survive a crash). Returns the warning.
    """
    warning: str | None = getattr(component, "durability_warning", None)
    if warning:
        log.warning("%s is not durable: %s", what, warning)
        if require:
            from fencing.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"--require-durable: {what} is not durable: {warning}", field="require_durable"
            )
    return warning


def host_of(address: str) -> str:
    """``127.0.0.1:50051`` -> ``127.0.0.1``; ``[::1]:1`` -> ``::1``."""
    host = address.rsplit(":", 1)[0]
    return host.strip("[]")


async def wait_for_signal() -> str:
    """Block until SIGTERM or SIGINT arrives; return its name."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    received: asyncio.Future[str] = loop.create_future()

    def _on_signal(sig: signal.Signals) -> None:
        if not received.done():
            received.set_result(sig.name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig)
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def configure_logging(level: str = "INFO", fmt: str = "console") -> None:
    """Process-wide logging for server entry points (library code only logs)."""
    if fmt == "json":
        import json

        class _Json(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                return json.dumps(
                    {
                        "ts": self.formatTime(record),
                        "level": record.levelname,
                        "logger": record.name,
                        "msg": record.getMessage(),
                    }
                )

        handler = logging.StreamHandler()
        handler.setFormatter(_Json())
        logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    else:
        logging.basicConfig(
            level=level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            force=True,
        )
