"""The limits every request is held to at the edge, and their checks.

A server validates each request before it touches a backend, so a bad request
changes nothing; the violation is an :class:`~fencing.errors.InvalidArgumentError`
(gRPC ``INVALID_ARGUMENT``) whose ``field`` names the offending field.

=================  ==========================================================
field              limit
=================  ==========================================================
resource           1-256 bytes of UTF-8, no control characters
holder             1-128 bytes of UTF-8, no control characters
request_id         0-128 bytes of UTF-8, no control characters
ttl_ms             100 .. 3,600,000 (100 ms to 1 h)
wait_ms            0 .. 300,000 (5 min)
token              1 .. 2**63 - 1 (0 is never issued)
key                1-1024 bytes of UTF-8, no control characters
value              at most 1 MiB (1,048,576 bytes)
ops                1 .. 1,000 per write
idempotency_key    0-256 bytes of UTF-8, no control characters
prefix             0-256 bytes of UTF-8, no control characters
=================  ==========================================================
"""

from __future__ import annotations

import unicodedata

from fencing.errors import InvalidArgumentError

MAX_RESOURCE_BYTES = 256
MAX_HOLDER_BYTES = 128
MAX_REQUEST_ID_BYTES = 128
MIN_TTL_MS = 100
MAX_TTL_MS = 3_600_000
MAX_WAIT_MS = 300_000
MAX_TOKEN = 2**63 - 1
MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1024 * 1024
MAX_OPS = 1000
MAX_IDEMPOTENCY_KEY_BYTES = 256
MAX_PREFIX_BYTES = 256
#: Largest gRPC message the servers accept: one write of MAX_OPS values would not fit,
#: so the byte budget of a whole write is this, not MAX_OPS * MAX_VALUE_BYTES.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def check_name(field: str, value: str, max_bytes: int, *, required: bool = True) -> str:
    """A name-like string: UTF-8 length in ``[1 or 0, max_bytes]``, no control characters."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{field} is not valid UTF-8", field=field) from None
    if required and size == 0:
        raise InvalidArgumentError(f"{field} must not be empty", field=field)
    if size > max_bytes:
        raise InvalidArgumentError(
            f"{field} is {size} bytes; the limit is {max_bytes} bytes of UTF-8", field=field
        )
    if _has_control(value):
        raise InvalidArgumentError(f"{field} must not contain control characters", field=field)
    return value


def check_resource(value: str, field: str = "resource") -> str:
    return check_name(field, value, MAX_RESOURCE_BYTES)


def check_holder(value: str, field: str = "holder") -> str:
    return check_name(field, value, MAX_HOLDER_BYTES)


def check_optional_holder(value: str, field: str = "holder") -> str:
    return check_name(field, value, MAX_HOLDER_BYTES, required=False)


def check_request_id(value: str, field: str = "request_id") -> str:
    return check_name(field, value, MAX_REQUEST_ID_BYTES, required=False)


def check_idempotency_key(value: str, field: str = "idempotency_key") -> str:
    return check_name(field, value, MAX_IDEMPOTENCY_KEY_BYTES, required=False)


def check_prefix(value: str, field: str = "prefix") -> str:
    return check_name(field, value, MAX_PREFIX_BYTES, required=False)


def check_key(value: str, field: str = "key") -> str:
    return check_name(field, value, MAX_KEY_BYTES)


def check_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgumentError(
            f"{field} is {value}; it must be between {low} and {high}", field=field
        )
    return value


def check_ttl_ms(value: int, field: str = "ttl_ms") -> int:
    return check_range(field, value, MIN_TTL_MS, MAX_TTL_MS)


def check_wait_ms(value: int, field: str = "wait_ms") -> int:
    return check_range(field, value, 0, MAX_WAIT_MS)


def check_token(value: int, field: str = "token") -> int:
    return check_range(field, value, 1, MAX_TOKEN)


def check_value(value: bytes, field: str = "value") -> bytes:
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidArgumentError(
            f"{field} is {len(value)} bytes; the limit is {MAX_VALUE_BYTES} bytes", field=field
        )
    return value


def check_op_count(count: int, field: str = "ops") -> int:
    if count == 0:
        raise InvalidArgumentError(f"{field} must hold at least one op", field=field)
    if count > MAX_OPS:
        raise InvalidArgumentError(
            f"{field} holds {count} ops; the limit is {MAX_OPS} per write", field=field
        )
    return count
