"""The web console's leases page with 100,000 held leases: what does a page cost?

Against the embedded SQLite lease server (in process, real gRPC on loopback) holding
``--leases`` leases under ``jobs/`` (and as many under ``other/``, which the listing
skips), this measures, in the same run:

* baseline: the CLI's listing of the same page, ``LeaseClient.list_page(prefix,
  page_size=50, page_token=...)``, the one ``List`` call ``fencing lease list`` makes
  per page;
* the console's leases page (``GET /leases?prefix=jobs/&page=...``, the same ``List``
  call plus rendering 50 rows), over HTTP on loopback;
* the whole listing by the CLI itself (``fencing lease list --prefix jobs/
  --page-size 1000``, a process), for scale.

The first two for the first page and for a page half way through the listing (its
token got by paging there).

Times are the median of ``--repeat`` requests (client-side, so they include the HTTP
round trip: an upper bound of the server's time); the ratio is the baseline's time
over the row's (below 1: slower than the bare call). Then it counts the lease server's
Watch streams with the console idle and with 10 tabs' event streams open: one.

    python -m bench.console [--leases 100000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from console.testing import running_console
from fencing import LeaseClient
from fencing.testing import running_servers

PAGE = 50
TARGET_MS = 300.0
TABS = 10


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def get(host: str, port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
        return body
    finally:
        conn.close()


@dataclass
class ConsoleRun:
    """What :func:`measure` found: (row, ms, its baseline's ms) rows, the CLI's whole
    listing in seconds, and the lease server's Watch streams idle and with tabs open."""

    leases: int
    rows: list[tuple[str, float, float]]
    whole_s: float
    idle_streams: int
    streams_with_tabs: int

    @property
    def slowest_page_ms(self) -> float:
        return max(ms for how, ms, _ in self.rows if how.startswith("console"))


def measure(leases: int, repeat: int) -> ConsoleRun:
    """Take the leases, serve a console over them, and time its pages (see the module)."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_servers(f"sqlite:{tmp}/leases.db", f"sqlite:{tmp}/guard.db") as servers,
        LeaseClient(servers.lease_address, holder="bench", transport="unary") as client,
    ):
        print(f"taking {2 * leases:,} leases...", file=sys.stderr, flush=True)
        for start in range(0, leases, 1000):
            count = min(1000, leases - start)
            client.acquire_many([f"jobs/{i:06d}" for i in range(start, start + count)], 3600)
            client.acquire_many([f"other/{i:06d}" for i in range(start, start + count)], 3600)
        # Half way through, as the console's "next page" links would get there.
        token = ""
        for _ in range(leases // 2 // 1000):
            _, token = client.list_page("jobs/", page_size=1000, page_token=token)
        watch = servers.lease.service.feed
        assert watch is not None, "the SQLite lease backend keeps one event log"
        with running_console(servers.lease_address, servers.guard_address) as url:
            host, port = url.removeprefix("http://").split(":")
            first = get(host, int(port), "/leases?prefix=jobs/")
            assert first.count(b"data-resource=") == PAGE

            def page_of_cli(page_token: str) -> Callable[[], object]:
                return lambda: client.list_page("jobs/", page_size=PAGE, page_token=page_token)

            def page_of_console(page_token: str) -> Callable[[], object]:
                return lambda: get(host, int(port), f"/leases?prefix=jobs/&page={page_token}")

            rows = []
            for where, page_token in (("first page", ""), ("half way", token)):
                base = median_ms(page_of_cli(page_token), repeat)
                rows.append((f"CLI's List call, {where} (baseline)", base, base))
                ms = median_ms(page_of_console(page_token), repeat)
                rows.append((f"console leases page, {where}", ms, base))
            idle = watch.watchers
            tabs = [
                threading.Thread(target=_tab, args=(host, int(port)), daemon=True)
                for _ in range(TABS)
            ]
            for tab in tabs:
                tab.start()
            time.sleep(1.0)
            with_tabs = watch.watchers
        began = time.perf_counter()
        listed = subprocess.run(
            [
                *(sys.executable, "-m", "fencingctl", "lease", "list", "--prefix", "jobs/"),
                *("--page-size", "1000", "--lease-addr", servers.lease_address),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        whole = time.perf_counter() - began
        assert listed.stdout.count("\n") == leases
    return ConsoleRun(leases, rows, whole, idle, with_tabs)


def markdown(run: ConsoleRun) -> str:
    """The run's table and its Watch-stream line."""
    lines = [
        f"Leases page with {run.leases:,} held leases under the prefix (and as many "
        "others), median ms:",
        "",
        "| how | ms | ratio | under 300 ms |",
        "| --- | ---: | --- | --- |",
    ]
    for how, ms, base in run.rows:
        ratio = "(baseline)" if how.endswith("(baseline)") else f"{base / ms:.2f}x"
        lines.append(f"| {how} | {ms:.1f} | {ratio} | {'yes' if ms < TARGET_MS else 'NO'} |")
    lines.append(
        f"| `fencing lease list` of all {run.leases:,} (a process) | {run.whole_s * 1000:.0f} | | |"
    )
    lines += [
        "",
        f"Watch streams on the lease server: {run.idle_streams} with the console idle, "
        f"{run.streams_with_tabs} with {TABS} tabs' event streams open.",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leases", type=int, default=100_000, help="held under the listed prefix")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    print(markdown(measure(args.leases, args.repeat)))


def _tab(host: str, port: int) -> None:
    """An open tab: the page's event stream, held open (read until the console stops)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", "/events?prefix=jobs/")
        response = conn.getresponse()
        while response.read(1):
            pass
    except OSError:
        pass
    finally:
        conn.close()


if __name__ == "__main__":
    main()
