"""What does running a call as the core's steps cost, next to calling the stub directly?

Every client call now goes through one runner (:mod:`fencing.client._calls`): the
exchange is a generator in :mod:`fencing.client._core` that yields a ``Call`` and is
sent the reply. Measured in one run, against one in-process lease server (memory
backend) over loopback, one blocking client, 1 thread:

* ``Describe, stub``: ``stub.Describe(request, timeout=...)`` by hand (the baseline),
  against ``LeaseClient.describe`` (``_call``, the converter);
* ``acquire+release, stub``: Acquire then Release by hand (the baseline), against
  ``acquire_nowait(...).release()`` (both run as steps);
* ``no network``: a method that returns at once, called directly (the baseline),
  against ``_call`` and against the steps runner (``_run``): their own cost per call.

Each pair runs in turns, so a machine shared with other work slows both alike.

    python -m bench.steps [--duration 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.harness import Result, table
from fencing import LeaseClient
from fencing.client import _core
from fencing.testing import running_servers
from fencing.v1 import lease_pb2


def paired(
    base: str, base_op: Callable[[], object], name: str, op: Callable[[], object], duration: float
) -> list[Result]:
    """Time ``base_op`` and ``op`` in turns for ``duration`` seconds (after a warm-up), so
    a machine shared with other work slows both alike; ``name`` is compared with ``base``."""
    end = time.perf_counter() + min(0.3, duration / 5)
    while time.perf_counter() < end:
        base_op()
        op()
    spent = {base: 0.0, name: 0.0}
    latencies: dict[str, list[float]] = {base: [], name: []}
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        for label, fn in ((base, base_op), (name, op)):
            t0 = time.perf_counter()
            fn()
            took = time.perf_counter() - t0
            spent[label] += took
            latencies[label].append(took)
    return [
        Result(base, 1, len(latencies[base]), spent[base], latencies[base]),
        Result(name, 1, len(latencies[name]), spent[name], latencies[name], baseline=base),
    ]


def run(duration: float) -> list[Result]:
    results: list[Result] = []
    with running_servers() as servers, LeaseClient(servers.lease_address) as client:
        stub = client._stub
        describe = _core.describe_request("r")
        results += paired(
            "Describe, stub",
            lambda: stub.Describe(describe, timeout=5),
            "Describe, client",
            lambda: client.describe("r"),
            duration,
        )

        def by_hand() -> None:
            request = _core.acquire_request("r", client.holder, 10_000, 0, _core.new_request_id())
            grant = stub.Acquire(request, timeout=5)
            stub.Release(_core.release_request("r", grant.token, grant.holder), timeout=5)

        results += paired(
            "acquire+release, stub",
            by_hand,
            "acquire+release, client (steps)",
            lambda: client.acquire_nowait("r", 10.0).release(),
            duration,
        )

    reply = lease_pb2.LeaseState()

    def instant(request: object, timeout: float) -> lease_pb2.LeaseState:
        return reply

    class Runner(LeaseClient):
        def __init__(self) -> None:  # no channel: only the runner is measured
            self.rpc_timeout = 5.0

    runner = Runner()
    results += paired(
        "method, called directly",
        lambda: instant(describe, 5.0),
        "method, through _call (no network)",
        lambda: runner._call(instant, describe),
        duration,
    )
    if hasattr(runner, "_run"):
        results += paired(
            "method, called directly ",
            lambda: instant(describe, 5.0),
            "method, as steps through _run (no network)",
            lambda: runner._run(_core.unary(instant, describe)),
            duration,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0)
    args = parser.parse_args()
    print(
        table(run(args.duration), "steps: the runner's cost (1 client, loopback, memory backend)")
    )


if __name__ == "__main__":
    main()
