"""``fencing.v1.GuardService`` over a :class:`~guard.stores.base.GuardStore`.

Validates each request whole before the store sees it (a bad op anywhere means
nothing is applied), and logs each acceptance and each stale-token (or, strict,
lease-lost) rejection with resource and tokens (as structured fields too), never
values, counts them (:mod:`guard.metrics`) and remembers the recent refusals of each
resource (:mod:`guard.refusals`, read by ``ListRefusals``). ``ResetFence``, the operator's
recovery from a wedged fence, is logged at WARNING with who, what, from and to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, cast

import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import _status, limits
from fencing._version import VERSION
from fencing.errors import (
    FencingError,
    InvalidArgumentError,
    LeaseLost,
    NotFoundError,
    PermissionDeniedError,
    StaleTokenError,
)
from fencing.types import Delete, Op, Put
from fencing.v1 import guard_pb2, guard_pb2_grpc
from guard.commit import GroupCommit
from guard.fence import FenceMode
from guard.follower import FollowerStatus
from guard.metrics import GuardMetrics
from guard.refusals import RefusalLog
from guard.stores.base import (
    BatchedWrite,
    GuardStore,
    RecordLister,
    ResourceWrite,
    Verdict,
)
from serving.admission import authorize_item, current_principal
from serving.server import rpc

#: Messages of one WriteStream judged at once; the stream stops reading beyond it.
STREAM_WINDOW = 64

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def ops_from_proto(ops: Any, field: str = "ops", *, required: bool = True) -> list[Op]:
    """Validate and convert repeated ``Op``; the error names the op's index and field.

    ``required=False`` allows none (a resource of a WriteMany checked and advanced only).
    """
    if required or ops:
        limits.check_op_count(len(ops), field)
    result: list[Op] = []
    for i, op in enumerate(ops):
        which = op.WhichOneof("op")
        try:
            if which == "put":
                put = op.put
                result.append(Put(limits.check_key(put.key), limits.check_value(put.value)))
            elif which == "delete":
                result.append(Delete(limits.check_key(op.delete.key)))
            else:
                raise InvalidArgumentError(
                    f"{field}[{i}] must be a put or a delete", field=f"{field}[{i}]"
                )
        except InvalidArgumentError as exc:
            if exc.field not in ("key", "value"):
                raise
            # Named only now, off the hot path: check again under the op's full name.
            named = f"{field}[{i}].{which}.{exc.field}"
            item = getattr(op, str(which))
            if exc.field == "key":
                limits.check_key(item.key, named)
            limits.check_value(item.value, named)
            raise  # pragma: no cover - the named check raises the same error
    return result


def write_from_proto(request: guard_pb2.WriteRequest, field: str = "") -> BatchedWrite:
    """Validate one ``WriteRequest`` whole; errors name ``field`` + the request's field."""
    if not field:  # the hot path (Write, WriteStream): the field names as they are
        return BatchedWrite(
            limits.check_resource(request.resource),
            limits.check_token(request.token),
            ops_from_proto(request.ops),
            limits.check_idempotency_key(request.idempotency_key),
        )
    return BatchedWrite(
        resource=limits.check_resource(request.resource, f"{field}resource"),
        token=limits.check_token(request.token, f"{field}token"),
        ops=ops_from_proto(request.ops, f"{field}ops"),
        idempotency_key=limits.check_idempotency_key(
            request.idempotency_key, f"{field}idempotency_key"
        ),
    )


class Grants(Protocol):
    """What a guard knows of the tokens its lease server granted (watch mode:
    :class:`guard.follower.LeaseFollower`)."""

    def vouched(self, resource: str, token: int) -> bool:
        """True if ``token`` needs no question (seen granted, or not followed)."""

    async def vouch(self, resource: str, token: int) -> None:
        """Return if ``token`` was granted; ``LeaseLost`` if it never was."""


class Following(Protocol):
    """A watch guard's follower, as DescribeGuard reports it."""

    @property
    def status(self) -> FollowerStatus: ...


def _write_error(exc: FencingError) -> guard_pb2.WriteError:
    code, reason, message, metadata = _status.to_fields(exc)
    return guard_pb2.WriteError(code=code, reason=reason, message=message, metadata=metadata)


class GuardService(guard_pb2_grpc.GuardServiceServicer):
    """The guard's RPC handlers.

    Writes in every mode but strict go through one :class:`~guard.commit.GroupCommit`,
    whether they come from ``Write`` or ``WriteStream``: concurrent writes share store
    transactions. ``commit_concurrency`` (default: the store's own
    ``commit_concurrency``, else 1) is how many such transactions run at once.
    """

    def __init__(
        self,
        store: GuardStore,
        mode: FenceMode = FenceMode.MONOTONIC,
        metrics: GuardMetrics | None = None,
        *,
        commit_concurrency: int | None = None,
    ) -> None:
        self.store = store
        self.mode = mode
        self.stale_rejections = 0
        self.metrics = metrics or GuardMetrics(CollectorRegistry())
        self.refusals = RefusalLog()
        #: What DescribeGuard reports, set by the server once it knows them.
        self.store_name = store.name
        self.durability_warning = ""
        self.follower: Following | None = None
        #: Watch mode: who vouches for tokens above those seen granted (set by the server
        #: once the follower exists); None: the fence rule alone judges.
        self.grants: Grants | None = None
        self.commit: GroupCommit | None = None
        if mode is not FenceMode.STRICT:
            self.commit = GroupCommit(
                store, mode, concurrency=commit_concurrency or store.commit_concurrency
            )

    async def _write_all(self, writes: Sequence[BatchedWrite]) -> list[Verdict]:
        """One verdict per write, in order; store failures raise."""
        try:
            if self.commit is not None:
                verdicts = await self.commit.submit(writes)
            else:
                verdicts = list(await asyncio.gather(*(self._write_one(w) for w in writes)))
        except FencingError:
            self.metrics.writes.labels("error").inc(len(writes))
            raise
        accepted = replayed = 0
        debug = log.isEnabledFor(logging.DEBUG)  # checked once: this loop is the hot path
        for w, verdict in zip(writes, verdicts, strict=True):
            if isinstance(verdict, StaleTokenError | LeaseLost):
                self._refused("write", w.resource, w.token, verdict)
                continue
            if verdict.replayed:
                replayed += 1
            else:
                accepted += 1
            if debug:
                log.debug(
                    "write accepted resource=%s token=%d ops=%d fence=%d%s",
                    w.resource,
                    w.token,
                    len(w.ops),
                    verdict.fence,
                    " (replayed)" if verdict.replayed else "",
                    extra={
                        "resource": w.resource,
                        "token": w.token,
                        "op_count": len(w.ops),
                        "fence": verdict.fence,
                    },
                )
        if accepted:
            self.metrics.writes.labels("accepted").inc(accepted)
        if replayed:
            self.metrics.writes.labels("replayed").inc(replayed)
        return verdicts

    async def _never_granted(
        self, items: Sequence[tuple[str, int]], call: str = "write"
    ) -> list[FencingError | None]:
        """Admission, before the store: per (resource, token), the error of a token the
        lease server never granted (or could not be asked about), else None."""
        grants = self.grants
        if grants is None:
            return [None] * len(items)
        asking = [(i, r, t) for i, (r, t) in enumerate(items) if not grants.vouched(r, t)]
        found: list[FencingError | None] = [None] * len(items)
        if not asking:
            return found
        answers = await asyncio.gather(
            *(grants.vouch(r, t) for _, r, t in asking), return_exceptions=True
        )
        for (i, resource, token), answer in zip(asking, answers, strict=True):
            if isinstance(answer, FencingError):
                found[i] = answer
                self.refusals.record(
                    resource,
                    answer.reason,
                    token,
                    call=call,
                    principal=current_principal() or "",
                )
                log.warning(
                    "unvouched token refused resource=%s token=%d: %s",
                    resource,
                    token,
                    answer,
                    extra={
                        "resource": resource,
                        "token": token,
                        "principal": current_principal() or "",
                    },
                )
            elif isinstance(answer, BaseException):
                raise answer
        return found

    async def _admit(self, resource: str, token: int, call: str = "write") -> None:
        """Raise what :meth:`_never_granted` finds for one token."""
        if self.grants is not None and not self.grants.vouched(resource, token):
            (error,) = await self._never_granted([(resource, token)], call)
            if error is not None:
                raise error

    async def _write_one(self, w: BatchedWrite) -> Verdict:
        try:
            return await self.store.write(w.resource, w.token, w.ops, w.idempotency_key, self.mode)
        except (StaleTokenError, LeaseLost) as exc:
            return exc

    def _refused(
        self, what: str, resource: str, token: int, exc: StaleTokenError | LeaseLost
    ) -> None:
        """Count and log a refused write (``stale`` or, strict, ``lease_lost``)."""
        if isinstance(exc, StaleTokenError):
            self.metrics.writes.labels("stale").inc()
            self._rejected(what, resource, token, exc)
            return
        self.metrics.writes.labels("lease_lost").inc()
        self._lease_lost(what, resource, token)

    def _lease_lost(self, what: str, resource: str, token: int) -> None:
        principal = current_principal() or ""
        self.refusals.record(resource, LeaseLost.reason, token, call=what, principal=principal)
        log.warning(
            "%s refused resource=%s token=%d: not the live lease or job claim (strict)",
            what,
            resource,
            token,
            extra={
                "resource": resource,
                "token": token,
                "principal": principal,
            },
        )

    def _rejected(self, what: str, resource: str, token: int, exc: StaleTokenError) -> None:
        self.stale_rejections += 1
        self.metrics.stale(resource)
        principal = current_principal() or ""
        self.refusals.record(
            resource,
            StaleTokenError.reason,
            token,
            fence=exc.current_token,
            call=what,
            principal=principal,
        )
        log.warning(
            "stale %s rejected resource=%s token=%d fence=%d",
            what,
            resource,
            token,
            exc.current_token,
            extra={
                "resource": resource,
                "token": token,
                "current_token": exc.current_token,
                "principal": principal,
            },
        )

    @rpc
    async def Write(
        self, request: guard_pb2.WriteRequest, context: Context
    ) -> guard_pb2.WriteResponse:
        write = write_from_proto(request)
        await self._admit(write.resource, write.token)
        (verdict,) = await self._write_all([write])
        if isinstance(verdict, StaleTokenError | LeaseLost):
            raise verdict
        return guard_pb2.WriteResponse(
            fence=verdict.fence,
            replayed=verdict.replayed,
            replayed_by_token=verdict.replayed_by_token,
        )

    @rpc
    async def WriteMany(
        self, request: guard_pb2.WriteManyRequest, context: Context
    ) -> guard_pb2.WriteManyResponse:
        writes = [
            ResourceWrite(
                resource=limits.check_resource(w.resource, f"writes[{i}].resource"),
                token=limits.check_token(w.token, f"writes[{i}].token"),
                ops=ops_from_proto(w.ops, f"writes[{i}].ops", required=False),
            )
            for i, w in enumerate(request.writes)
        ]
        limits.check_write_resources([w.resource for w in writes])
        total_ops = sum(len(w.ops) for w in writes)
        if total_ops > limits.MAX_OPS:
            limits.check_op_count(total_ops, "writes[].ops")
        key = limits.check_idempotency_key(request.idempotency_key)
        for error in await self._never_granted(
            [(w.resource, w.token) for w in writes], "multi-resource write"
        ):
            if error is not None:
                raise error
        try:
            result = await self.store.write_many(writes, key, self.mode)
        except (StaleTokenError, LeaseLost) as exc:
            self._refused("multi-resource write", exc.resource, exc.token, exc)
            raise
        except FencingError:
            self.metrics.writes.labels("error").inc()
            raise
        self.metrics.writes.labels("replayed" if result.replayed else "accepted").inc()
        log.debug(
            "multi-resource write accepted",
            extra={
                "resources": ",".join(w.resource for w in writes),
                "op_count": total_ops,
                "replayed": result.replayed,
            },
        )
        return guard_pb2.WriteManyResponse(
            fences=[
                guard_pb2.FenceState(resource=w.resource, fence=fence)
                for w, fence in zip(writes, result.fences, strict=True)
            ],
            replayed=result.replayed,
            replayed_by_tokens=result.replayed_by_tokens,
        )

    async def WriteStream(
        self, request_iterator: AsyncIterator[guard_pb2.WriteStreamRequest], context: Context
    ) -> AsyncIterator[guard_pb2.WriteStreamResponse]:
        """Answer each message with its verdicts; messages are judged concurrently (up to
        ``STREAM_WINDOW`` at once), so answers may come back in another order."""
        answers: asyncio.Queue[guard_pb2.WriteStreamResponse | BaseException | None] = (
            asyncio.Queue()
        )
        window = asyncio.Semaphore(STREAM_WINDOW)
        running: set[asyncio.Task[None]] = set()

        async def answer(message: guard_pb2.WriteStreamRequest) -> None:
            try:
                await answers.put(await self._stream_verdicts(message))
            except BaseException as exc:
                await answers.put(exc)
                raise
            finally:
                window.release()

        async def read() -> None:
            try:
                async for message in request_iterator:
                    limits.check_stream_writes(len(message.writes))
                    await window.acquire()
                    task = asyncio.create_task(answer(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(set(running))
                await answers.put(None)
            except BaseException as exc:
                await answers.put(exc)
                raise

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await answers.get()
                if item is None:
                    return
                if isinstance(item, FencingError):
                    await _status.abort(context, item)
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _stream_verdicts(
        self, message: guard_pb2.WriteStreamRequest
    ) -> guard_pb2.WriteStreamResponse:
        verdicts: list[guard_pb2.WriteVerdict | None] = [None] * len(message.writes)
        valid: list[tuple[int, int, BatchedWrite]] = []
        for i, streamed in enumerate(message.writes):
            try:
                write = write_from_proto(streamed.write)
                authorize_item(write.resource)
                valid.append((i, streamed.id, write))
            except (InvalidArgumentError, PermissionDeniedError) as exc:
                verdicts[i] = guard_pb2.WriteVerdict(id=streamed.id, error=_write_error(exc))
        if self.grants is not None:
            refused = await self._never_granted([(w.resource, w.token) for _, _, w in valid])
            for (i, write_id, _), error in zip(valid, refused, strict=True):
                if error is not None:
                    verdicts[i] = guard_pb2.WriteVerdict(id=write_id, error=_write_error(error))
            valid = [v for v, error in zip(valid, refused, strict=True) if error is None]
        try:
            results: list[Verdict | FencingError] = list(
                await self._write_all([w for _, _, w in valid])
            )
        except FencingError as exc:  # the store failed: every write of the message
            results = [exc] * len(valid)
        for (i, write_id, _), result in zip(valid, results, strict=True):
            if isinstance(result, FencingError):
                verdicts[i] = guard_pb2.WriteVerdict(id=write_id, error=_write_error(result))
            else:
                verdicts[i] = guard_pb2.WriteVerdict(
                    id=write_id,
                    ok=guard_pb2.WriteResponse(
                        fence=result.fence,
                        replayed=result.replayed,
                        replayed_by_token=result.replayed_by_token,
                    ),
                )
        return guard_pb2.WriteStreamResponse(verdicts=[v for v in verdicts if v is not None])

    @rpc
    async def Read(
        self, request: guard_pb2.ReadRequest, context: Context
    ) -> guard_pb2.ReadResponse:
        resource = limits.check_resource(request.resource)
        key = limits.check_key(request.key)
        record = await self.store.read(resource, key)
        if record is None:
            return guard_pb2.ReadResponse(found=False)
        return guard_pb2.ReadResponse(
            found=True, value=record.value, written_by_token=record.written_by_token
        )

    @rpc
    async def ListRecords(
        self, request: guard_pb2.ListRecordsRequest, context: Context
    ) -> guard_pb2.ListRecordsResponse:
        """A page of one resource's records under a key prefix, in key order.

        Asks the store for one more than the page, so a full page says whether another
        follows; the page also stops at MAX_RECORDS_PAGE_BYTES (3 MiB) of values. The
        cursor is the page's last key (the next page starts after it).
        """
        resource = limits.check_resource(request.resource)
        prefix = limits.check_prefix(request.prefix)
        size = limits.check_page_size(request.page_size)
        after = limits.check_record_page_token(request.page_token)
        if not hasattr(self.store, "list_records"):  # optional: a store of its own may not
            raise NotFoundError(f"the guard's store ({self.store.name}) does not list records")
        lister = cast(RecordLister, self.store)
        found = await lister.list_records(resource, prefix, after, size + 1)
        page: list[guard_pb2.KeyRecord] = []
        total = 0
        for key, record in found[:size]:
            if page and total + len(record.value) > limits.MAX_RECORDS_PAGE_BYTES:
                break
            total += len(record.value)
            page.append(
                guard_pb2.KeyRecord(
                    key=key, value=record.value, written_by_token=record.written_by_token
                )
            )
        more = len(found) > len(page)
        return guard_pb2.ListRecordsResponse(
            records=page, next_page_token=page[-1].key if more else ""
        )

    @rpc
    async def Fence(
        self, request: guard_pb2.FenceRequest, context: Context
    ) -> guard_pb2.FenceState:
        resource = limits.check_resource(request.resource)
        token = limits.check_token(request.token)
        await self._admit(resource, token, "fence")
        try:
            fence = await self.store.fence(resource, token, self.mode)
        except StaleTokenError as exc:
            self._rejected("fence", resource, token, exc)
            raise
        except LeaseLost:
            self._lease_lost("fence", resource, token)
            raise
        self.metrics.fence_advanced("fence")
        log.info(
            "fenced resource=%s token=%d",
            resource,
            fence,
            extra={"resource": resource, "token": token, "fence": fence},
        )
        return guard_pb2.FenceState(resource=resource, fence=fence)

    @rpc
    async def DescribeFence(
        self, request: guard_pb2.DescribeFenceRequest, context: Context
    ) -> guard_pb2.FenceState:
        resource = limits.check_resource(request.resource)
        return guard_pb2.FenceState(
            resource=resource, fence=await self.store.describe_fence(resource)
        )

    @rpc
    async def ResetFence(
        self, request: guard_pb2.ResetFenceRequest, context: Context
    ) -> guard_pb2.ResetFenceResponse:
        """Set a fence to the lease server's counter (authorised by ``reset_fence``).

        Audited: one WARNING line with the principal, the resource and the fence before
        and after, and ``fencing_guard_fence_resets_total``. A watch guard's follower
        may raise the fence again from the next event, as it should.
        """
        resource = limits.check_resource(request.resource)
        to_token = limits.check_range("to_token", request.to_token, 0, limits.MAX_TOKEN)
        previous = await self.store.reset_fence(resource, to_token)
        self.metrics.fence_reset(resource)
        principal = current_principal() or ""
        log.warning(
            "fence reset resource=%s from=%d to=%d by=%s",
            resource,
            previous,
            to_token,
            principal or "(no auth)",
            extra={
                "resource": resource,
                "previous_fence": previous,
                "fence": to_token,
                "principal": principal,
            },
        )
        return guard_pb2.ResetFenceResponse(
            resource=resource, previous_fence=previous, fence=to_token
        )

    @rpc
    async def ListRefusals(
        self, request: guard_pb2.ListRefusalsRequest, context: Context
    ) -> guard_pb2.ListRefusalsResponse:
        """The resource's recent refusals, newest first (:class:`guard.refusals.RefusalLog`)."""
        resource = limits.check_resource(request.resource)
        return guard_pb2.ListRefusalsResponse(
            resource=resource,
            refusals=[
                guard_pb2.Refusal(
                    reason=r.reason,
                    token=r.token,
                    fence=r.fence,
                    call=r.call,
                    principal=r.principal,
                    at_unix_ms=r.at_unix_ms,
                )
                for r in self.refusals.recent(resource)
            ],
        )

    @rpc
    async def DescribeGuard(
        self, request: guard_pb2.DescribeGuardRequest, context: Context
    ) -> guard_pb2.GuardInfo:
        """This guard's mode, store, follower and refusal counts."""
        info = guard_pb2.GuardInfo(
            version=VERSION,
            fence_mode=self.mode.value,
            store=self.store_name,
            durability_warning=self.durability_warning,
            refusals=dict(self.refusals.counts),
        )
        if self.follower is not None:
            status = self.follower.status
            info.watch_state = status.state
            info.watch_revision = status.revision
            info.watch_error = status.last_error
        return info
