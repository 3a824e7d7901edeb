"""The exit codes of every command (``fencing``, ``lease-server``, ``fencing-guard``): one table.

A script switches on the code; each error reason has its own, and the meanings of
0, 1 and 2 stay the conventional ones (success; a check said no; a usage or settings
error, as argparse exits). The table is printed in ``fencing --help`` and the README
(a test holds the README to it).

Runtime errors of the client commands map from the :class:`~fencing.errors.FencingError`
reason the server sent (:func:`code_for`); a server that cannot be reached at all is
``UNREACHABLE``, told apart from a server whose own backend is down
(``BACKEND_UNAVAILABLE``). Startup failures of the servers have codes of their own
(:class:`StartupError`).
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import grpc
from grpc_status import rpc_status

from fencing import _status
from fencing.errors import BackendUnavailableError, FencingError, InvalidArgumentError
from serving.extras import MissingExtraError


@dataclass(frozen=True)
class Exit:
    """One row: the code, the reason it stands for, and what it means to an operator."""

    code: int
    reason: str
    meaning: str


#: Every exit code, in order. The single source of truth.
TABLE: tuple[Exit, ...] = (
    Exit(0, "OK", "success"),
    Exit(
        1,
        "FAILURE",
        "a check said no (healthcheck NOT_SERVING, the demo's verdict, fencing leader: "
        "nobody leads, a closed stdout), or an error of no other row",
    ),
    Exit(
        2,
        "USAGE",
        "bad command line or settings (a flag, variable, TOML key, an "
        "unreadable TLS file), as argparse exits",
    ),
    Exit(3, "STALE_TOKEN", "the guard has seen a newer token: this writer is fenced"),
    Exit(4, "LEASE_HELD", "someone else holds the lease (also: acquire --wait ran out)"),
    Exit(5, "LEASE_LOST", "the lease or claim is no longer yours (expired, taken, released)"),
    Exit(6, "NOT_FOUND", "the server has no such method or object"),
    Exit(7, "INVALID_ARGUMENT", "the server refused a request field (named in the message)"),
    Exit(8, "PERMISSION_DENIED", "authenticated, but not allowed this action"),
    Exit(9, "UNAUTHENTICATED", "no or bad credentials (--auth-token, client certificate)"),
    Exit(10, "RESOURCE_EXHAUSTED", "a per-client cap was hit: back off and retry"),
    Exit(11, "BACKEND_UNAVAILABLE", "the server answered, but its backend or store is down"),
    Exit(12, "UNREACHABLE", "no server answered at the address (refused, no route, TLS)"),
    Exit(13, "DEADLINE_EXCEEDED", "the call's deadline passed: its effect is unknown"),
    Exit(20, "PORT_IN_USE", "startup: the listen address is taken or cannot be bound"),
    Exit(21, "BACKEND_UNREACHABLE", "startup: the backend or store could not be reached or opened"),
    Exit(22, "NOT_DURABLE", "startup: --require-durable refused a backend that may forget"),
    Exit(23, "MIGRATION_FAILED", "startup or fencing migrate: the schema migration failed"),
    # fencing lock/elect pass CMD's own status through, so their verdicts sit where a
    # command's rarely do (sysexits' EX_TEMPFAIL and the shell's "command not found").
    Exit(75, "NOT_ACQUIRED", "fencing lock/elect: the timeout ran out, the lease held by another"),
    Exit(76, "LOST_WHILE_RUNNING", "fencing lock/elect: the lease was lost while CMD ran"),
    Exit(127, "NO_COMMAND", "fencing lock/elect: CMD could not be started"),
    Exit(130, "INTERRUPTED", "fencing lock/elect: Ctrl-C while still waiting for the lease"),
)

CODES: Mapping[str, int] = {row.reason: row.code for row in TABLE}

OK = CODES["OK"]
FAILURE = CODES["FAILURE"]
USAGE = CODES["USAGE"]

_BY_GRPC_CODE = {
    grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
    grpc.StatusCode.UNIMPLEMENTED: "NOT_FOUND",
    grpc.StatusCode.UNAVAILABLE: "UNREACHABLE",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    grpc.StatusCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    grpc.StatusCode.PERMISSION_DENIED: "PERMISSION_DENIED",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
}


def _ours(err: grpc.RpcError) -> bool:
    """Whether a failed call carries our ErrorInfo (a server of ours decided it)."""
    call: Any = err
    if not hasattr(call, "trailing_metadata"):
        return False
    status = rpc_status.from_call(call)
    return status is not None and _status.from_status(status) is not None


def reason_of(exc: BaseException) -> str:
    """The table's reason for an exception a command caught."""
    if isinstance(exc, StartupError):
        return exc.reason
    if isinstance(exc, BackendUnavailableError):
        # The SDK turns a status without our ErrorInfo (nobody of ours answered) into
        # BackendUnavailableError too; its cause tells the two apart.
        cause = exc.__cause__
        if isinstance(cause, grpc.RpcError) and not _ours(cause):
            return "UNREACHABLE"
        return exc.reason
    if isinstance(exc, FencingError):
        return exc.reason if exc.reason in CODES else "FAILURE"
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        return _BY_GRPC_CODE.get(code, "FAILURE") if code is not None else "FAILURE"
    if isinstance(exc, ValueError):  # unreadable certificate files, bad local input
        return "USAGE"
    return "FAILURE"


def code_for(exc: BaseException) -> int:
    """The exit code for an exception a command caught."""
    return CODES[reason_of(exc)]


def message_of(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "details"):
        return str(exc.details())
    return str(getattr(exc, "message", "") or exc)


def fail(
    exc: BaseException,
    *,
    as_json: bool = False,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    hint: str = "",
) -> int:
    """Report ``exc`` and return its exit code.

    Always ``error: REASON: message`` on stderr (then ``hint: ...`` when the caller
    can tell the likely mistake); with ``as_json`` also one JSON object
    ``{reason, message, metadata, exit_code, hint}`` on stdout, for scripts.
    """
    reason = reason_of(exc)
    code = CODES[reason]
    message = message_of(exc)
    metadata = exc.metadata() if isinstance(exc, FencingError) else {}
    text = f"error: {reason}: {message}" + (f"\nhint: {hint}" if hint else "")
    print(text, file=stderr or sys.stderr, flush=True)
    if as_json:
        error = {
            "reason": reason,
            "message": message,
            "metadata": metadata,
            "exit_code": code,
            "hint": hint,
        }
        print(json.dumps(error), file=stdout or sys.stdout, flush=True)
    return code


class StartupError(Exception):
    """A server could not start: what failed, the setting that caused it, what to do.

    ``reason`` is a row of :data:`TABLE`; the server prints one line and exits with
    its code (a traceback only at ``--log-level debug``).
    """

    def __init__(self, reason: str, what: str, setting: str, hint: str) -> None:
        if reason not in CODES:
            raise ValueError(f"unknown exit reason {reason!r}")
        super().__init__(f"{what} ({setting}): {hint}")
        self.reason = reason
        self.what = what
        self.setting = setting
        self.hint = hint

    @property
    def code(self) -> int:
        return CODES[self.reason]


@dataclass(frozen=True)
class Setting:
    """A setting as an operator gives it, for a startup failure's line."""

    flag: str
    env: str
    value: str = ""

    def __str__(self) -> str:
        shown = f" = {_redact(self.value)}" if self.value else ""
        return f"{self.flag} / {self.env}{shown}"


def _redact(value: str) -> str:
    if "://" not in value:
        return value
    from serving.urls import redact

    return redact(value)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def startup_error(
    exc: BaseException, *, listen: Sequence[Setting], backend: Setting
) -> StartupError | None:
    """What a server's failed start means, or None for an unexpected failure (a bug).

    ``listen`` are the settings of the addresses it binds, ``backend`` that of its
    backend or store (or data directory).
    """
    text = _one_line(str(exc))
    if isinstance(exc, StartupError):
        if not exc.setting:
            return StartupError(exc.reason, exc.what, str(backend), exc.hint)
        return exc
    if isinstance(exc, RuntimeError | OSError) and re.search(
        r"(?i)failed to bind|cannot bind", text
    ):
        setting = next((s for s in listen if s.value and s.value in text), listen[0])
        return StartupError(
            "PORT_IN_USE",
            f"cannot bind {setting.value}",
            str(setting),
            "another process holds the address (or it is not an address of this host): "
            "stop that process or choose another port",
        )
    if isinstance(exc, MissingExtraError):
        return StartupError("USAGE", str(exc).rsplit(": ", 1)[0], str(backend), exc.hint)
    if isinstance(exc, InvalidArgumentError) and exc.field == "require_durable":
        return StartupError(
            "NOT_DURABLE",
            exc.message.removeprefix("--require-durable: "),
            "--require-durable / FENCING_REQUIRE_DURABLE",
            "use a backend that keeps what it acknowledged (sqlite:, postgresql://, Redis "
            "with appendonly and a noeviction policy), or drop --require-durable",
        )
    if isinstance(exc, InvalidArgumentError):  # a setting the server refused (a URL's)
        return StartupError("USAGE", exc.message, str(backend), "correct the setting")
    if isinstance(exc, BackendUnavailableError | OSError) or type(exc).__module__.startswith(
        ("sqlite3", "psycopg", "redis")
    ):
        return StartupError(
            "BACKEND_UNREACHABLE",
            text,
            str(backend),
            "check the URL or path, and that the database is up, reachable and writable from here",
        )
    return None


def startup_exit(command: str, exc: BaseException, *, debug: bool, **where: Any) -> int:
    """Report a server's failed start as one line on stderr and return its exit code.

    ``where``: :func:`startup_error`'s ``listen`` and ``backend``. An unexpected
    failure is re-raised (its traceback is the report); at ``--log-level debug`` the
    traceback is printed before the line in every case.
    """
    error = startup_error(exc, **where)
    if error is None:
        raise exc
    if debug:
        traceback.print_exception(exc)
    print(
        f"{command}: cannot start: {error.reason}: {error.what} [{error.setting}]: {error.hint}",
        file=sys.stderr,
        flush=True,
    )
    return error.code


def table_text() -> str:
    """The table as plain text (``fencing --help``'s epilog)."""
    width = max(len(row.reason) for row in TABLE)
    lines = ["exit codes:"]
    lines += [f"  {row.code:>2}  {row.reason:<{width}}  {row.meaning}" for row in TABLE]
    return "\n".join(lines)


def table_markdown() -> str:
    """The table as Markdown (the README's copy)."""
    lines = ["| code | reason | meaning |", "| --- | --- | --- |"]
    lines += [f"| {row.code} | `{row.reason}` | {row.meaning} |" for row in TABLE]
    return "\n".join(lines)


__all__ = [
    "CODES",
    "FAILURE",
    "OK",
    "TABLE",
    "USAGE",
    "Exit",
    "Setting",
    "StartupError",
    "code_for",
    "fail",
    "reason_of",
    "startup_error",
    "startup_exit",
    "table_markdown",
    "table_text",
]
