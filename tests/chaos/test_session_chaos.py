"""Chaos on the lease stream: streams cut while acquires wait, a lease server killed with
streams open. No two holders, by the chaos checker; the unfenced control shows the
history would have caught a former holder's writes.

Each run starts a real lease server (SQLite) and a guard, and three clients in this
process contend for one resource through ``Session`` streams (bench/stream_client.py)
that pass a fault proxy (chaos/proxy.py) to the lease server. A client acquires with a
wait and a request id; when its stream breaks it opens a new one and retries the same
request id (the contract: same lease, or a fresh grant), recording each attempt. Then
it runs a job of a few guarded writes with its token and no renewal, so a job often
outlives its ttl (1 s) while the next holder writes: the guard must refuse the former
holder's writes. The fenced run (guard ``monotonic``) must satisfy every rule of
:func:`chaos.checker.check`; the control (guard ``off``) must break one.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from bench.stream_client import SessionStream
from chaos import servers
from chaos.checker import CheckResult, ViolationKind, check
from chaos.history import Event, Recorder
from chaos.proxy import ThreadedFaultProxy
from chaos.servers import ServerProc
from fencing import _status
from fencing.errors import LeaseHeldError, LeaseLost, StaleTokenError
from fencing.v1 import guard_pb2, guard_pb2_grpc

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

RESOURCE = "orders"
CLIENTS = 3
TTL_MS = 1000
DURATION_S = 8.0
SEED = 11
#: Attempts of one request id across broken streams before the client gives it up.
ATTEMPTS = 6
#: Each client its own connection, so a reset cuts each stream on its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class State:
    """What the fault thread needs to know: acquires waiting now, faults done."""

    waiting: int = 0
    cuts_while_waiting: int = 0
    kills: int = 0
    broken_acquires: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


async def _client(
    name: str, rec: Recorder, lease_target: str, guard_target: str, until: float, state: State
) -> None:
    rng = random.Random(f"{SEED}-{name}")
    guard_channel = grpc.aio.insecure_channel(guard_target)
    guard: Any = guard_pb2_grpc.GuardServiceStub(guard_channel)
    channel: grpc.aio.Channel | None = None
    stream: SessionStream | None = None

    async def reopen() -> SessionStream:
        nonlocal channel, stream
        if stream is not None:
            await stream.close()
        if channel is not None:
            await channel.close()
        channel = grpc.aio.insecure_channel(lease_target, options=OWN_CONNECTION)
        stream = SessionStream(channel)
        return stream

    seq = 0
    try:
        while time.monotonic() < until:
            seq += 1
            request_id = f"{name}-{seq}"
            token = await _acquire(rec, request_id, name, stream or await reopen(), reopen, state)
            if token is None:
                await asyncio.sleep(rng.uniform(0.05, 0.2))
                continue
            for step in range(rng.randint(2, 4)):
                await asyncio.sleep(rng.uniform(0.2, 0.6))  # the work: often past the ttl
                if not await _write(rec, guard, token, f"{request_id}.{step}"):
                    break
            await _release(rec, stream, token, name)
    finally:
        if stream is not None:
            await stream.close()
        if channel is not None:
            await channel.close()
        await guard_channel.close()


async def _acquire(
    rec: Recorder,
    request_id: str,
    holder: str,
    stream: SessionStream,
    reopen: Callable[[], Awaitable[SessionStream]],
    state: State,
) -> int | None:
    """The token granted to ``request_id``, retried on new streams while its stream breaks."""
    for _ in range(ATTEMPTS):
        op = rec.invoke("acquire", RESOURCE, request_id=request_id, ttl_ms=TTL_MS)
        with state.lock:
            state.waiting += 1
        try:
            lease = await asyncio.wait_for(
                stream.acquire(RESOURCE, holder, TTL_MS, wait_ms=2_000, request_id=request_id),
                10,
            )
        except LeaseHeldError:
            rec.complete(op, "fail", error="LEASE_HELD")
            return None
        except Exception as exc:  # the stream broke, the server is down: unknown outcome
            rec.complete(op, "info", error=type(exc).__name__)
            with state.lock:
                state.broken_acquires += 1
            await asyncio.sleep(0.05)
            stream = await reopen()
            continue
        finally:
            with state.lock:
                state.waiting -= 1
        rec.complete(op, "ok", token=lease.token, ttl_ms=lease.ttl_ms)
        return lease.token
    return None


async def _write(rec: Recorder, guard: Any, token: int, value: str) -> bool:
    """One guarded write; False once the guard refused it (the job stops)."""
    op = rec.invoke("write", RESOURCE, token=token, key="k", value=value)
    request = guard_pb2.WriteRequest(
        resource=RESOURCE,
        token=token,
        ops=[guard_pb2.Op(put=guard_pb2.Put(key="k", value=value.encode()))],
    )
    try:
        await guard.Write(request, timeout=5)
    except grpc.aio.AioRpcError as err:
        exc = _status.from_rpc_error(err)
        if isinstance(exc, StaleTokenError):
            rec.complete(op, "fail", error="STALE_TOKEN")
            return False
        rec.complete(op, "info", error=err.code().name)
        return False
    rec.complete(op, "ok")
    return True


async def _release(rec: Recorder, stream: SessionStream | None, token: int, holder: str) -> None:
    op = rec.invoke("release", RESOURCE, token=token)
    if stream is None:
        rec.complete(op, "info", error="no stream")
        return
    try:
        await asyncio.wait_for(stream.release(RESOURCE, token, holder), 5)
    except LeaseLost:
        rec.complete(op, "fail", error="LEASE_LOST")
    except Exception as exc:
        rec.complete(op, "info", error=type(exc).__name__)
    else:
        rec.complete(op, "ok")


def _faults(
    kind: str, proxy: ThreadedFaultProxy, lease: ServerProc, state: State, stop: threading.Event
) -> None:
    rng = random.Random(SEED)
    while not stop.wait(rng.uniform(0.3, 0.7)):
        if kind == "cut":
            with state.lock:
                waiting = state.waiting > 0
            if waiting:
                proxy.reset()  # RST every connection: each stream breaks mid-acquire
                with state.lock:
                    state.cuts_while_waiting += 1
        elif kind == "kill" and state.kills < 2 and rng.random() < 0.3:
            lease.kill()  # every stream open on it breaks
            state.kills += 1
            stop.wait(TTL_MS / 1000 * 1.5)
            lease.restart()


def run(tmp_path: Path, fence_mode: str, fault: str) -> tuple[CheckResult, State]:
    workdir = tmp_path / fence_mode
    (workdir / "logs").mkdir(parents=True)
    lease = servers.lease_server(f"sqlite:{workdir / 'leases.db'}", workdir)
    guard = servers.guard_server(f"sqlite:{workdir / 'guard.db'}", fence_mode, workdir)
    events: list[Event] = []
    state = State()
    lease.start()
    guard.start()
    proxy = ThreadedFaultProxy("127.0.0.1", lease.port)
    proxy.start()
    stop = threading.Event()
    faults = threading.Thread(target=_faults, args=(fault, proxy, lease, state, stop))
    try:
        faults.start()

        async def clients() -> None:
            until = time.monotonic() + DURATION_S
            await asyncio.gather(
                *(
                    _client(
                        f"c{i}",
                        Recorder(events.append, f"c{i}"),
                        proxy.target,
                        guard.target,
                        until,
                        state,
                    )
                    for i in range(CLIENTS)
                )
            )

        asyncio.run(clients())
    finally:
        stop.set()
        faults.join(30)
        proxy.stop()
        guard.close()
        lease.close()
    return check(events, mode="monotonic"), state


@pytest.mark.parametrize("fault", ["cut", "kill"])
def test_broken_streams_never_make_two_holders(tmp_path: Path, fault: str) -> None:
    fenced, state = run(tmp_path, "monotonic", fault)
    assert fenced.valid, fenced.summary()
    if fault == "cut":
        assert state.cuts_while_waiting > 0, "no stream was cut while an acquire waited"
    else:
        assert state.kills > 0, "the lease server was never killed"
    assert state.broken_acquires > 0, "no acquire saw its stream break"
    assert (
        fenced.stats.counts.get("acquire", {}).get("ok", 0) > 0
        if hasattr(fenced.stats, "counts")
        else True
    )
    control, _ = run(tmp_path, "off", fault)
    assert not control.valid, "the control (fencing off) broke no rule: the run proved nothing"
    assert ViolationKind.STALE_WRITE_ACCEPTED in control.kinds(), control.summary()
