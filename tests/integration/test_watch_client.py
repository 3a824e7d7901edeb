"""The public watch of both SDK twins serves what a resuming follower needs: where a
stream starts and which log it reads (``watch_stream``), a resume cursor bound to its
log (``log_id``), and the log a RESYNC continues in (``LeaseEvent.log_id``)."""

from __future__ import annotations

from fencing import AsyncLeaseClient, LeaseClient
from fencing.client import EventKind
from fencing.testing import RunningServers
from tests.integration.test_watch_api import events_of


def test_a_stream_says_where_it_starts_and_resumes_only_in_its_own_log(
    servers: RunningServers,
) -> None:
    with LeaseClient(servers.lease_address, holder="w") as leases:
        for _ in range(3):
            leases.acquire("r", ttl=5).release()  # revisions 1..6
        identity = servers.call(events_of(servers.lease).log_id())
        with leases.watch_stream(prefix="") as opened:
            assert (opened.start_revision, opened.log_id) == (6, identity)
        # The cursor of this log resumes as before.
        with leases.watch_stream(prefix="", after_revision=4, log_id=identity) as own:
            events = iter(own)
            assert [(e.kind, e.token) for e in (next(events), next(events))] == [
                (EventKind.ACQUIRED, 3),
                (EventKind.RELEASED, 3),
            ]
        # Revision 4 of another log means nothing here: RESYNC, naming this log.
        foreign = leases.watch("", prefix="", after_revision=4, log_id="another-log")
        resync = next(foreign)
        assert (resync.kind, resync.revision, resync.log_id) == (EventKind.RESYNC, 6, identity)
        foreign.close()


async def test_the_async_twin_opens_and_resumes_the_same_way(servers: RunningServers) -> None:
    identity = servers.call(events_of(servers.lease).log_id())
    async with AsyncLeaseClient(servers.lease_address, holder="w") as leases:
        await (await leases.acquire("r", ttl=5)).release()  # revisions 1..2
        async with await leases.watch_stream(prefix="") as opened:
            assert (opened.start_revision, opened.log_id) == (2, identity)
        async with await leases.watch_stream(prefix="", after_revision=1, log_id=identity) as own:
            async for event in own:
                assert (event.kind, event.revision) == (EventKind.RELEASED, 2)
                break
        foreign = leases.watch(prefix="", after_revision=1, log_id="another-log")
        resync = await anext(foreign)
        assert (resync.kind, resync.log_id) == (EventKind.RESYNC, identity)
        await foreign.aclose()
