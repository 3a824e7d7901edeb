"""Logging for the server processes: readable lines, or one JSON object per line.

Library code only logs; entry points call :func:`configure_logging` once. Services
pass what a line is about as ``extra=`` fields (``resource``, ``token``, ``holder``,
``queue``, ``job_id``, ``attempt``...), never inside the message text only, so that
under ``--log-format json`` they are keys a log pipeline can filter on. Timestamps
are RFC 3339 in UTC with milliseconds (``2026-12-01T14:09:36.591Z``) in both formats.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: LogRecord attributes that are not structured fields of ours.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
#: Extra fields never written, whoever passes them: payloads and secrets stay out of logs.
REDACTED_FIELDS = frozenset(
    {"value", "values", "ops", "payload", "authorization", "bearer", "password", "secret"}
)


def rfc3339(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The record's ``extra=`` fields (redacted ones dropped), as JSON-ready values."""
    return {
        key: value if isinstance(value, str | int | float | bool) or value is None else str(value)
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRS and key not in REDACTED_FIELDS and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the record's ``extra`` fields.

    Services log ``extra={"resource": ..., "token": ..., "holder": ...}``; values,
    payloads and credentials are never passed, and :data:`REDACTED_FIELDS` are
    dropped should they be.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


class ConsoleFormatter(logging.Formatter):
    """``TS LEVEL logger: message key=value ...``: the readable format, with the same
    timestamp and the same fields as the JSON one (a ``key=value`` the message already
    says, or a text value it names as a word, is not written twice; numbers always are,
    a number in a message may be another's)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        text = f"{rfc3339(record.created)} {record.levelname} {record.name}: {message}"
        said = set(message.split())
        # The message's words, punctuation trimmed: a text value among them is said.
        words = {word.strip(".,:;()[]'\"") for word in said}
        fields = [
            f"{key}={value}"
            for key, value in fields_of(record).items()
            if f"{key}={value}" not in said and not (isinstance(value, str) and value in words)
        ]
        if fields:
            text += " " + " ".join(fields)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


_format = "console"


def banner(message: str, **fields: Any) -> None:
    """Print a start or stop line on stdout: as is, or under ``--log-format json`` as
    one JSON object like a log record's (``msg`` plus ``fields`` as keys), so a log
    pipeline reading stdout sees only JSON."""
    if _format == "json":
        line = {"ts": rfc3339(time.time()), "level": "INFO", "logger": "banner", "msg": message}
        print(json.dumps({**line, **fields}), flush=True)
    else:
        print(message, flush=True)


def configure_logging(level: str = "INFO", fmt: str = "console") -> None:
    """Process-wide logging for server entry points (library code only logs)."""
    global _format
    _format = fmt
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # psycopg's pool warns at each failed connection attempt, many a second in an
    # outage; the health probe logs "backend down" / "backend back" instead.
    pool = logging.getLogger("psycopg.pool")
    pool.setLevel(logging.NOTSET if logging.root.level <= logging.DEBUG else logging.ERROR)


__all__ = [
    "REDACTED_FIELDS",
    "ConsoleFormatter",
    "JsonFormatter",
    "banner",
    "configure_logging",
    "fields_of",
    "rfc3339",
]
