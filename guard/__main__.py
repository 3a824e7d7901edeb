"""``fencing-guard`` / ``python -m guard``: run the guard alone."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from fencing._server import configure_logging, wait_for_signal
from guard.fence import FenceMode
from guard.server import DEFAULT_IDEMPOTENCY_RETENTION_S, start_guard


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fencing-guard", description="Run the fencing guard.")
    p.add_argument(
        "--listen",
        default=os.environ.get("FENCING_GUARD_LISTEN", "127.0.0.1:50052"),
        help="host:port to serve on (env FENCING_GUARD_LISTEN; default %(default)s)",
    )
    p.add_argument(
        "--store",
        default=os.environ.get("FENCING_STORE", "sqlite:fencing-data/guard.db"),
        help=(
            "memory://, sqlite:///path, postgresql://user@host/db?schema=fencing, "
            "redis://host:6379 (env FENCING_STORE; default %(default)s)"
        ),
    )
    p.add_argument(
        "--fence-mode",
        choices=[m.value for m in FenceMode],
        default=os.environ.get("FENCING_FENCE_MODE", FenceMode.MONOTONIC.value),
        help=(
            "monotonic (default); strict also requires the live lease (a postgres or redis "
            "store where the lease server keeps its leases); 'off' accepts stale tokens: "
            "chaos control only"
        ),
    )
    p.add_argument(
        "--idempotency-retention",
        type=float,
        default=float(
            os.environ.get("FENCING_IDEMPOTENCY_RETENTION_S", DEFAULT_IDEMPOTENCY_RETENTION_S)
        ),
        help="seconds a write's idempotency key is remembered (default 86400)",
    )
    p.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to drain on SIGTERM")
    p.add_argument("--log-level", default=os.environ.get("FENCING_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=["console", "json"],
        default=os.environ.get("FENCING_LOG_FORMAT", "console"),
    )
    return p


async def _run(args: argparse.Namespace) -> None:
    server = await start_guard(
        args.store,
        args.listen,
        mode=FenceMode(args.fence_mode),
        retention_s=args.idempotency_retention,
        reflection=args.reflection,
    )
    print(
        f"guard listening on {server.address} (store {server.store.name}, "
        f"fence mode {args.fence_mode})",
        flush=True,
    )
    await wait_for_signal()
    await server.stop(args.grace)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
