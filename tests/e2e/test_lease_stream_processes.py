"""The lease stream against a real lease-server process, both SDK twins.

A retried acquire keeps the lease it is handed when the server wakes from a pause (the
replies of its abandoned attempts are not released behind its back), with the old
orphan rule as the control that shows two holders at once. A lease kept by ``hold`` is
renewed while the same client's waiting acquires fill the stream's in-flight limit,
with a client that counts them in one limit as the control that loses it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fencing import AsyncLeaseClient, LeaseClient
from fencing.client import _lease_stream
from fencing.errors import AcquireTimeoutError, LeaseHeldError, LeaseLost
from tests.e2e.test_postgres_servers import SERVER_ARGS, lease_server_processes
from tests.waiting import HANG_GUARD

pytestmark = pytest.mark.e2e

#: The client's rpc timeout, and the attempts sent before the paused server wakes: the
#: first ones time out, the acquire plan retries with the same request id on the same
#: stream (attempts at about 0, 0.55, 1.15, 1.85 s), and the server wakes as the last
#: one is sent, so it has an rpc timeout to answer it.
RPC_TIMEOUT = 0.5
ATTEMPTS = 4


@contextlib.contextmanager
def lease_server(*extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """One ``python -m lease_server`` process on the memory backend."""
    command = ("-m", "lease_server", *SERVER_ARGS, *extra)
    with lease_server_processes("memory://", 1, command) as [(address, proc)]:
        yield address, proc


@contextlib.contextmanager
def paused(proc: subprocess.Popen[str], stub: Any) -> Iterator[None]:
    """SIGSTOP ``proc`` now; SIGCONT it once the client of ``stub`` has sent
    :data:`ATTEMPTS` calls it has no reply to (about 1.9 s on), or on leaving."""
    proc.send_signal(signal.SIGSTOP)
    leaving = threading.Event()

    def wake() -> None:
        end = time.monotonic() + HANG_GUARD
        while in_flight(stub) < ATTEMPTS and time.monotonic() < end and not leaving.is_set():
            time.sleep(0.005)
        proc.send_signal(signal.SIGCONT)

    waker = threading.Thread(target=wake)
    waker.start()
    try:
        yield
    finally:
        leaving.set()
        waker.join()
        proc.send_signal(signal.SIGCONT)


def settled(stub: Any) -> bool:
    """No call of the client in flight on any of its streams (the releases of grants
    nobody waits for are calls too)."""
    return all(stream._book.in_flight == 0 for stream in list(stub._streams))


def wait_until(check: Callable[[], bool]) -> None:
    end = time.monotonic() + HANG_GUARD
    while not check():
        assert time.monotonic() < end, "condition still false"
        time.sleep(0.01)


def old_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: every grant whose caller stopped waiting is released, whoever else
    waits for the same request id (the rule before)."""
    monkeypatch.setattr(_lease_stream.Acquires, "keeps", lambda self, rid, grant: False)


def sync_retried_acquire(address: str, proc: subprocess.Popen[str]) -> tuple[Any, Any]:
    """``acquire_nowait`` across the pause, then a second client's try: (the first
    lease, the second client's outcome)."""
    with (
        LeaseClient(address, holder="first", rpc_timeout=RPC_TIMEOUT, transport="stream") as first,
        LeaseClient(address, holder="second", transport="stream") as second,
    ):
        first.acquire_nowait("warm", ttl=60).release()  # the stream is open, its limit known
        with paused(proc, first._stub):
            lease = first.acquire_nowait("r", ttl=60)
        wait_until(lambda: settled(first._stub))
        try:
            outcome: Any = second.acquire("r", ttl=60, timeout=1.0)
        except LeaseHeldError as exc:
            outcome = exc
        lease.check()  # the first holder's own view: still held
        return lease, outcome


def async_retried_acquire(address: str, proc: subprocess.Popen[str]) -> tuple[Any, Any]:
    async def run() -> tuple[Any, Any]:
        first = AsyncLeaseClient(
            address, holder="first", rpc_timeout=RPC_TIMEOUT, transport="stream"
        )
        second = AsyncLeaseClient(address, holder="second", transport="stream")
        try:
            await (await first.acquire_nowait("warm", ttl=60)).release()
            loop = asyncio.get_running_loop()
            with paused(proc, first._stub):
                lease = await first.acquire_nowait("r", ttl=60)
            end = loop.time() + HANG_GUARD
            while not settled(first._stub):
                assert loop.time() < end, "calls still in flight"
                await asyncio.sleep(0.01)
            try:
                outcome: Any = await second.acquire("r", ttl=60, timeout=1.0)
            except LeaseHeldError as exc:
                outcome = exc
            lease.check()  # the first holder's own view: still held
            return lease, outcome
        finally:
            await first.aclose()
            await second.aclose()

    return asyncio.run(run())


TWINS = {"sync": sync_retried_acquire, "async": async_retried_acquire}


@pytest.mark.parametrize("twin", TWINS)
def test_a_retried_acquire_keeps_the_lease_its_abandoned_attempts_were_granted(twin: str) -> None:
    """The server, paused past the rpc timeout, grants the first attempt and replays it
    to the retries: the caller holds that token, and the other client is refused."""
    with lease_server() as (address, proc):
        lease, outcome = TWINS[twin](address, proc)
    assert isinstance(outcome, LeaseHeldError), f"a second holder of token {outcome.token}"
    assert outcome.holder == lease.holder  # the first client holds it, as it believes


@pytest.mark.parametrize("twin", TWINS)
def test_control_releasing_every_abandoned_grant_makes_two_holders(
    twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_rule(monkeypatch)
    with lease_server() as (address, proc):
        lease, outcome = TWINS[twin](address, proc)
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.token > lease.token  # granted while the first still believes it holds


# -- renewals never wait behind acquires ------------------------------------------------

#: The held lease's ttl, and how long the acquires wait in line: past two ttls, so a
#: lease whose renewals cannot be sent is lost meanwhile.
TTL = 1.0
WAIT = 3.0


def one_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the client counts renewals and releases in the acquires' limit, as
    against a server that keeps no lane apart for them (the rule before)."""
    monkeypatch.setattr(_lease_stream, "max_upkeep_of", lambda headers: None)


def sync_hold_behind_waiting_acquires(address: str, waiting: int) -> bool:
    """``hold`` a lease for two ttls while ``waiting`` acquires of the same client wait
    in line on its stream: whether the lease was lost."""
    with (
        LeaseClient(address, holder="holder", transport="unary") as other,
        LeaseClient(address, holder="keeper", transport="stream") as client,
    ):
        busy = [f"busy{i}" for i in range(waiting)]
        other.acquire_many(busy, ttl=60)
        outcomes: list[BaseException] = []

        def wait(resource: str) -> None:
            try:
                client.acquire(resource, ttl=5, timeout=WAIT)
            except BaseException as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=wait, args=(r,)) for r in busy]
        try:
            with client.hold("kept", ttl=TTL) as lease:
                for thread in threads:
                    thread.start()
                wait_until(lambda: in_flight(client._stub) >= waiting)
                lost = lease.lost.wait(2 * TTL)
        except LeaseLost:
            lost = True
        for thread in threads:
            thread.join(HANG_GUARD)
        assert len(outcomes) == waiting and all(
            isinstance(exc, AcquireTimeoutError) for exc in outcomes
        ), outcomes
        return lost


def async_hold_behind_waiting_acquires(address: str, waiting: int) -> bool:
    async def run() -> bool:
        other = AsyncLeaseClient(address, holder="holder", transport="unary")
        client = AsyncLeaseClient(address, holder="keeper", transport="stream")
        try:
            busy = [f"busy{i}" for i in range(waiting)]
            await other.acquire_many(busy, ttl=60)
            tasks = []
            try:
                async with client.hold("kept", ttl=TTL) as lease:
                    tasks = [
                        asyncio.create_task(client.acquire(r, ttl=5, timeout=WAIT)) for r in busy
                    ]
                    end = asyncio.get_running_loop().time() + HANG_GUARD
                    while in_flight(client._stub) < waiting:
                        assert asyncio.get_running_loop().time() < end, "not all in line"
                        await asyncio.sleep(0.01)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lease.lost.wait(), 2 * TTL)
                    lost = lease.lost.is_set()
            except LeaseLost:
                lost = True
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(o, AcquireTimeoutError) for o in outcomes), outcomes
            return lost
        finally:
            await client.aclose()
            await other.aclose()

    return asyncio.run(run())


def in_flight(stub: Any) -> int:
    return sum(stream._book.in_flight for stream in list(stub._streams))


HOLDERS = {"sync": sync_hold_behind_waiting_acquires, "async": async_hold_behind_waiting_acquires}


@pytest.mark.parametrize("twin", HOLDERS)
def test_a_held_lease_is_renewed_while_waiting_acquires_fill_the_streams_limit(
    twin: str,
) -> None:
    with lease_server("--session-max-in-flight", "4") as (address, _):
        assert not HOLDERS[twin](address, 4)


@pytest.mark.parametrize("twin", HOLDERS)
def test_control_renewals_counted_with_the_acquires_lose_the_lease(
    twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_limit(monkeypatch)
    with lease_server("--session-max-in-flight", "4") as (address, _):
        assert HOLDERS[twin](address, 4)


@pytest.mark.parametrize("twin", HOLDERS)
def test_the_default_limit_filled_by_waiting_acquires_leaves_renewals_room(twin: str) -> None:
    """The default limit (256) with more waiters allowed per client than that."""
    with lease_server("--max-waiters-per-client", "300") as (address, _):
        assert not HOLDERS[twin](address, 256)
