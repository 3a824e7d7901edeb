"""A paused holder's late write, refused by a guard whose store is MySQL/MariaDB.

The former holder is a real process: it acquires a short lease, writes through the
guard, and is paused with SIGSTOP; a new holder takes the lease over and, depending on
the fence mode, writes (monotonic), promises its token with ``Fence`` (promise), or does
nothing at all with the guard (watch: the guard follows the lease server's events).
Woken, the former holder writes again: refused with the new holder's token, and the
new holder's value stays. The control runs the same story with fencing off: the late
write lands over the new holder's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from fencing import GuardClient, LeaseClient
from fencing.testing import running_servers
from guard.fence import FenceMode
from tests import mysql
from tests.waiting import HANG_GUARD

pytestmark = [pytest.mark.e2e, pytest.mark.mysql]

FORMER_HOLDER = textwrap.dedent(
    """
    import sys
    from fencing import Claim, GuardClient, LeaseClient, StaleTokenError

    lease_addr, guard_addr = sys.argv[1], sys.argv[2]
    with LeaseClient(lease_addr, holder="former") as leases, GuardClient(guard_addr) as guard:
        lease = leases.acquire("ledger", ttl=0.5)
        guard.put(lease, "balance", b"former: 100")
        print(lease.token, flush=True)
        sys.stdin.readline()  # paused (SIGSTOP) before this returns; woken after
        try:
            guard.put(Claim("ledger", lease.token), "balance", b"former: late")
            print("ACCEPTED", flush=True)
        except StaleTokenError as exc:
            print("STALE_TOKEN", exc.current_token, flush=True)
    """
)


@pytest.fixture
def store_url() -> Iterator[str]:
    with mysql.fresh_prefix() as url:
        yield url


@pytest.mark.parametrize("how", ["monotonic", "promise", "watch", "control-off"])
def test_a_paused_holder_is_refused_after_a_takeover(store_url: str, how: str) -> None:
    mode = {
        "monotonic": FenceMode.MONOTONIC,
        "promise": FenceMode.MONOTONIC,
        "watch": FenceMode.WATCH,
        "control-off": FenceMode.OFF,
    }[how]
    with running_servers("memory://", store_url, mode=mode) as servers:
        former = subprocess.Popen(
            [sys.executable, "-c", FORMER_HOLDER, servers.lease_address, servers.guard_address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert former.stdout is not None and former.stdin is not None
            former_token = int(former.stdout.readline())
            os.kill(former.pid, signal.SIGSTOP)  # its lease cannot be renewed any more
            with (
                LeaseClient(servers.lease_address, holder="next") as leases,
                GuardClient(servers.guard_address) as guard,
            ):
                lease = leases.acquire("ledger", ttl=30, timeout=10)
                assert lease.token > former_token
                if how == "promise":
                    assert guard.fence(lease) == lease.token
                elif how == "watch":  # the guard learns of the takeover by itself
                    deadline = time.monotonic() + HANG_GUARD
                    while guard.describe_fence("ledger") < lease.token:
                        assert time.monotonic() < deadline, "the guard never followed"
                        time.sleep(0.05)
                else:
                    assert guard.put(lease, "balance", b"next: 200") == lease.token
                os.kill(former.pid, signal.SIGCONT)
                former.stdin.write("\n")
                former.stdin.flush()
                verdict = former.stdout.readline().split()
                record = guard.read("ledger", "balance")
                assert record is not None
                if how == "control-off":  # the violation fencing prevents
                    assert verdict == ["ACCEPTED"]
                    assert record.value == b"former: late"
                else:
                    assert verdict == ["STALE_TOKEN", str(lease.token)]
                    expected = b"former: 100" if how in ("promise", "watch") else b"next: 200"
                    assert record.value == expected
        finally:
            os.kill(former.pid, signal.SIGCONT)
            former.kill()
            former.wait(10)
            for pipe in (former.stdin, former.stdout):
                if pipe is not None:
                    pipe.close()


def test_the_test_server_is_durable_and_the_store_says_so(store_url: str) -> None:
    """MariaDB as configured here flushes at every commit: no warning is logged."""
    import asyncio

    from guard.stores.mysql import MySQLStore

    async def opened() -> str | None:
        store = MySQLStore(store_url)
        await store.open()
        try:
            return store.durability_warning
        finally:
            await store.close()

    assert asyncio.run(opened()) is None
