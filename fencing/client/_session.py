"""The I/O-free half of a session: one keepalive for every lease a client holds.

Both twins (:mod:`fencing.client.lease`, :mod:`fencing.client.async_lease`) keep one
session per client, started with the first ``hold``. Instead of one renewal loop
per lease, the session wakes when the earliest renewal is due and renews, in one
``RenewMany`` call (one backend transaction), *every* lease whose renewal falls due
within half a renewal period from now. Leases taken at different times so fall into
step after their first renewal, and the number of calls does not grow with the
number of leases: with a ttl of 10 s, about one call every 1.7 to 3.3 s, whether the
client holds one lease or 10,000 (a call carries at most 10,000 renewals).

Each lease keeps its own schedule and its own verdict (:class:`LeaseBase`): a
renewal sent at ``t`` moves that lease's local deadline to ``t + ttl - margin``; a
lease the server reports lost is marked lost alone; a failed call (the server
unreachable) retries every lease in it sooner, never past its local deadline. If
the session cannot reach the server, all its leases reach their deadlines together
and are marked lost: losing the session loses them all, as with an etcd session.
The server keeps no session: a lease's expiry stays its own, so strict guards,
Watch and any lease-server worker see ordinary leases.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from fencing.client._core import (
    Call,
    LeaseBase,
    LeaseSteps,
    Steps,
    renew_request,
    renewal_failure,
    unimplemented,
)
from fencing.errors import FencingError
from fencing.limits import MAX_RENEW_MANY
from fencing.v1 import lease_pb2

log = logging.getLogger(__name__)

L = TypeVar("L", bound=LeaseBase[Any])


class SessionCore(Generic[L]):
    """The leases a session keeps alive, and when and how to renew them."""

    def __init__(self, max_batch: int = MAX_RENEW_MANY) -> None:
        self.max_batch = max_batch
        self._leases: dict[int, L] = {}
        #: RenewMany calls made and renewals sent (for tests and benchmarks).
        self.calls = 0
        self.renewals = 0
        #: The server has no RenewMany (an older one): renew lease by lease with Renew.
        self.one_by_one = False

    def __len__(self) -> int:
        return len(self._leases)

    def add(self, lease: L) -> None:
        self._leases[id(lease)] = lease

    def discard(self, lease: L) -> None:
        self._leases.pop(id(lease), None)

    def sleep_for(self, now: float) -> float | None:
        """Seconds until the next lease needs the session (None: no lease to keep)."""
        wake: float | None = None
        for lease in self._leases.values():
            with lease._guard:
                at = min(lease.schedule.next_renewal, lease.schedule.deadline)
            wake = at if wake is None else min(wake, at)
        return None if wake is None else max(0.0, wake - now)

    def take_due(self, now: float) -> tuple[list[L], list[L]]:
        """``(due, expired)``: leases to renew now (next renewal within half a period),
        and leases whose local deadline passed first (no longer kept: mark them lost).
        Leases already lost or released are dropped."""
        due: list[L] = []
        expired: list[L] = []
        for key, lease in list(self._leases.items()):
            if lease.lost.is_set() or lease.released:
                del self._leases[key]
                continue
            with lease._guard:
                schedule = lease.schedule
                if schedule.expired(now):
                    gone = True
                else:
                    gone = False
                    slack = schedule.ttl * schedule.policy.renew_ratio / 2
                    if schedule.next_renewal <= now + slack:
                        due.append(lease)
            if gone:
                del self._leases[key]
                expired.append(lease)
        return due, expired

    def chunks(self, due: Sequence[L]) -> list[list[L]]:
        return [list(due[i : i + self.max_batch]) for i in range(0, len(due), self.max_batch)]

    def request(self, chunk: Sequence[L]) -> lease_pb2.RenewManyRequest:
        """One RenewMany for ``chunk``, each lease for the ttl it asked for last."""
        self.calls += 1
        self.renewals += len(chunk)
        renewals = []
        for lease in chunk:
            with lease._guard:
                ttl_ms = lease.renew_ttl_ms
            renewals.append(renew_request(lease.resource, lease.token, ttl_ms, lease.holder))
        return lease_pb2.RenewManyRequest(renewals=renewals)

    def rpc_timeout(self, chunk: Sequence[L], sent_at: float, cap: float) -> float:
        """The call's deadline: never past the earliest local deadline in ``chunk``."""
        timeout = cap
        for lease in chunk:
            with lease._guard:
                timeout = min(timeout, lease.schedule.rpc_timeout(sent_at, cap))
        return timeout

    def settle(
        self, chunk: Sequence[L], sent_at: float, response: lease_pb2.RenewManyResponse
    ) -> None:
        """Apply each verdict to its lease: renewed from ``sent_at``, or lost alone."""
        for lease, result in zip(chunk, response.results, strict=True):
            if result.lost:
                lease._mark_lost("renewal refused")
                self.discard(lease)
            else:
                lease._renewed(sent_at, result.lease)

    def failed(self, chunk: Sequence[L], exc: Exception, now: float) -> None:
        """The call failed. Transient (the server unreachable, a deadline): every lease
        in it is retried sooner, never past its local deadline. Anything else the server
        said is final for every lease in it (as a refused single renewal would be)."""
        why = renewal_failure(exc) if isinstance(exc, FencingError) else f"renewal crashed: {exc}"
        if why is None:
            log.info("renewal of %d leases failed, retrying: %s", len(chunk), exc)
            for lease in chunk:
                with lease._guard:
                    lease.schedule.failed(now)
            return
        log.warning("renewal of %d leases failed: %s", len(chunk), why)
        for lease in chunk:
            lease._mark_lost(why)
            self.discard(lease)

    def renew(
        self, chunk: list[L], steps: LeaseSteps[L], guard: AbstractContextManager[object]
    ) -> Steps[None]:
        """Renew ``chunk`` (due leases, at most ``max_batch``) in one RenewMany, as steps
        for the twin's session to run; ``guard`` is held around every change of the
        book (the threaded twin's condition; nothing in the asyncio one). Against a
        server without RenewMany, every due lease is renewed alone from then on."""
        if self.one_by_one:
            for lease in chunk:
                try:
                    yield from steps.renew(lease, None)
                except Exception as exc:  # judged by the lease; never dies silently
                    if lease._renewal_error(exc):
                        with guard:
                            self.discard(lease)
            return
        client = steps.client
        with guard:
            request = self.request(chunk)
        sent_at = client._clock()
        timeout = self.rpc_timeout(chunk, sent_at, client.rpc_timeout)
        try:
            response = yield Call(client._stub.RenewMany, request, timeout)
        except Exception as exc:  # judged here; the session never dies silently
            if unimplemented(exc):
                log.info("%s has no RenewMany: renewing lease by lease", client.target)
                self.one_by_one = True
                yield from self.renew(chunk, steps, guard)
                return
            with guard:
                self.failed(chunk, exc, client._clock())
            return
        with guard:
            self.settle(chunk, sent_at, response)
