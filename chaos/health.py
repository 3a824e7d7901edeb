"""Health over time: samples of every server process, a growth verdict, and small plots.

A soak (:mod:`chaos.soak`) runs for minutes or hours, long enough for what a short
scenario never shows: a task or a file descriptor kept per call, a waiter never
woken, a connection per reconnect, a p99 that climbs. :class:`HealthSampler`
samples, every few seconds and from outside, each server process the run started:

- from ``/proc/PID``: resident memory (``rss_mb``) and open file descriptors (``fds``);
- from its ``/metrics`` endpoint: ``fencing_asyncio_tasks`` (``tasks``),
  ``fencing_lease_waiters``, ``fencing_lease_watch_streams``,
  ``fencing_lease_session_streams``, and the p50/p99 of the server's ``Claim`` calls
  over the interval (from the ``grpc_server_handling_seconds`` buckets);
- from the throwaway database: its client connections (PostgreSQL's
  ``pg_stat_activity``, Redis' ``INFO clients``), as process ``database``.

Each sample is one JSON line in ``health.jsonl``. A process that is restarted (a
fault) starts a new *incarnation*, a series of its own: a restart resets memory and
descriptors, which must not read as levelling off or as growth.

:func:`growth` is the verdict: for every series of the metrics in :data:`BOUNDS`, a
least-squares line through the samples of the last half of the run (of the
incarnation alive then, if it covers at least a third of that half) and the
growth it predicts over that half. A growth beyond the metric's bound fails the run:
memory, descriptors or tasks that climb steadily to the end never levelled off.
A metric that rose early and then stayed flat passes. Latencies are plotted, not
judged (a loaded machine moves them more than a leak would).

:func:`latency_series` derives the clients' own acquire and write latencies (p50,
p99 per window) from the history. :func:`health_page` draws everything as small
inline SVG plots (no plotting library).
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from chaos.history import Event

QUANTILES: Final = (0.5, 0.99)


@dataclass(frozen=True, slots=True)
class Bound:
    """How much a metric may grow over the last half of a run: ``absolute`` or
    ``relative`` times its median there, whichever is larger."""

    absolute: float
    relative: float = 0.0

    def limit(self, median: float) -> float:
        return max(self.absolute, self.relative * abs(median))


BOUNDS: Final[dict[str, Bound]] = {
    "rss_mb": Bound(24.0, 0.15),
    "fds": Bound(12.0),
    "tasks": Bound(30.0),
    "waiters": Bound(8.0),
    "watch_streams": Bound(4.0),
    "session_streams": Bound(8.0),
    "connections": Bound(12.0),
}
"""The metrics the growth check judges and their bounds (growth over the last half).

Generous: a steady soak moves these by a few units (a reconnecting client, the
garbage collector), a leak of one object per call by hundreds in a minute."""

GAUGES: Final = {
    "fencing_asyncio_tasks": "tasks",
    "fencing_lease_waiters": "waiters",
    "fencing_lease_watch_streams": "watch_streams",
    "fencing_lease_session_streams": "session_streams",
}
"""Metric families read from a server's ``/metrics`` and the sample keys they become."""

TIMED_METHODS: Final = ("Claim",)
"""Server-side gRPC methods whose p50/p99 a sample carries (acquires and writes are
timed from the clients' history instead: the SDK may carry them on streams)."""


# -- sampling ---------------------------------------------------------------------------


def proc_stats(pid: int) -> dict[str, float]:
    """``rss_mb`` and ``fds`` of a living process, from ``/proc`` (empty if it is gone)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
    with contextlib.suppress(OSError):
        out["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    return out


Buckets = dict[str, list[tuple[float, float]]]
"""method -> cumulative (upper bound, count) of its latency histogram."""


def scrape(url: str, timeout: float = 2.0) -> tuple[dict[str, float], Buckets]:
    """(gauges by sample key, ``TIMED_METHODS`` histogram buckets) from ``url``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode()
    gauges: dict[str, float] = {}
    buckets: Buckets = {}
    for family in text_string_to_metric_families(text):
        if family.name in GAUGES:
            gauges[GAUGES[family.name]] = sum(s.value for s in family.samples)
        elif family.name == "grpc_server_handling_seconds":
            for s in family.samples:
                method = s.labels.get("grpc_method", "")
                if s.name.endswith("_bucket") and method in TIMED_METHODS:
                    le = math.inf if s.labels["le"] == "+Inf" else float(s.labels["le"])
                    buckets.setdefault(method, []).append((le, s.value))
    return gauges, buckets


def bucket_quantile(
    q: float, before: Sequence[tuple[float, float]], now: Sequence[tuple[float, float]]
) -> float | None:
    """The ``q`` quantile (ms) of the calls observed between two scrapes of one histogram
    (linear inside a bucket, as Prometheus' ``histogram_quantile``); None if none."""
    prior = dict(before)
    deltas = sorted((le, count - prior.get(le, 0.0)) for le, count in now)
    if not deltas or deltas[-1][1] <= 0:
        return None
    rank = q * deltas[-1][1]
    lower, below = 0.0, 0.0
    for le, count in deltas:
        if count >= rank:
            if math.isinf(le):
                return lower * 1000
            inside = count - below
            frac = (rank - below) / inside if inside > 0 else 1.0
            return (lower + (le - lower) * frac) * 1000
        lower, below = le, count
    return None  # pragma: no cover - the last bucket holds every call


@dataclass
class Target:
    """One process to sample: its name, how to find its pid now, its metrics URL."""

    name: str
    pid: Callable[[], int | None]
    metrics_url: str | None = None


def database_connections(kind: str, url: str) -> float | None:
    """Client connections the throwaway database holds now (None if unreachable)."""
    try:
        if kind == "postgres":
            import psycopg

            with psycopg.connect(url, connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                return float(row[0]) if row else None
        if kind == "redis":
            import redis

            client = redis.Redis.from_url(url, socket_timeout=2)
            try:
                # Minus the connection asking.
                return float(client.info("clients")["connected_clients"]) - 1
            finally:
                client.close()
    except Exception:
        return None
    return None


class HealthSampler:
    """Samples ``targets`` (and the database) every ``interval`` s on a thread, into
    ``path`` (JSONL) and :attr:`samples`. Times are seconds since ``t0`` (monotonic)."""

    def __init__(
        self,
        targets: Sequence[Target],
        path: Path,
        *,
        interval: float,
        t0: float,
        database: tuple[str, str] | None = None,
    ) -> None:
        self.targets = list(targets)
        self.path = path
        self.interval = interval
        self.t0 = t0
        self.database = database
        self.samples: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._incarnation: dict[str, int] = {}
        self._buckets: dict[str, Buckets] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            while not self._stop.is_set():
                for sample in self.sample_once():
                    out.write(json.dumps(sample) + "\n")
                out.flush()
                self._stop.wait(self.interval)

    def sample_once(self) -> list[dict[str, Any]]:
        """One round: a sample per living target (and the database); also kept."""
        taken: list[dict[str, Any]] = []
        for target in self.targets:
            pid = target.pid()
            if pid is None:
                continue
            if self._pids.get(target.name) != pid:
                self._pids[target.name] = pid
                self._incarnation[target.name] = self._incarnation.get(target.name, -1) + 1
                self._buckets.pop(target.name, None)
            values: dict[str, float] = proc_stats(pid)
            if not values:
                continue  # gone (killed) since its pid was read
            if target.metrics_url is not None:
                with contextlib.suppress(Exception):  # paused or restarting: no scrape
                    gauges, buckets = scrape(target.metrics_url)
                    values.update(gauges)
                    prior = self._buckets.get(target.name, {})
                    for method, now in buckets.items():
                        for q in QUANTILES:
                            v = bucket_quantile(q, prior.get(method, []), now)
                            if v is not None:
                                values[f"{method.lower()}_p{round(q * 100)}_ms"] = v
                    self._buckets[target.name] = buckets
            taken.append(self._sample(target.name, self._incarnation[target.name], values))
        if self.database is not None:
            n = database_connections(*self.database)
            if n is not None:
                taken.append(self._sample("database", 0, {"connections": n}))
        self.samples.extend(taken)
        return taken

    def _sample(
        self, process: str, incarnation: int, values: Mapping[str, float]
    ) -> dict[str, Any]:
        return {
            "t": round(time.monotonic() - self.t0, 3),
            "process": process,
            "incarnation": incarnation,
            **{k: round(v, 3) for k, v in values.items()},
        }


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of ``health.jsonl`` (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


# -- the growth verdict -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Growth:
    """One series' fitted growth over the last half of the run, and its verdict."""

    process: str
    metric: str
    samples: int
    slope_per_min: float
    growth: float
    limit: float
    median: float

    @property
    def flagged(self) -> bool:
        return self.growth > self.limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "metric": self.metric,
            "samples": self.samples,
            "slope_per_min": round(self.slope_per_min, 4),
            "growth": round(self.growth, 3),
            "limit": round(self.limit, 3),
            "median": round(self.median, 3),
            "flagged": self.flagged,
        }


WARMUP_S: Final = 10.0
"""Samples of a restarted incarnation's first seconds are not judged: a restarted
server grows its memory and connections as clients come back, then levels off."""

MIN_SAMPLES: Final = 5
"""Fewer samples in the last half than this and a series is not judged."""


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (0 for fewer than two distinct times)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def growth(samples: Iterable[Mapping[str, Any]], duration: float) -> list[Growth]:
    """The growth of every judged series over the last half of a run of ``duration`` s.

    Per process and metric of :data:`BOUNDS`: the samples with ``t`` in the last half,
    of the last incarnation that has any there (a restart starts afresh; its first
    :data:`WARMUP_S` seconds are skipped); judged if at least :data:`MIN_SAMPLES` of
    them span a third of the half or more.
    """
    half = duration / 2
    born: dict[tuple[str, int], float] = {}
    for s in samples:
        key = (str(s["process"]), int(s["incarnation"]))
        born[key] = min(born.get(key, math.inf), float(s["t"]))
    series: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = {}
    for s in samples:
        t = float(s["t"])
        if t < half or t > duration:
            continue
        incarnation = int(s["incarnation"])
        if incarnation and t < born[(str(s["process"]), incarnation)] + WARMUP_S:
            continue
        for metric in BOUNDS:
            if metric in s:
                by_inc = series.setdefault((str(s["process"]), metric), {})
                by_inc.setdefault(int(s["incarnation"]), []).append((t, float(s[metric])))
    out: list[Growth] = []
    for (process, metric), by_inc in sorted(series.items()):
        points = by_inc[max(by_inc)]
        span = points[-1][0] - points[0][0] if points else 0.0
        if len(points) < MIN_SAMPLES or span < half / 3:
            continue
        k = slope(points)
        values = sorted(y for _, y in points)
        median = values[len(values) // 2]
        out.append(
            Growth(
                process,
                metric,
                len(points),
                k * 60,
                k * half,
                BOUNDS[metric].limit(median),
                median,
            )
        )
    return out


# -- client-side latencies ------------------------------------------------------------------------


class Latencies:
    """The clients' own latencies per op and time window, fed part by part (every event of
    an operation in one part): :meth:`series` gives what :func:`latency_series` does."""

    def __init__(
        self, t0_ns: int, window_s: float, ops: Sequence[str] = ("acquire", "write")
    ) -> None:
        self.t0_ns = t0_ns
        self.window_s = window_s
        self._by_window: dict[str, dict[int, list[float]]] = {op: {} for op in ops}

    def add(self, events: Iterable[Event]) -> None:
        """Count the ``ok`` calls whose invocation and completion are among ``events``."""
        started: dict[str, Event] = {}
        for e in sorted(events, key=lambda e: e.t_mono_ns):
            if e.op not in self._by_window:
                continue
            if e.type == "invoke":
                started[e.op_id] = e
            elif e.type == "ok" and e.op_id in started:
                begin = started.pop(e.op_id)
                w = int((e.t_mono_ns - self.t0_ns) / 1e9 // self.window_s)
                self._by_window[e.op].setdefault(w, []).append(
                    (e.t_mono_ns - begin.t_mono_ns) / 1e6
                )

    def series(self) -> dict[str, list[tuple[float, float, float]]]:
        """Per op: (window end s, p50 ms, p99 ms) of the ``ok`` calls completed in each window."""
        out: dict[str, list[tuple[float, float, float]]] = {}
        for op, windows in self._by_window.items():
            rows = []
            for w in sorted(windows):
                if w < 0:
                    continue
                xs = sorted(windows[w])
                rows.append(((w + 1) * self.window_s, _quantile(xs, 0.5), _quantile(xs, 0.99)))
            out[op] = rows
        return out


def latency_series(
    events: Iterable[Event], t0_ns: int, window_s: float, ops: Sequence[str] = ("acquire", "write")
) -> dict[str, list[tuple[float, float, float]]]:
    """Per op: (window end s, p50 ms, p99 ms) of the ``ok`` calls completed in each window."""
    latencies = Latencies(t0_ns, window_s, ops)
    latencies.add(events)
    return latencies.series()


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


# -- the page ------------------------------------------------------------------------------------

PLOT_W: Final = 300
PLOT_H: Final = 90
COLORS: Final = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def svg_plot(
    title: str,
    lines: Mapping[str, Sequence[tuple[float, float]]],
    duration: float,
    *,
    half_line: bool = True,
) -> str:
    """A small line plot (inline SVG): one polyline per named series over [0, duration]."""
    ys = [y for pts in lines.values() for _, y in pts]
    # Samples go on while the clients wind down: the x axis runs to the last one.
    span = max([duration, *(t for pts in lines.values() for t, _ in pts)])
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 1, hi + 1
    pad_l, pad_b = 44, 14

    def x(t: float) -> float:
        return pad_l + (PLOT_W - pad_l - 4) * (t / span if span else 0)

    def y(v: float) -> float:
        return 4 + (PLOT_H - pad_b - 8) * (1 - (v - lo) / (hi - lo))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" height="{PLOT_H + 16}" '
        f'viewBox="0 0 {PLOT_W} {PLOT_H + 16}" font-family="sans-serif" font-size="9">',
        f'<text x="2" y="{PLOT_H + 13}" font-weight="bold">{html.escape(title)}</text>',
        f'<rect x="{pad_l}" y="4" width="{PLOT_W - pad_l - 4}" height="{PLOT_H - pad_b - 8}" '
        'fill="none" stroke="#ccc"/>',
        f'<text x="{pad_l - 2}" y="10" text-anchor="end">{_num(hi)}</text>',
        f'<text x="{pad_l - 2}" y="{PLOT_H - pad_b - 4}" text-anchor="end">{_num(lo)}</text>',
        f'<text x="{pad_l}" y="{PLOT_H - 2}">0</text>',
        f'<text x="{PLOT_W - 4}" y="{PLOT_H - 2}" text-anchor="end">{span:.0f} s</text>',
    ]
    if half_line:
        parts.append(
            f'<line x1="{x(duration / 2):.1f}" x2="{x(duration / 2):.1f}" y1="4" '
            f'y2="{PLOT_H - pad_b - 4}" stroke="#bbb" stroke-dasharray="2,2"/>'
        )
    for i, (name, pts) in enumerate(lines.items()):
        color = COLORS[i % len(COLORS)]
        if pts:
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{coords}">'
                f"<title>{html.escape(name)}</title></polyline>"
            )
        parts.append(
            f'<text x="{pad_l + 4 + 70 * i}" y="{PLOT_H + 3}" fill="{color}">'
            f"{html.escape(name[:14])}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def plots(
    samples: Sequence[Mapping[str, Any]],
    latencies: Mapping[str, Sequence[tuple[float, float, float]]],
    duration: float,
) -> dict[str, str]:
    """Every plot of the health page, by name: one per sampled metric (a line per
    process incarnation) and one per client-timed op (p50 and p99)."""
    metrics: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for s in samples:
        for key, value in s.items():
            if key in ("t", "process", "incarnation") or not isinstance(value, int | float):
                continue
            label = str(s["process"]) + (f"#{s['incarnation']}" if s["incarnation"] else "")
            metrics.setdefault(key, {}).setdefault(label, []).append((float(s["t"]), float(value)))
    out = {metric: svg_plot(metric, lines, duration) for metric, lines in sorted(metrics.items())}
    for op, rows in latencies.items():
        if rows:
            out[f"{op} latency (ms, clients)"] = svg_plot(
                f"{op} ms (clients)",
                {"p50": [(t, p50) for t, p50, _ in rows], "p99": [(t, p99) for t, _, p99 in rows]},
                duration,
            )
    return out


def health_page(
    title: str,
    summary_html: str,
    samples: Sequence[Mapping[str, Any]],
    latencies: Mapping[str, Sequence[tuple[float, float, float]]],
    growths: Sequence[Growth],
    duration: float,
) -> str:
    """The soak's health page: a verdict table of the growth check, then the plots."""
    rows = "".join(
        "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{:.3g}</td><td>{:.3g}</td><td>{:.3g}</td>"
        "<td>{}</td></tr>".format(
            ' style="background:#fdd"' if g.flagged else "",
            html.escape(g.process),
            html.escape(g.metric),
            g.samples,
            g.median,
            g.growth,
            g.limit,
            "GROWS" if g.flagged else "flat",
        )
        for g in growths
    )
    figures = "".join(
        f'<figure style="display:inline-block;margin:4px">{svg}</figure>'
        for svg in plots(samples, latencies, duration).values()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;font-size:13px}td,th{padding:2px 8px;"
        "border-bottom:1px solid #eee;text-align:left}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{summary_html}"
        "<h2>Growth over the last half of the run</h2>"
        "<p>A least-squares line through each series' samples in the last half (dashed "
        "line on the plots); its rise over that half must stay within the limit.</p>"
        "<table><tr><th>process</th><th>metric</th><th>samples</th><th>median</th>"
        f"<th>growth</th><th>limit</th><th>verdict</th></tr>{rows}</table>"
        f"<h2>Health over time</h2>{figures}</body></html>"
    )


__all__ = [
    "BOUNDS",
    "GAUGES",
    "Bound",
    "Growth",
    "HealthSampler",
    "Latencies",
    "Target",
    "bucket_quantile",
    "database_connections",
    "growth",
    "health_page",
    "latency_series",
    "plots",
    "proc_stats",
    "read_samples",
    "scrape",
    "slope",
    "svg_plot",
]
