"""What every server process shares: error mapping for handlers, and building a grpc.aio server.

Servers are asyncio only. A handler raises :class:`~fencing.errors.FencingError`
subclasses; :func:`rpc` turns them into statuses through the one registry in
:mod:`fencing._status`. ``build_server`` binds (port 0 in tests), adds the standard
health service (one entry per service, plus the overall "") and, on request,
server reflection; ``serve`` is separate, as in grpc's own examples.

Every server built here gets the same edge from its :class:`ServerOptions`: TLS or
mTLS (plaintext only on loopback unless ``insecure``), one interceptor for gRPC
metrics and one for authentication, authorization and per-client caps
(:mod:`serving.admission`). ``BuiltServer.probe_storage`` flips health to
NOT_SERVING while the backend is unreachable; ``BuiltServer.enter_shutdown`` flips
it for good before a drain.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fencing import _status
from fencing.errors import FencingError
from fencing.limits import MAX_MESSAGE_BYTES
from fencing.tls import TLSConfig, check_transport, split_address
from serving import handlers, storage
from serving.admission import (
    DEFAULT_MAX_SESSION_IN_FLIGHT,
    DEFAULT_MAX_WAITERS,
    DEFAULT_MAX_WATCH_STREAMS,
    Admission,
    AdmissionInterceptor,
    EdgeMetrics,
)
from serving.auth import AuthPolicy
from serving.logs import banner
from serving.metrics import GrpcMetrics, Metrics, MetricsInterceptor, RuntimeMetrics
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self_ = TypeVar("Self_")

#: HTTP/2 keepalive of every server: a PING after this long without a frame from the
#: peer, and the connection (its streams: a lease Session, a WriteStream) closed when
#: the answer is this late. A dead or paused client is noticed within their sum, 15 s
#: (its leases need no such notice: they expire by their ttl; this frees the calls it
#: left waiting, and their per-client slots).
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
#: Clients may PING this often, streams open or not (the SDK's channels ping every 30 s;
#: a client watching a short ttl may ping faster); more often is ENHANCE_YOUR_CALM.
MIN_CLIENT_PING_INTERVAL_MS = 1_000


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
        except grpc.aio.AbortError:
            raise
        except Exception:
            # Logged once, here, with its traceback; the caller gets INTERNAL without
            # the exception's text, which may name internals.
            log.error(
                "%s failed", fn.__qualname__, exc_info=True, extra={"handler": fn.__qualname__}
            )
            await context.abort(grpc.StatusCode.INTERNAL, "internal error: see the server's log")

    return wrapper


class DecodeInterceptor(handlers.HandlerInterceptor):
    """Answers a request that cannot be decoded with ``INVALID_ARGUMENT`` naming the
    field (:func:`serving.handlers.decoding`), for every method of the server. It sits
    inside the metrics interceptor (the refusal is counted) and outside admission
    (which reads the request's names to authorize it)."""

    def wrap(self, handler: handlers.Handler, method: str) -> handlers.Handler:
        return handlers.decoding(handler, method)


#: Registers a servicer on a server, e.g. ``lease_pb2_grpc.add_LeaseServiceServicer_to_server``.
Registrar = Callable[[Any, grpc.aio.Server], None]


@dataclass
class Service:
    """One gRPC service to host: its full name, servicer, and generated registrar."""

    name: str
    servicer: object
    register: Registrar


@dataclass(frozen=True)
class ServerOptions:
    """How a server is hosted, beyond its address and services.

    ``tls``: serve TLS (mTLS when it has a ``ca``); without it the address must be
    loopback unless ``insecure``. ``auth``: the policy naming principals and their
    grants; None means authentication is off, except that mTLS alone turns it on
    with every certificate the CA signed allowed everything. ``max_waiters`` and
    ``max_watch_streams``: per-client caps. ``session_max_in_flight``: acquires in
    flight per lease Session stream (and as many renewals and releases apart).
    ``metrics``: the process's metrics (a private registry when None).
    ``backend_timeout``: the deadline of every backend or store call.
    ``health_interval``: seconds between backend health probes.
    ``reuse_port``: share the port with sibling worker processes.
    """

    tls: TLSConfig | None = None
    insecure: bool = False
    auth: AuthPolicy | None = None
    max_waiters: int = DEFAULT_MAX_WAITERS
    max_watch_streams: int = DEFAULT_MAX_WATCH_STREAMS
    session_max_in_flight: int = DEFAULT_MAX_SESSION_IN_FLIGHT
    #: HTTP/2 keepalive (see :data:`KEEPALIVE_TIME_MS`); shorter in tests.
    keepalive_time_ms: int = KEEPALIVE_TIME_MS
    keepalive_timeout_ms: int = KEEPALIVE_TIMEOUT_MS
    metrics: Metrics | None = None
    backend_timeout: float = storage.DEFAULT_BACKEND_TIMEOUT
    health_interval: float = storage.DEFAULT_HEALTH_INTERVAL
    #: Bind with ``SO_REUSEPORT``: one of the processes of ``--workers N`` (serving.supervisor).
    reuse_port: bool = False

    def with_metrics(self) -> tuple[ServerOptions, Metrics]:
        """These options with ``metrics`` set (a fresh private registry if it was None)."""
        if self.metrics is not None:
            return self, self.metrics
        metrics = Metrics()
        return dataclasses.replace(self, metrics=metrics), metrics

    @property
    def auth_policy(self) -> AuthPolicy | None:
        if self.auth is not None:
            return self.auth
        if self.tls is not None and self.tls.mutual:
            return AuthPolicy.mtls_only()
        return None


#: Trailing metadata of a health Check whose entry is not SERVING for a known reason.
HEALTH_REASON_KEY = "fencing-health-reason"


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]  # untyped base
    """``grpc.health.v1``, which says why an entry is not serving when the server knows
    (:meth:`set_reason`): ``Check`` then carries it in the trailing metadata
    ``fencing-health-reason`` (``fencing healthcheck`` prints it). Statuses are unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: dict[str, str] = {}

    def set_reason(self, service: str, reason: str) -> None:
        """Why ``service`` is not serving ('' to forget it); printable ASCII, one line."""
        text = " ".join(reason.encode("ascii", "replace").decode().split())
        if text:
            self.reasons[service] = text[:1000]
        else:
            self.reasons.pop(service, None)

    async def Check(self, request: Any, context: Any) -> Any:
        reply = await super().Check(request, context)
        reason = self.reasons.get(request.service, "")
        if reason and reply.status != health_pb2.HealthCheckResponse.SERVING:
            context.set_trailing_metadata(((HEALTH_REASON_KEY, reason),))
        return reply


@dataclass
class BuiltServer:
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    service_names: Sequence[str] = ()
    metrics: Metrics = field(default_factory=Metrics)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self.service_names:
            await self.health.set(name, status)

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` for the server's lifetime; cancelled by :meth:`enter_shutdown`."""
        self.tasks.append(asyncio.ensure_future(coro))

    def probe_storage(self, backend: object, role: str, timeout: float, interval: float) -> None:
        """Every ``interval`` s ask ``backend.healthy()``; NOT_SERVING while it says no."""
        up = self.metrics.group(storage.StorageMetrics).up.labels(role)
        up.set(1)

        async def probe_forever() -> None:
            serving = True
            while True:
                await asyncio.sleep(interval)
                ok = await storage.healthy(backend, timeout)
                up.set(1 if ok else 0)
                if ok != serving:
                    serving = ok
                    # The one line per change of state: the loops that fail meanwhile
                    # (expiry, reaper, scheduler, listener, pools) log at DEBUG only.
                    if ok:
                        log.warning(
                            "%s backend back: it passes its health probe again; SERVING", role
                        )
                    else:
                        # Unreachable, or (a Redis under require_durable) no longer
                        # durable: the backend's own log line says which.
                        log.error(
                            "%s backend down: it fails its health probe (unreachable, or not "
                            "durable under --require-durable); NOT_SERVING until it is back",
                            role,
                        )
                    await self.set_serving(ok)

        self.spawn(probe_forever())

    async def enter_shutdown(self) -> None:
        """Stop background tasks and report NOT_SERVING for good (before draining)."""
        tasks, self.tasks = self.tasks, []
        await cancel_and_wait(*tasks)
        await self.health.enter_graceful_shutdown()


def server_options(
    reuse_port: bool = False,
    keepalive_time_ms: int = KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = KEEPALIVE_TIMEOUT_MS,
) -> list[tuple[str, int]]:
    """Channel options of every server. ``SO_REUSEPORT`` stays off (a second server on a
    port in use must fail to bind) except for the workers of ``--workers N``."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        # grpc-core (1.85) bounds the keepalive's PING by this one too (default 60 s):
        # without it a paused peer was never dropped within keepalive_timeout.
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_pings_without_data", 0),
    ]


async def build_server(
    address: str,
    services: Sequence[Service],
    *,
    reflection_enabled: bool = False,
    options: ServerOptions | None = None,
    local_socket: str = "",
) -> BuiltServer:
    """Create a grpc.aio server with ``services`` and health, bound to ``address``.

    Returns it with the bound port, so ``127.0.0.1:0`` works in tests. Not started.
    Raises ``ValueError`` for plaintext on a non-loopback address without ``insecure``.
    ``local_socket``: also listen, in plaintext, on that Unix socket path (for a client
    in the same process or host that cannot verify the TLS listener; the caller keeps it
    in a directory only its own user can enter). Authentication applies there as on
    ``address``.
    """
    options = options or ServerOptions()
    check_transport(address, options.tls, options.insecure)
    metrics = options.metrics or Metrics()
    admission = Admission(
        options.auth_policy,
        max_waiters=options.max_waiters,
        max_watch_streams=options.max_watch_streams,
    )
    srv = grpc.aio.server(
        interceptors=[
            MetricsInterceptor(metrics.group(GrpcMetrics)),
            DecodeInterceptor(),
            AdmissionInterceptor(admission, metrics.group(EdgeMetrics)),
        ],
        options=server_options(
            options.reuse_port, options.keepalive_time_ms, options.keepalive_timeout_ms
        ),
    )
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, srv)
    names = [s.name for s in services]
    for svc in services:
        svc.register(svc.servicer, srv)
    if reflection_enabled:
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], srv
        )
    if not options.reuse_port:
        probe_bind(address)
    if options.tls is not None:
        port = srv.add_secure_port(address, options.tls.server_credentials())
    else:
        port = srv.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    if local_socket and srv.add_insecure_port(f"unix:{local_socket}") == 0:
        raise OSError(f"cannot bind unix:{local_socket}")
    built = BuiltServer(srv, port, health_servicer, ["", *names], metrics=metrics)
    await built.set_serving(True)
    return built


def probe_bind(address: str) -> None:
    """Raise OSError ("cannot bind") if ``address`` is in use, before gRPC tries: its C
    core would print a line of its own ahead of the server's PORT_IN_USE. Binds as
    gRPC does (SO_REUSEADDR); a name that does not resolve, or any other bind error,
    is left to gRPC."""
    host, port = split_address(address)
    if not port.isdigit() or int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                # Only "in use" is certain; anything else (an IPv6 name on a host
                # without IPv6) gRPC judges for itself.
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"cannot bind {address}: {exc.strerror}") from None


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
    return split_address(address)[0]


class Stoppable(Protocol):
    async def stop(self, grace: float = ...) -> None: ...


async def serve_until_signal(
    servers: Sequence[Stoppable],
    *,
    grace: float,
    metrics: Metrics | None = None,
    metrics_port: int = 0,
    metrics_host: str = "127.0.0.1",
    on_ready: Callable[[], None] | None = None,
) -> str:
    """Serve ``/metrics`` (unless port 0), wait for SIGTERM/SIGINT, then stop ``servers``.

    Each server reports NOT_SERVING, stops accepting and drains its calls for up to
    ``grace`` seconds, then closes its backend. Returns the signal's name.
    ``on_ready`` (the start banner) runs once the signal handlers are in place, so a
    SIGTERM sent as soon as the banner is read drains instead of killing the process.
    """
    signals = SignalWaiter()
    endpoint = None
    try:
        if on_ready is not None:
            on_ready()
        if metrics is not None and metrics_port:
            metrics.group(RuntimeMetrics).track(asyncio.get_running_loop())
            endpoint = metrics.serve_http(metrics_port, metrics_host)
            url = f"http://{metrics_host}:{endpoint.port}/metrics"
            banner(f"metrics on {url}", metrics_url=url)
        name = await signals.received
        # A normal stop, so INFO: a WARNING here would page on every deploy.
        log.info("%s: draining", name, extra={"signal": name, "grace_s": grace})
        await asyncio.gather(*(server.stop(grace) for server in servers))
        log.info("stopped", extra={"signal": name})
        return name
    finally:
        signals.close()
        if endpoint is not None:
            endpoint.close()


class SignalWaiter:
    """SIGTERM and SIGINT handlers on the running loop from construction until
    :meth:`close`; ``received`` resolves to the first signal's name."""

    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self) -> None:
        import signal

        self._loop = asyncio.get_running_loop()
        self.received: asyncio.Future[str] = self._loop.create_future()
        self._signals = [signal.Signals[name] for name in self.SIGNALS]
        for sig in self._signals:
            self._loop.add_signal_handler(sig, self._on_signal, sig.name)

    def _on_signal(self, name: str) -> None:
        if not self.received.done():
            self.received.set_result(name)

    def close(self) -> None:
        for sig in self._signals:
            self._loop.remove_signal_handler(sig)


async def wait_for_signal() -> str:
    """Block until SIGTERM or SIGINT arrives; return its name."""
    signals = SignalWaiter()
    try:
        return await signals.received
    finally:
        signals.close()
