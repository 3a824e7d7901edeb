"""The I/O-free half of the SDK, shared by the sync and asyncio clients.

Request builders, response converters, and the rules for retrying: the twins
only send what these functions build and translate what comes back.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

from fencing import _status
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidArgumentError,
)
from fencing.limits import MAX_MESSAGE_BYTES, MAX_WAIT_MS
from fencing.tls import TLSConfig, is_loopback, split_address
from fencing.types import Delete, Fenced, Op, Put, Record
from fencing.v1 import guard_pb2, lease_pb2

#: Per-call deadline for calls that do not wait (seconds).
DEFAULT_RPC_TIMEOUT = 5.0
#: Retry pauses for idempotent calls on transient failures (seconds).
RETRY_BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8)


def channel_options(tls: TLSConfig | None = None) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
    ]
    if tls is not None:
        options.extend(tls.channel_options())
    return options


def channel_credentials(
    target: str,
    *,
    tls: TLSConfig | None = None,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.ChannelCredentials | None:
    """What a client channel to ``target`` is secured with; None means plaintext.

    ``tls`` verifies the server (and presents a client certificate for mTLS);
    ``token`` is sent as ``authorization: Bearer <token>`` on every call, and only
    over TLS or to a loopback address (never in the clear across a network).
    ``credentials`` are taken as they are, for anything else.
    """
    if credentials is not None:
        if tls is not None or token:
            raise InvalidArgumentError(
                "give either credentials or tls/token, not both", field="credentials"
            )
        return credentials
    secure = tls.channel_credentials() if tls is not None else None
    if not token:
        return secure
    if secure is None:
        if not is_loopback(split_address(target)[0]):
            raise InvalidArgumentError(
                f"a bearer token is only sent over TLS or to a loopback address; "
                f"{target} needs tls=TLSConfig(...)",
                field="token",
            )
        secure = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    return grpc.composite_channel_credentials(secure, grpc.access_token_call_credentials(token))


def default_holder() -> str:
    """A holder name unique to this process: ``host-pid-random``."""
    return f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def new_request_id() -> str:
    return uuid.uuid4().hex


def ttl_ms_of(ttl: float, field: str = "ttl") -> int:
    """Seconds (the SDK's unit) -> milliseconds (the wire's)."""
    if ttl <= 0:
        raise InvalidArgumentError(f"{field} must be positive seconds, got {ttl}", field=field)
    return round(ttl * 1000)


def wait_ms_of(remaining: float | None) -> int:
    """How long the server should wait in this Acquire call (capped at the server's limit)."""
    if remaining is None:
        return MAX_WAIT_MS
    return max(0, min(MAX_WAIT_MS, int(remaining * 1000)))


def translate(err: grpc.RpcError) -> Exception:
    """The SDK exception for a failed call (callers chain ``from err``)."""
    return _status.from_rpc_error(err)


def is_transient(exc: BaseException) -> bool:
    """Failures where the request may not have reached a decision: safe to retry idempotently."""
    return isinstance(exc, BackendUnavailableError | DeadlineExceededError)


# -- lease messages -------------------------------------------------------------------------


def acquire_request(
    resource: str, holder: str, ttl_ms: int, wait_ms: int, request_id: str
) -> lease_pb2.AcquireRequest:
    return lease_pb2.AcquireRequest(
        resource=resource, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, request_id=request_id
    )


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What ``describe`` returns."""

    resource: str
    held: bool
    holder: str
    token: int
    remaining_ms: int
    last_token: int


def lease_state(msg: lease_pb2.LeaseState) -> LeaseState:
    return LeaseState(
        msg.resource, msg.held, msg.holder, msg.token, msg.remaining_ms, msg.last_token
    )


# -- guard messages -------------------------------------------------------------------------


def op_to_proto(op: Op) -> guard_pb2.Op:
    if isinstance(op, Put):
        return guard_pb2.Op(put=guard_pb2.Put(key=op.key, value=op.value))
    if isinstance(op, Delete):
        return guard_pb2.Op(delete=guard_pb2.Delete(key=op.key))
    raise InvalidArgumentError(f"not an op: {op!r}", field="ops")


def write_request(
    fenced: Fenced, ops: Iterable[Op], idempotency_key: str = ""
) -> guard_pb2.WriteRequest:
    return guard_pb2.WriteRequest(
        resource=fenced.resource,
        token=fenced.token,
        ops=[op_to_proto(op) for op in ops],
        idempotency_key=idempotency_key,
    )


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The fence after a write; ``replayed`` if an idempotency key matched an earlier one."""

    fence: int
    replayed: bool


def write_result(msg: guard_pb2.WriteResponse) -> WriteResult:
    return WriteResult(msg.fence, msg.replayed)


def read_result(msg: guard_pb2.ReadResponse) -> Record | None:
    return Record(msg.value, msg.written_by_token) if msg.found else None


def ops_list(ops: Sequence[Op] | Op) -> list[Op]:
    return [ops] if isinstance(ops, Put | Delete) else list(ops)
