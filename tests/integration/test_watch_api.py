"""LeaseService.Watch over real gRPC: events, order, prefixes, resume, resync, shutdown."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from fencing import LeaseClient
from fencing.testing import RunningServers
from fencing.types import WATCH_LOG_KEY, WATCH_START_KEY
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import EventLog
from lease_server.server import LeaseServer

Kind = lease_pb2.LeaseEvent
HANG_GUARD = 20.0  # seconds: a whole stream's deadline, only ever reached by a bug


def events_of(server: LeaseServer) -> EventLog:
    """The event log behind a lease server (the embedded backends all keep one)."""
    assert server.service.events is not None
    return server.service.events


@pytest.fixture
def stub(servers: RunningServers) -> Iterator[lease_pb2_grpc.LeaseServiceStub]:
    with grpc.insecure_channel(servers.lease_address) as channel:
        yield lease_pb2_grpc.LeaseServiceStub(channel)


def watch(
    stub: lease_pb2_grpc.LeaseServiceStub, **fields: object
) -> Iterator[lease_pb2.LeaseEvent]:
    """Open a stream and wait until the server has it (headers), so no event is missed."""
    call = stub.Watch(lease_pb2.WatchRequest(**fields), timeout=HANG_GUARD)  # type: ignore[arg-type]
    call.initial_metadata()
    return call


def take(stream: Iterator[lease_pb2.LeaseEvent], n: int) -> list[tuple[int, str, int]]:
    return [(e.kind, e.resource, e.token) for e in (next(stream) for _ in range(n))]


def test_acquire_renew_release_are_streamed_in_order(
    stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    stream = watch(stub, resource="orders")
    lease = leases.acquire("orders", ttl=5)
    lease.renew()
    lease.release()
    events = [next(stream) for _ in range(2)]
    # A renewal is not an event: nothing between the grant and its release.
    assert [(e.kind, e.token) for e in events] == [(Kind.ACQUIRED, 1), (Kind.RELEASED, 1)]
    assert events[0].holder == "tester" and events[0].ttl_ms == 5000
    assert events[0].revision < events[1].revision


def test_expiry_is_streamed_before_the_takeover(
    servers: RunningServers, stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    stream = watch(stub, prefix="")
    leases.acquire("job", ttl=0.2)  # never renewed: the sweeper reports its expiry
    assert take(stream, 2) == [(Kind.ACQUIRED, "job", 1), (Kind.EXPIRED, "job", 1)]
    with LeaseClient(servers.lease_address, holder="next") as other:
        other.acquire("job", ttl=5)
    assert take(stream, 1) == [(Kind.ACQUIRED, "job", 2)]


def test_a_prefix_sees_only_its_resources(
    stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    stream = watch(stub, prefix="jobs/")
    for name in ("other", "jobs/1", "jobsx", "jobs/2"):
        leases.acquire(name, ttl=5)
    assert take(stream, 2) == [(Kind.ACQUIRED, "jobs/1", 1), (Kind.ACQUIRED, "jobs/2", 1)]


def test_resume_after_a_revision_misses_nothing(
    stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    first = watch(stub, resource="r")
    leases.acquire("r", ttl=5).release()
    acquired = next(first)
    first.cancel()  # type: ignore[attr-defined]
    leases.acquire("r", ttl=5)  # while nobody watches
    resumed = watch(stub, resource="r", after_revision=acquired.revision)
    assert take(resumed, 2) == [(Kind.RELEASED, "r", 1), (Kind.ACQUIRED, "r", 2)]


def test_a_pruned_cursor_gets_resync_then_live_events(
    servers: RunningServers, stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    for _ in range(3):
        leases.acquire("r", ttl=5).release()  # revisions 1..6
    servers.call(events_of(servers.lease).prune_events(2))
    stream = watch(stub, resource="r", after_revision=1)
    resync = next(stream)
    assert (resync.kind, resync.revision, resync.resource) == (Kind.RESYNC, 6, "r")
    leases.acquire("r", ttl=5)
    assert take(stream, 1) == [(Kind.ACQUIRED, "r", 4)]
    # A cursor from the future (another or a reset log) is not served either.
    future = watch(stub, prefix="", after_revision=1000)
    resync = next(future)
    assert (resync.kind, resync.revision) == (Kind.RESYNC, 7)


def test_a_cursor_of_another_log_gets_resync_never_a_silent_skip(
    servers: RunningServers, stub: lease_pb2_grpc.LeaseServiceStub, leases: LeaseClient
) -> None:
    for _ in range(3):
        leases.acquire("r", ttl=5).release()  # revisions 1..6, all still in the log
    identity = servers.call(events_of(servers.lease).log_id())
    opened = stub.Watch(lease_pb2.WatchRequest(prefix=""), timeout=HANG_GUARD)
    headers = dict(opened.initial_metadata())
    opened.cancel()
    assert headers[WATCH_LOG_KEY] == identity
    assert headers[WATCH_START_KEY] == "6"
    # The cursor of this log resumes as before.
    own = watch(stub, prefix="", after_revision=4, log_id=identity)
    assert take(own, 2) == [(Kind.ACQUIRED, "r", 3), (Kind.RELEASED, "r", 3)]
    own.cancel()  # type: ignore[attr-defined]
    # Revision 4 of another log means nothing here: RESYNC at the head, naming this log.
    foreign = watch(stub, prefix="", after_revision=4, log_id="another-log")
    resync = next(foreign)
    assert (resync.kind, resync.revision, resync.log_id) == (Kind.RESYNC, 6, identity)
    leases.acquire("r", ttl=5)
    assert take(foreign, 1) == [(Kind.ACQUIRED, "r", 4)]


def test_resource_and_prefix_together_are_invalid(stub: lease_pb2_grpc.LeaseServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.Watch(lease_pb2.WatchRequest(resource="r", prefix="r"), timeout=5)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prefix" in (err.value.details() or "")


def test_stopping_the_server_ends_streams_with_unavailable(
    servers: RunningServers, stub: lease_pb2_grpc.LeaseServiceStub
) -> None:
    stream = watch(stub, prefix="")
    servers.call(servers.lease.stop(5))
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
