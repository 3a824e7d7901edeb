"""``fencing serve``: the lease server and the guard in one process on the embedded default."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from fencing._server import configure_logging, wait_for_signal
from guard.fence import FenceMode
from guard.server import start_guard
from lease_server.queue_service import QueueOptions
from lease_server.server import start_lease_server


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the lease server and the guard (SQLite, nothing else needed)",
        description="Run the lease server and the guard in one process, state in --data-dir.",
    )
    p.add_argument(
        "--data-dir",
        default=os.environ.get("FENCING_DATA_DIR", "./fencing-data"),
        help="where leases.db, queue.db and guard.db live (default %(default)s)",
    )
    p.add_argument(
        "--lease-addr",
        default=os.environ.get("FENCING_LEASE_ADDR", "127.0.0.1:50051"),
        help="lease server address (default %(default)s; port 0 picks one)",
    )
    p.add_argument(
        "--guard-addr",
        default=os.environ.get("FENCING_GUARD_ADDR", "127.0.0.1:50052"),
        help="guard address (default %(default)s; port 0 picks one)",
    )
    p.add_argument(
        "--fence-mode",
        choices=[FenceMode.MONOTONIC.value, FenceMode.OFF.value],
        default=FenceMode.MONOTONIC.value,
        help="monotonic (default); off disables fencing: demo/chaos control only",
    )
    QueueOptions.add_arguments(p)
    p.add_argument("--grace", type=float, default=5.0, help="seconds to drain on SIGTERM")
    p.add_argument("--log-level", default=os.environ.get("FENCING_LOG_LEVEL", "WARNING"))
    p.add_argument(
        "--log-format",
        choices=["console", "json"],
        default=os.environ.get("FENCING_LOG_FORMAT", "console"),
    )
    p.set_defaults(run=run)


async def _serve(args: argparse.Namespace) -> None:
    data: Path = args.data_path
    leases = await start_lease_server(
        f"sqlite:{data / 'leases.db'}",
        args.lease_addr,
        queue=args.queue or f"sqlite:{data / 'queue.db'}",
        queue_options=QueueOptions.from_args(args),
    )
    try:
        guard = await start_guard(
            f"sqlite:{data / 'guard.db'}", args.guard_addr, mode=FenceMode(args.fence_mode)
        )
    except BaseException:
        await leases.stop(0)
        raise
    print(f"lease server listening on {leases.address}", flush=True)
    print(f"guard listening on {guard.address} (fence mode {args.fence_mode})", flush=True)
    if leases.queue is not None:
        print(f"queue service on {leases.address} ({leases.queue.name})", flush=True)
    print(f"data in {data}; stop with Ctrl-C or SIGTERM", flush=True)
    signal_name = await wait_for_signal()
    print(f"{signal_name}: draining for up to {args.grace:g} s", flush=True)
    await asyncio.gather(guard.stop(args.grace), leases.stop(args.grace))
    print("stopped", flush=True)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    args.data_path = Path(args.data_dir).resolve()
    args.data_path.mkdir(parents=True, exist_ok=True)
    asyncio.run(_serve(args))
    return 0
