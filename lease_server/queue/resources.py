"""Claims of jobs that name their own resource: each claim holds the lease on it.

A job enqueued with ``resource="orders/1"`` fences its effects under the name a lease
on ``orders/1`` does, so its claims and those leases must draw their tokens from the
resource's one counter (G1) and exclude each other (G2). The queue and the leases may
live in different stores (SQLite keeps them in two files; a queue may sit beside a
Redis lease backend), so no queue transaction can take the resource's token itself.
Instead the claim of such a job *is* a lease on its resource, taken and given back
through the lease service's own acquire, renew and release (its validation, waiters,
metrics and event log):

- **Claim.** The queue backend claims the job as any other, with a provisional token
  that is never handed out; then the lease on its resource is acquired for the claim's
  ttl, holder the worker, without waiting, and the job's token becomes the lease's
  (``QueueBackend.retoken``). While someone else holds the lease, the job is given back
  due when that lease expires, or in a second if sooner (``put_back``: the attempt does
  not count), and the claim goes on without it. So a lease holder is never joined by a
  job, and a job's claim makes a lease acquire wait or get ``LEASE_HELD``.
- **Heartbeat.** The leases are renewed first: one that was lost (expired and taken,
  released) refuses the heartbeat with ``LEASE_LOST``, whatever the job row says.
- **Complete, Fail, Release, Cancel.** The job first, then its lease is released (one
  already gone expired by itself). A cancel of a running job also fences with a token
  of the lease counter: it acquires and releases the resource once, holder ``cancel``.
- **Rescue.** The claim of an expired job acquires the lease, which expired before the
  job's claim did (the lease is renewed before the job), so the rescue takes it over:
  the lease log has EXPIRED then ACQUIRED, as for any takeover.

A crash between two steps leaves a lease or a claim that ends by its ttl. The job's own
events are the lease's (``jobs.transitions`` logs none for it), and a strict guard
finds its claim in the lease. Which resource a job names is remembered from its claim
(per process, bounded), else read from the backend.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from fencing.errors import FencingError, LeaseHeldError, LeaseLost
from fencing.v1 import lease_pb2
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.jobs import JobRecord, JobRef, parse_default_resource

log = logging.getLogger(__name__)

#: The holder of the lease a cancel takes and gives back at once for its fence token.
CANCEL_HOLDER = "cancel"
#: The shortest and longest wait before a job whose resource's lease is held is due
#: again: about when that lease expires, but asked again at least every second (the
#: lease may be released early), and never in a busy loop.
MIN_PUT_BACK_MS = 50
MAX_PUT_BACK_MS = 1000
#: How many claimed jobs' resources one process remembers.
REMEMBERED = 100_000


class LeaseCalls(Protocol):
    """The lease service's calls, as :class:`lease_server.service.LeaseService` has them
    (each raises its :mod:`fencing.errors` refusal)."""

    async def acquire(self, request: lease_pb2.AcquireRequest) -> lease_pb2.Lease: ...

    async def renew(self, request: lease_pb2.RenewRequest) -> lease_pb2.Lease: ...

    async def release(self, request: lease_pb2.ReleaseRequest) -> lease_pb2.ReleaseResponse: ...


def lease_request_id(request_id: str, job_id: int) -> str:
    """The request id of the acquire of job ``job_id``'s lease by the Claim ``request_id``
    ("" for none): one per job, so two jobs of one Claim naming the same resource never
    replay each other's lease (the second is refused it, as without a request id)."""
    if not request_id:
        return ""
    return hashlib.sha256(f"{request_id}\0{job_id}".encode()).hexdigest()[:32]


def counts_job_claims(resource: str) -> bool:
    """Whether the queue's own claim tokens are tokens of ``resource`` (a job's default
    resource); any other resource's tokens are all its leases' (Describe's last_token)."""
    return parse_default_resource(resource) is not None


class ResourceLeases:
    """Holds the leases of claims of jobs naming their own resource (module docstring)."""

    def __init__(self, backend: QueueBackend, leases: LeaseCalls) -> None:
        self.backend = backend
        self.leases = leases
        self._names: OrderedDict[int, str] = OrderedDict()

    def _remember(self, job_id: int, resource: str) -> None:
        self._names[job_id] = resource
        self._names.move_to_end(job_id)
        while len(self._names) > REMEMBERED:
            self._names.popitem(last=False)

    async def _resource(self, job_id: int) -> str:
        name = self._names.get(job_id)
        if name is None:
            record = await self.backend.get(job_id)
            name = record.resource if record is not None else ""
            self._remember(job_id, name)
        return name

    async def named(self, refs: Sequence[JobRef]) -> list[tuple[JobRef, str]]:
        """The refs of jobs naming their own resource, with it."""
        out = []
        for ref in refs:
            resource = await self._resource(ref.id)
            if resource:
                out.append((ref, resource))
        return out

    async def take(
        self, claimed: Sequence[JobRecord], worker: str, ttl_ms: int, request_id: str = ""
    ) -> list[JobRecord]:
        """``claimed`` with each job naming its own resource holding its lease (the token
        the lease's); those whose lease is held by someone else are given back, left out.

        With the Claim's ``request_id``, each lease is acquired with a request id of its
        own job (:func:`lease_request_id`), so a retried Claim whose jobs the backend
        replayed gets each job's lease back (the acquire replays it) and renews it for
        ``ttl_ms``, as the backend extended the job's lease."""
        out = []
        for record in claimed:
            self._remember(record.id, record.resource)
            if not record.resource:
                out.append(record)
                continue
            taken = await self._take(record, worker, ttl_ms, request_id)
            if taken is not None:
                out.append(taken)
        return out

    async def _take(
        self, record: JobRecord, worker: str, ttl_ms: int, request_id: str
    ) -> JobRecord | None:
        ref = JobRef(record.id, record.token)
        request = lease_pb2.AcquireRequest(
            resource=record.resource,
            holder=worker,
            ttl_ms=ttl_ms,
            request_id=lease_request_id(request_id, record.id),
        )
        try:
            lease = await self.leases.acquire(request)
            if lease.token == record.token:
                # The job already holds this lease: a replayed claim (or a provisional
                # token that happens to equal the lease's, just granted for ttl_ms). Its
                # lease lasts as long as the job's, which the replay extended.
                await self.renew([(ref, record.resource)], ttl_ms)
        except LeaseHeldError as held:
            due_in = min(MAX_PUT_BACK_MS, max(MIN_PUT_BACK_MS, held.remaining_ms))
            await self.backend.put_back(ref, due_in)
            log.info(
                "job %d not claimed: its resource %r is held by %r",
                record.id,
                record.resource,
                held.holder,
                extra={"job_id": record.id, "resource": record.resource},
            )
            return None
        except BaseException:
            await self._put_back_quietly(ref)
            raise
        try:
            stored = await self.backend.retoken(ref, lease.token)
        except BaseException:
            await self.release([(JobRef(record.id, lease.token), record.resource)])
            raise
        return replace(record, token=stored.token)

    async def _put_back_quietly(self, ref: JobRef) -> None:
        try:
            await self.backend.put_back(ref, 0)
        except Exception as exc:  # the claim ends by its ttl instead
            log.warning("job %d could not be given back: %s", ref.id, exc)

    async def renew(self, named: Sequence[tuple[JobRef, str]], ttl_ms: int) -> None:
        """Renew the leases of ``named`` claims; ``LeaseLost`` naming the first lost one."""
        for ref, resource in named:
            request = lease_pb2.RenewRequest(resource=resource, token=ref.token, ttl_ms=ttl_ms)
            try:
                await self.leases.renew(request)
            except LeaseLost as exc:
                raise LeaseLost(
                    f"job {ref.id}: its lease on {resource!r} with token {ref.token} is lost",
                    resource=resource,
                    token=ref.token,
                ) from exc

    async def release(self, named: Sequence[tuple[JobRef, str]]) -> None:
        """Release the leases of ``named`` claims that ended; one already gone (expired,
        taken over) or unreachable is left to its expiry."""
        for ref, resource in named:
            request = lease_pb2.ReleaseRequest(resource=resource, token=ref.token)
            try:
                await self.leases.release(request)
            except LeaseLost:
                pass
            except FencingError as exc:
                log.warning("lease %r of job %d not released: %s", resource, ref.id, exc)

    async def cancelled(self, ref: JobRef, resource: str) -> int:
        """After the cancel of the running claim ``ref``: release its lease and return a
        token the lease counter granted past it (0 if another holder took the resource
        first: its token fences the cancelled claim)."""
        await self.release([(ref, resource)])
        request = lease_pb2.AcquireRequest(resource=resource, holder=CANCEL_HOLDER, ttl_ms=1000)
        try:
            lease = await self.leases.acquire(request)
        except LeaseHeldError:
            return 0
        await self.release([(JobRef(ref.id, lease.token), resource)])
        return int(lease.token)
