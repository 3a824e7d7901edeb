"""The web console's leases page with 100,000 held leases: what does a page cost?

Against the embedded SQLite lease server (in process, real gRPC on loopback) holding
``--leases`` leases under ``jobs/`` (and as many under ``other/``, which the listing
skips), this measures, in the same run:

* baseline: the CLI's listing of the same page, ``LeaseClient.list_page(prefix,
  page_size=50)``, the one ``List`` call ``fencing lease list`` makes per page;
* the console's leases page (``GET /leases?prefix=jobs/``, the same ``List`` call plus
  rendering 50 rows), over HTTP on loopback: the first page, and a page half way
  through (its ``page`` token from the listing);
* the whole listing by the CLI itself (``fencing lease list --prefix jobs/
  --page-size 1000``, a process), for scale.

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

from console.testing import running_console
from fencing import LeaseClient
from fencing.testing import running_servers

PAGE = 50
TARGET_MS = 300.0


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leases", type=int, default=100_000, help="held under the listed prefix")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_servers(f"sqlite:{tmp}/leases.db", f"sqlite:{tmp}/guard.db") as servers,
        LeaseClient(servers.lease_address, holder="bench", transport="unary") as client,
    ):
        print(f"taking {2 * args.leases:,} leases...", file=sys.stderr, flush=True)
        for start in range(0, args.leases, 1000):
            count = min(1000, args.leases - start)
            client.acquire_many([f"jobs/{i:06d}" for i in range(start, start + count)], 3600)
            client.acquire_many([f"other/{i:06d}" for i in range(start, start + count)], 3600)
        # Half way through, as the console's "next page" links would get there.
        token = ""
        for _ in range(args.leases // 2 // 1000):
            _, token = client.list_page("jobs/", page_size=1000, page_token=token)
        watch = servers.lease.service.feed
        assert watch is not None, "the SQLite lease backend keeps one event log"
        with running_console(servers.lease_address, servers.guard_address) as url:
            host, port = url.removeprefix("http://").split(":")
            first = get(host, int(port), "/leases?prefix=jobs/")
            assert first.count(b"data-resource=") == PAGE
            rows = [
                (
                    "CLI's List call, one page of 50 (baseline)",
                    median_ms(lambda: client.list_page("jobs/", page_size=PAGE), args.repeat),
                ),
                (
                    "console leases page, first page",
                    median_ms(lambda: get(host, int(port), "/leases?prefix=jobs/"), args.repeat),
                ),
                (
                    "console leases page, half way",
                    median_ms(
                        lambda: get(host, int(port), f"/leases?prefix=jobs/&page={token}"),
                        args.repeat,
                    ),
                ),
            ]
            idle = watch.watchers
            tabs = [
                threading.Thread(target=_tab, args=(host, int(port)), daemon=True)
                for _ in range(10)
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
        assert listed.stdout.count("\n") == args.leases
    print(f"Leases page with {args.leases:,} held leases under the prefix (and as many others)\n")
    print("| how | ms | ratio | under 300 ms |")
    print("| --- | ---: | --- | --- |")
    base = rows[0][1]
    for how, ms in rows:
        ratio = "(baseline)" if how.endswith("(baseline)") else f"{base / ms:.2f}x"
        print(f"| {how} | {ms:.1f} | {ratio} | {'yes' if ms < TARGET_MS else 'NO'} |")
    print(f"| `fencing lease list` of all {args.leases:,} (a process) | {whole * 1000:.0f} | | |")
    print(
        f"\nWatch streams on the lease server: {idle} with the console idle, "
        f"{with_tabs} with 10 tabs' event streams open."
    )


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
