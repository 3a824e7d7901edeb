"""Prometheus metrics: one registry per server process, the gRPC server metrics, an endpoint.

Every server process owns a :class:`Metrics` with its own ``CollectorRegistry``
(never the global one), so several servers can live in one process (tests, ``fencing
serve``) without duplicate registrations. Families are created in groups, at most once
per registry: :meth:`Metrics.group` (``LeaseMetrics``, ``GuardMetrics``, ...).

The gRPC server metrics come from one interceptor, :class:`MetricsInterceptor`, with
go-grpc-prometheus's names and labels, so existing dashboards work:

- ``grpc_server_started_total{grpc_type,grpc_service,grpc_method}``
- ``grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}``
- ``grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}`` (histogram)

``fencing_build_info{version}`` (value 1) names the package version a server runs;
``process_*``, ``python_info`` and ``python_gc_*`` are prometheus_client's standard
process and runtime collectors. No ``*_created`` series are exported.

The endpoint (``--metrics-port``, 0 = off) binds loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIServer

import grpc
import grpc.aio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import start_http_server

from fencing._version import VERSION
from serving import handlers

G = TypeVar("G")

#: Latency buckets (seconds) for RPCs and backend calls: 1 ms .. 30 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """A process's metrics: a private registry and the metric groups created in it.

    A registry it creates itself (the servers') also carries ``fencing_build_info`` and
    the process and Python runtime collectors (``process_*``, ``python_info``,
    ``python_gc_*``), and no ``*_created`` series: creating one turns those off for
    the whole process (prometheus_client's switch is global), since a series per
    counter and histogram child holding its creation time doubles the series count
    for what a scraper already knows from ``process_start_time_seconds``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._groups: dict[Callable[..., Any], Any] = {}
        if registry is not None:
            self.registry = registry
            return
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.group(BuildInfo)

    def group(self, factory: Callable[[CollectorRegistry], G]) -> G:
        """The group ``factory(registry)`` builds, built once per registry."""
        if factory not in self._groups:
            self._groups[factory] = factory(self.registry)
        found: G = self._groups[factory]
        return found

    def render(self) -> str:
        """The text exposition format, as ``/metrics`` serves it."""
        return generate_latest(self.registry).decode()

    def serve_http(self, port: int, host: str = "127.0.0.1") -> MetricsEndpoint:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port) from a daemon thread."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return MetricsEndpoint(server, thread)


class BuildInfo:
    """``fencing_build_info{version}``: always 1, so a dashboard can join on the version
    a server runs (``* on(instance) group_left(version) fencing_build_info``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.info = Gauge(
            "fencing_build_info",
            "The fencing-guard version this server runs (value 1).",
            ("version",),
            registry=registry,
        )
        self.info.labels(VERSION).set(1)


class RuntimeMetrics:
    """``fencing_asyncio_tasks``: the tasks alive on the server's event loop, counted at
    each scrape. A number that keeps growing under a steady load is a leak (a task
    per call or per reconnect never awaited or cancelled); ``fencing chaos soak``
    samples it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tasks = Gauge(
            "fencing_asyncio_tasks",
            "Tasks alive on the server's event loop (counted at each scrape).",
            registry=registry,
        )

    def track(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count ``loop``'s tasks from now on (the scrape runs on another thread:
        ``all_tasks`` with an explicit loop copes with a set that changes meanwhile)."""
        self.tasks.set_function(lambda: float(len(asyncio.all_tasks(loop))))


@dataclass
class MetricsEndpoint:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class GrpcMetrics:
    """The standard gRPC server metrics (go-grpc-prometheus names)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("grpc_type", "grpc_service", "grpc_method")
        self.started = Counter(
            "grpc_server_started_total",
            "RPCs started on the server.",
            labels,
            registry=registry,
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure.",
            (*labels, "grpc_code"),
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its status, by the server's clock.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )


def _code(context: handlers.Context, exc: BaseException | None) -> str:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    code: object = context.code()  # None until a status is set
    if isinstance(code, grpc.StatusCode):
        return code.name
    if exc is None:
        return "OK"
    return "UNKNOWN"


class MetricsInterceptor(handlers.HandlerInterceptor):
    """Counts and times every RPC of every service on the server it is installed on."""

    def __init__(self, metrics: GrpcMetrics) -> None:
        self.metrics = metrics

    def wrap(self, handler: handlers.Handler, method: str) -> handlers.Handler:
        service, name = handlers.split_method(method)
        labels = (handlers.rpc_type(handler), service, name)
        started = self.metrics.started.labels(*labels)
        handling = self.metrics.handling.labels(*labels)
        handled = self.metrics.handled

        @asynccontextmanager
        async def observe(request: Any, context: handlers.Context) -> AsyncIterator[None]:
            started.inc()
            begin = time.perf_counter()
            failure: BaseException | None = None
            try:
                yield
            except BaseException as exc:
                failure = exc
                raise
            finally:
                handling.observe(time.perf_counter() - begin)
                handled.labels(*labels, _code(context, failure)).inc()

        return handlers.around(handler, observe)


class PrefixLabels:
    """Bounded label values from resource names: ``orders/42`` -> ``orders``.

    The prefix is the name up to its first ``/`` or ``:``. The first ``limit``
    distinct prefixes are kept as they are; later ones are all reported as
    ``other``, so a flood of random names cannot blow up a metric's cardinality.
    """

    OTHER = "other"

    def __init__(self, limit: int = 100) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, resource: str) -> str:
        cut = min((i for i in (resource.find("/"), resource.find(":")) if i >= 0), default=-1)
        prefix = resource[:cut] if cut >= 0 else resource
        if prefix in self._seen:
            return prefix
        if len(self._seen) < self.limit:
            self._seen.add(prefix)
            return prefix
        return self.OTHER


__all__ = [
    "LATENCY_BUCKETS",
    "BuildInfo",
    "GrpcMetrics",
    "Metrics",
    "MetricsEndpoint",
    "MetricsInterceptor",
    "PrefixLabels",
    "RuntimeMetrics",
]
