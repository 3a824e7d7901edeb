"""The one registry between exceptions and gRPC statuses, round trip."""

from __future__ import annotations

import grpc
import pytest

from fencing import _status
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
    PermissionDeniedError,
    ResourceExhaustedError,
    StaleTokenError,
    UnauthenticatedError,
)

CASES: list[tuple[FencingError, grpc.StatusCode]] = [
    (StaleTokenError(resource="r", token=3, current_token=9), grpc.StatusCode.FAILED_PRECONDITION),
    (LeaseHeldError(resource="r", holder="h", remaining_ms=12), grpc.StatusCode.ABORTED),
    (LeaseLost(resource="r", token=4), grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidArgumentError("ttl_ms is 5", field="ttl_ms"), grpc.StatusCode.INVALID_ARGUMENT),
    (BackendUnavailableError("db down"), grpc.StatusCode.UNAVAILABLE),
    (UnauthenticatedError("who?"), grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError("no"), grpc.StatusCode.PERMISSION_DENIED),
    (ResourceExhaustedError("too many", limit="waiters"), grpc.StatusCode.RESOURCE_EXHAUSTED),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda v: type(v).__name__)
def test_round_trip_keeps_class_reason_code_and_data(
    exc: FencingError, code: grpc.StatusCode
) -> None:
    status = _status.to_status(exc)
    assert status.code == code.value[0]
    back = _status.from_status(status)
    assert type(back) is type(exc)
    assert back.metadata() == exc.metadata()
    assert str(back) == str(exc)


def test_design_table_reasons_and_codes() -> None:
    table = {reason: code for reason, (_, code) in _status.REGISTRY.items()}
    assert table["STALE_TOKEN"] == grpc.StatusCode.FAILED_PRECONDITION
    assert table["LEASE_HELD"] == grpc.StatusCode.ABORTED
    assert table["LEASE_LOST"] == grpc.StatusCode.FAILED_PRECONDITION
    assert table["INVALID_ARGUMENT"] == grpc.StatusCode.INVALID_ARGUMENT
    assert table["BACKEND_UNAVAILABLE"] == grpc.StatusCode.UNAVAILABLE


def test_acquire_timeout_travels_as_lease_held() -> None:
    status = _status.to_status(AcquireTimeoutError(resource="r", holder="h", remaining_ms=1))
    back = _status.from_status(status)
    assert type(back) is LeaseHeldError
    assert status.code == grpc.StatusCode.ABORTED.value[0]


def test_foreign_statuses_are_not_ours() -> None:
    from google.rpc import status_pb2

    assert _status.from_status(status_pb2.Status(code=2, message="boom")) is None
