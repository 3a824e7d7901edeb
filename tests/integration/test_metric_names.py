"""Every series a server exports on ``/metrics`` follows the Prometheus naming rules,
scraped from real ``lease-server`` and ``fencing-guard`` processes after real calls.

The rules (prometheus.io/docs/practices/naming): names are snake_case in
``[a-zA-Z_:][a-zA-Z0-9_:]*`` (we allow no capitals and no colons, which are for
recording rules); counters end in ``_total``; a unit is a base unit (seconds, bytes)
written as a suffix, never a prefix or the middle of a name; no ``*_created`` series.
"""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.parser import text_string_to_metric_families

from fencing import GuardClient, LeaseClient, QueueClient
from serving.metrics import Metrics
from serving.ports import free_port

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
SNAKE = re.compile(r"[a-z_][a-z0-9_]*\Z")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
#: Units that are not base units (Prometheus wants seconds and bytes, ratios not percent).
NON_BASE_UNITS = {
    "ms", "us", "ns", "millis", "milliseconds", "microseconds", "nanoseconds", "minutes",
    "hours", "days", "kb", "mb", "gb", "kilobytes", "megabytes", "gigabytes", "bits",
    "percent",
}  # fmt: skip
BASE_UNITS = ("seconds", "bytes")
#: What a type appends to its family's name in its samples.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum", ""),
    "gauge": ("",),
    "info": ("_info",),
}


def naming_problems(text: str) -> list[str]:
    """Every broken rule in a text exposition, one line each (empty: all good)."""
    problems: list[str] = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if not (NAME.match(name) and SNAKE.match(name)):
            problems.append(f"{name}: not snake_case [a-z_][a-z0-9_]*")
        words = name.split("_")
        for unit in sorted(NON_BASE_UNITS & set(words)):
            problems.append(f"{name}: unit {unit!r} is not a base unit (seconds, bytes)")
        stem = name.removesuffix("_info")
        for unit in BASE_UNITS:
            if unit in words and not stem.endswith("_" + unit):
                problems.append(f"{name}: the unit {unit!r} must be the name's suffix")
        if family.type == "histogram" and not name.endswith(BASE_UNITS):
            problems.append(f"{name}: a histogram's name ends in its unit")
        for s in family.samples:
            if s.name.endswith("_created"):
                problems.append(f"{s.name}: a _created series")
                continue
            if family.type == "counter" and not s.name.endswith("_total"):
                problems.append(f"{s.name}: a counter's samples end in _total")
            if not any(s.name == name + suffix for suffix in SUFFIXES.get(family.type, ("",))):
                problems.append(f"{s.name}: not a {family.type} sample of {name}")
            for label in s.labels:
                if not LABEL.match(label) or label.startswith("__"):
                    problems.append(f"{s.name}: label {label!r} is not a valid label name")
    return problems


def test_the_rules_catch_each_kind_of_bad_name() -> None:
    """The control: the checker flags what it claims to, so a pass means something."""
    registry = CollectorRegistry()
    Counter("jobsDone", "camelCase", registry=registry).inc()
    Gauge("fencing_latency_ms", "a non-base unit", registry=registry).set(1)
    Gauge("fencing_seconds_spent", "a unit in the middle", registry=registry).set(1)
    Histogram("fencing_wait", "a histogram without a unit", registry=registry).observe(1)
    was_on = prometheus_metrics._use_created
    prometheus_metrics.enable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        Counter("fencing_hits_total", "with created", registry=registry).inc()
        text = Metrics(registry).render()
    finally:
        if not was_on:
            prometheus_metrics.disable_created_metrics()  # type: ignore[no-untyped-call]
    found = "\n".join(naming_problems(text))
    assert "jobsDone: not snake_case" in found
    assert "fencing_latency_ms: unit 'ms'" in found
    assert "fencing_seconds_spent: the unit 'seconds' must be the name's suffix" in found
    assert "fencing_wait: a histogram's name ends in its unit" in found
    assert "fencing_hits_created: a _created series" in found
    assert "fencing_hits_total" not in found.replace("fencing_hits_created", "")


def _address(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
    """The bound address from the server's start banner on stdout."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line.removeprefix(prefix).split()[0]
    raise AssertionError(f"{proc.args!r} printed no {prefix!r} line (exit {proc.poll()})")


@contextmanager
def server(module: str, banner: str, *args: str) -> Iterator[tuple[str, int]]:
    """A real server process on a free port with ``/metrics`` on another: both ports."""
    metrics_port = free_port()
    flags = ["--listen", "127.0.0.1:0", "--metrics-port", str(metrics_port), *args]
    with subprocess.Popen(
        [sys.executable, "-m", module, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            yield _address(proc, banner), metrics_port
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def scrape(port: int) -> str:
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body: bytes = r.read()
            return body.decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the endpoint starts right after the gRPC port


def test_every_series_of_both_servers_follows_the_naming_rules(tmp_path: Path) -> None:
    with (
        server(
            "lease_server",
            "lease server listening on ",
            "--backend",
            f"sqlite:{tmp_path / 'leases.db'}",
        ) as (lease_addr, lease_metrics),
        server("guard", "guard listening on ", "--store", "memory://") as (
            guard_addr,
            guard_metrics,
        ),
        LeaseClient(lease_addr, holder="a") as leases,
        GuardClient(guard_addr) as guard,
        QueueClient(lease_addr) as queue,
    ):
        # Calls that fill the labelled families: grants, writes, jobs, one refusal.
        lease = leases.acquire("orders/1", ttl=5)
        guard.put(lease, "k", b"v")
        queue.enqueue("mail", b"x")
        (job,) = queue.claim("mail")
        queue.complete(job)
        texts = {"lease-server": scrape(lease_metrics), "fencing-guard": scrape(guard_metrics)}
    for server_name, text in texts.items():
        names = {f.name for f in text_string_to_metric_families(text)}
        # The families the calls above must have produced, so the check is not vacuous.
        assert {
            "fencing_build_info",
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "python_info",
            "python_gc_collections",
            "grpc_server_handling_seconds",
        } <= names, (server_name, sorted(names))
        assert "_created" not in text
        assert naming_problems(text) == [], server_name
    lease_names = {f.name for f in text_string_to_metric_families(texts["lease-server"])}
    assert {"fencing_lease_acquires", "fencing_queue_oldest_job_age_seconds"} <= lease_names
    guard_names = {f.name for f in text_string_to_metric_families(texts["fencing-guard"])}
    assert "fencing_guard_writes" in guard_names


@pytest.mark.parametrize("kind", ["counter", "histogram"])
def test_a_server_registry_exports_no_created_series(kind: str) -> None:
    metrics = Metrics()
    if kind == "counter":
        Counter("fencing_probe_total", "probe", registry=metrics.registry).inc()
    else:
        Histogram("fencing_probe_seconds", "probe", registry=metrics.registry).observe(0.1)
    text = metrics.render()
    assert "fencing_probe" in text and "_created" not in text
