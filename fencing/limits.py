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
ops                1 .. 1,000 per write (0 .. 1,000 per resource of a WriteMany,
                   1,000 in all)
writes             1 .. 100 resources per WriteMany, each named once;
                   0 .. 1,000 writes per WriteStream message
resources          1 .. 1,000 distinct resources per AcquireMany
renewals           1 .. 10,000 per RenewMany (and releases per ReleaseMany),
                   each resource named once
calls              0 .. 1,000 calls per Session message
deadline_ms        0 (none) .. 3,600,000 per Session call (1 h)
idempotency_key    0-256 bytes of UTF-8, no control characters
prefix             0-256 bytes of UTF-8, no control characters
page_size          0 (default 100) or 1 .. 1,000 leases per List page, jobs per
                   ListJobs page
page_token         0-256 bytes (a previous List page's next_page_token); of ListJobs,
                   the one its previous page returned; of ListRecords, 0-1024 bytes
                   (a key)
records page       0 (default 100) or 1 .. 1,000 records per ListRecords page, and
                   at most 3 MiB of values (at least one record)
job id             1 .. 2**63 - 1
requeue limit      0 (default 1,000) or 1 .. 1,000 dead jobs per RequeueDead
queue              1-128 bytes of UTF-8, no control characters
worker             1-128 bytes of UTF-8, no control characters (like holder)
payload            at most 1 MiB (1,048,576 bytes) per job
ordering_key       0-256 bytes of UTF-8, no control characters
job resource       0-256 bytes like resource (empty: ``job/<queue>/<id>``)
priority           -1,000 .. 1,000 (higher runs first)
max_attempts       1 .. 1,000 (0 on the wire: the server's default, 5)
delay_ms           0 .. 31,536,000,000 (365 days); run_at_ms at most that far ahead
batch              1 .. 1,000 jobs per Enqueue, Claim, Heartbeat, Complete, Release
error              kept truncated to 4,096 bytes of UTF-8 (never rejected), the
                   job's last error and each attempt's alike ("..." marks a cut)
attempt history    the newest 20 attempts of each job (GetJob's history), kept
                   as long as the job; older ones are dropped
window_ms          0 (default 5 min) or 1,000 .. 604,800,000 (7 days)
schedule name      1-128 bytes of UTF-8, no control characters
cron               5 fields (minute hour day-of-month month day-of-week), at most
                   256 bytes; exactly one of cron and every_ms
every_ms           1,000 .. 31,536,000,000 (1 s to 365 days)
timezone           an IANA name (empty: UTC), at most 64 bytes
catch_up           0 (only the latest due period) .. 100 missed periods
schedules          at most 1,000 per queue backend (RESOURCE_EXHAUSTED past it)
=================  ==========================================================

A whole request is also bounded by the gRPC message limit (16 MiB), so a batch of
large payloads may hit that before the batch limit.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

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
MAX_WRITE_RESOURCES = 100
MAX_STREAM_WRITES = 1000
MAX_SESSION_CALLS = 1000
MAX_DEADLINE_MS = 3_600_000
MAX_ACQUIRE_MANY = 1000
MAX_RENEW_MANY = 10_000
MAX_PREFIX_BYTES = 256
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_QUEUE_BYTES = 128
MAX_WORKER_BYTES = 128
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_ORDERING_KEY_BYTES = 256
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
MAX_MAX_ATTEMPTS = 1000
DEFAULT_MAX_ATTEMPTS = 5
MAX_DELAY_MS = 365 * 24 * 3600 * 1000
MAX_BATCH = 1000
MAX_ERROR_BYTES = 4096
#: Attempts of one job kept in its history (the newest; GetJob's ``history``).
MAX_JOB_ATTEMPTS_KEPT = 20
MIN_WINDOW_MS = 1000
MAX_WINDOW_MS = 7 * 24 * 3600 * 1000
DEFAULT_WINDOW_MS = 5 * 60 * 1000
MAX_SCHEDULE_NAME_BYTES = 128
MAX_CRON_BYTES = 256
MIN_INTERVAL_MS = 1000
MAX_INTERVAL_MS = MAX_DELAY_MS
MAX_TIMEZONE_BYTES = 64
MAX_CATCH_UP = 100
MAX_SCHEDULES = 1000
#: Largest gRPC message the servers accept: one write of MAX_OPS values would not fit,
#: so the byte budget of a whole write is this, not MAX_OPS * MAX_VALUE_BYTES.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


#: Unicode category Cc is exactly these 65 code points; one regex scan beats a per-character
#: unicodedata lookup on the hot path (every key of every write).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def check_name(field: str, value: str, max_bytes: int, *, required: bool = True) -> str:
    """A name-like string: UTF-8 length in ``[1 or 0, max_bytes]``, no control characters."""
    # The common case in C: printable ASCII (for ASCII, "not printable" is exactly a
    # control character) is as many UTF-8 bytes as characters.
    fast = value.isascii() and value.isprintable() and (value or not required)
    if fast and len(value) <= max_bytes:
        return value
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


def check_page_size(value: int, field: str = "page_size") -> int:
    """A List page's size: 0 means :data:`DEFAULT_PAGE_SIZE`; at most :data:`MAX_PAGE_SIZE`."""
    if value == 0:
        return DEFAULT_PAGE_SIZE
    return check_range(field, value, 1, MAX_PAGE_SIZE)


def check_page_token(value: str, field: str = "page_token") -> str:
    """A List cursor: empty (the first page) or a token the server handed out."""
    return check_name(field, value, MAX_RESOURCE_BYTES, required=False)


#: About how many bytes of values one ListRecords page carries (at least one record), so
#: a page fits the 4 MiB a gRPC client accepts by default, even with 1 MiB values.
MAX_RECORDS_PAGE_BYTES = 3 * 1024 * 1024


def check_record_page_token(value: str, field: str = "page_token") -> str:
    """A ListRecords cursor: empty (the first page) or the last key of the page before."""
    return check_name(field, value, MAX_KEY_BYTES, required=False)


def check_job_page_token(value: str, field: str = "page_token") -> int:
    """A ListJobs cursor: empty (0: the first page) or the token its previous page
    returned (the id the next page starts after)."""
    if not value:
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise InvalidArgumentError(f"{field} must be a next_page_token of ListJobs", field=field)
    return check_range(field, int(value), 1, MAX_TOKEN)


def check_requeue_limit(value: int, field: str = "limit") -> int:
    """Dead jobs one RequeueDead moves: 0 means :data:`MAX_BATCH`; at most that."""
    if value == 0:
        return MAX_BATCH
    return check_range(field, value, 1, MAX_BATCH)


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


def check_renew_ttl_ms(value: int, field: str = "ttl_ms") -> int:
    """A renewal's ttl: 0 (none named: the lease's own ttl, as an etcd keep-alive keeps
    it), or a ttl as :func:`check_ttl_ms` takes."""
    return 0 if value == 0 else check_ttl_ms(value, field)


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


def check_write_resources(resources: list[str], field: str = "writes") -> list[str]:
    """The resources of one WriteMany: 1 .. MAX_WRITE_RESOURCES, each named once."""
    if not resources:
        raise InvalidArgumentError(f"{field} must name at least one resource", field=field)
    if len(resources) > MAX_WRITE_RESOURCES:
        raise InvalidArgumentError(
            f"{field} names {len(resources)} resources; the limit is {MAX_WRITE_RESOURCES}",
            field=field,
        )
    if len(set(resources)) != len(resources):
        raise InvalidArgumentError(f"{field} names a resource more than once", field=field)
    return resources


def check_stream_writes(count: int, field: str = "writes") -> int:
    if count > MAX_STREAM_WRITES:
        raise InvalidArgumentError(
            f"{field} holds {count} writes; the limit is {MAX_STREAM_WRITES} per message",
            field=field,
        )
    return count


def check_session_calls(count: int, field: str = "calls") -> int:
    if count > MAX_SESSION_CALLS:
        raise InvalidArgumentError(
            f"{field} holds {count} calls; the limit is {MAX_SESSION_CALLS} per message",
            field=field,
        )
    return count


def check_deadline_ms(value: int, field: str = "deadline_ms") -> int:
    return check_range(field, value, 0, MAX_DEADLINE_MS)


def check_many(names: list[str], field: str, limit: int) -> list[str]:
    """The resources of one batch call: 1 .. ``limit`` of them, each named once."""
    if not names:
        raise InvalidArgumentError(f"{field} must name at least one resource", field=field)
    if len(names) > limit:
        raise InvalidArgumentError(
            f"{field} holds {len(names)}; the limit is {limit} per call", field=field
        )
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{field} names a resource more than once", field=field)
    return names


# -- queues -----------------------------------------------------------------------------------


def check_queue(value: str, field: str = "queue") -> str:
    return check_name(field, value, MAX_QUEUE_BYTES)


def check_worker(value: str, field: str = "worker") -> str:
    return check_name(field, value, MAX_WORKER_BYTES)


def check_payload(value: bytes, field: str = "payload") -> bytes:
    if len(value) > MAX_PAYLOAD_BYTES:
        raise InvalidArgumentError(
            f"{field} is {len(value)} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes", field=field
        )
    return value


def check_ordering_key(value: str, field: str = "ordering_key") -> str:
    return check_name(field, value, MAX_ORDERING_KEY_BYTES, required=False)


def check_job_resource(value: str, field: str = "resource") -> str:
    return check_name(field, value, MAX_RESOURCE_BYTES, required=False)


def check_priority(value: int, field: str = "priority") -> int:
    return check_range(field, value, MIN_PRIORITY, MAX_PRIORITY)


def check_max_attempts(value: int, field: str = "max_attempts") -> int:
    """0 (the server's default) or 1 .. MAX_MAX_ATTEMPTS; returns the effective value."""
    if value == 0:
        return DEFAULT_MAX_ATTEMPTS
    return check_range(field, value, 1, MAX_MAX_ATTEMPTS)


def check_delay_ms(value: int, field: str = "delay_ms") -> int:
    return check_range(field, value, 0, MAX_DELAY_MS)


def check_batch(count: int, field: str = "batch_size") -> int:
    return check_range(field, count, 1, MAX_BATCH)


def check_window_ms(value: int, field: str = "window_ms") -> int:
    """0 (the default window) or MIN_WINDOW_MS .. MAX_WINDOW_MS; returns the effective value."""
    if value == 0:
        return DEFAULT_WINDOW_MS
    return check_range(field, value, MIN_WINDOW_MS, MAX_WINDOW_MS)


def check_schedule_name(value: str, field: str = "name") -> str:
    return check_name(field, value, MAX_SCHEDULE_NAME_BYTES)


def check_interval_ms(value: int, field: str = "every_ms") -> int:
    return check_range(field, value, MIN_INTERVAL_MS, MAX_INTERVAL_MS)


def check_catch_up(value: int, field: str = "catch_up") -> int:
    return check_range(field, value, 0, MAX_CATCH_UP)


def truncate_error(text: str, max_bytes: int = MAX_ERROR_BYTES) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 (on a character boundary), marked ``...``.

    Error text is kept, never rejected: a worker that fails must be able to say so.
    Control characters other than newline and tab become spaces.
    """
    cleaned = "".join(
        ch if ch in "\n\t" or unicodedata.category(ch) != "Cc" else " " for ch in text
    )
    data = cleaned.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    return data[: max_bytes - 3].decode("utf-8", errors="ignore") + "..."


#: Idempotency keys the periodic jobs' enqueues use (one per schedule and period).
PERIODIC_KEY_PREFIX = "periodic:"


def check_new_job(
    *,
    payload: bytes,
    idempotency_key: str,
    max_attempts: int,
    delay_ms: int,
    run_at_ms: int,
    ordering_key: str,
    priority: int,
    resource: str,
    field: str,
    now_ms: int,
) -> dict[str, Any]:
    """One job to enqueue, checked as the Enqueue RPC checks it (and ``fencing.pg.enqueue``
    before its SQL): the error names ``field`` and the member (``jobs[3].payload``).
    Returns the members, ``max_attempts`` 0 made the default."""
    if run_at_ms < 0 or run_at_ms > now_ms + MAX_DELAY_MS:
        raise InvalidArgumentError(
            f"{field}.run_at_ms must be a Unix time in ms at most 365 days ahead",
            field=f"{field}.run_at_ms",
        )
    key = check_idempotency_key(idempotency_key, f"{field}.idempotency_key")
    if key.startswith(PERIODIC_KEY_PREFIX):
        raise InvalidArgumentError(
            f"{field}.idempotency_key: keys starting with {PERIODIC_KEY_PREFIX!r} are the "
            "periodic jobs' (one per schedule and period)",
            field=f"{field}.idempotency_key",
        )
    return {
        "payload": check_payload(payload, f"{field}.payload"),
        "idempotency_key": key,
        "max_attempts": check_max_attempts(max_attempts, f"{field}.max_attempts"),
        "delay_ms": check_delay_ms(delay_ms, f"{field}.delay_ms"),
        "run_at_ms": run_at_ms,
        "ordering_key": check_ordering_key(ordering_key, f"{field}.ordering_key"),
        "priority": check_priority(priority, f"{field}.priority"),
        "resource": check_job_resource(resource, f"{field}.resource"),
    }
