"""A lease server for the periodic jobs' control: ``python -m tests.e2e.periodic_server``.

The same server as ``python -m lease_server`` (:func:`lease_server.server.start_lease_server`)
with one difference when ``--no-unique`` is given: its scheduler enqueues each period's
job without the unique key (schedule, period) (``QueueOptions.periodic_unique=False``),
which the product never does; the control shows the duplicates the key prevents. Prints
``listening on HOST:PORT`` once serving, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio

from lease_server.queue.service import QueueOptions
from lease_server.server import start_lease_server
from serving.server import serve_until_signal


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--no-unique", action="store_true")
    args = parser.parse_args()
    server = await start_lease_server(
        args.backend,
        "127.0.0.1:0",
        queue_options=QueueOptions(periodic_unique=not args.no_unique),
    )
    await serve_until_signal(
        [server], grace=1.0, on_ready=lambda: print(f"listening on {server.address}", flush=True)
    )


if __name__ == "__main__":
    asyncio.run(main())
