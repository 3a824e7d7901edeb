"""The value types of the ``fencing`` flags: one duration parser, one integer range, for
every command.

A duration is a number with an optional unit: ``30`` (seconds), ``30s``, ``1500ms``,
``5m``, ``1h``, ``1d``; ``--ttl 30s``, ``--delay 30s`` and ``--every 30s`` read the same
way. Each flag's range is checked here, from :mod:`fencing.limits` (the bounds the
servers enforce), so a value a server would refuse is a usage error (exit 2) naming
the flag before anything is sent, not the server's message about a wire field.

A usage error found while a command runs (a missing token) is :class:`UsageError`: a
``ValueError``, so :func:`serving.exits.fail` reports it as ``USAGE`` (2).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from fencing import limits

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?|[-+]?\.\d+)\s*(ms|s|m|h|d)?\s*$")
_INTEGER = re.compile(r"^\s*[-+]?\d+\s*$")

#: Written as the README shows them: seconds, or a number with ms, s, m, h or d.
DURATION_FORMS = "90, 30s, 1500ms, 5m, 1h, 1d"


class UsageError(ValueError):
    """A bad command line found while the command runs (exit 2, ``USAGE``)."""


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``1500ms``, ``5m``, ``1h``, ``1d`` -> seconds (any sign)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with ms, s, m, h or d; default s)"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def show_seconds(seconds: float) -> str:
    """A duration as the parser reads it back: the largest whole unit."""
    for unit in ("d", "h", "m", "s"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds * 1000:g}ms"


def duration(
    low: float = 0.0,
    high: float | None = None,
    *,
    above: bool = False,
    why: str = "",
) -> Callable[[str], float]:
    """An argparse ``type``: a duration in seconds, at least ``low`` (more than it with
    ``above``), at most ``high``; ``why`` says whose bound it is (the server's limit)."""
    because = f" ({why})" if why else ""

    def convert(text: str) -> float:
        seconds = parse_duration(text)
        if above and seconds <= low:
            least = show_seconds(low) if low else "0"
            raise argparse.ArgumentTypeError(f"must be more than {least}, got {text!r}{because}")
        if seconds < low:
            least = "0 or more" if low == 0 else f"at least {show_seconds(low)}"
            raise argparse.ArgumentTypeError(f"must be {least}, got {text!r}{because}")
        if high is not None and seconds > high:
            raise argparse.ArgumentTypeError(
                f"must be at most {show_seconds(high)}, got {text!r}{because}"
            )
        return seconds

    convert.__name__ = "duration"
    return convert


def ms_range(low_ms: int, high_ms: int, field: str) -> Callable[[str], float]:
    """A duration within a server limit given in ms (``field`` names it)."""
    return duration(low_ms / 1000, high_ms / 1000, why=f"the server's {field} limit")


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high``."""

    def convert(text: str) -> int:
        if _INTEGER.match(text) is None:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
        value = int(text)
        if value < low or (high is not None and value > high):
            bounds = f"{low} or more" if high is None else f"{low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    convert.__name__ = "integer"
    return convert


#: A lease's ttl, within the servers' ttl_ms limit.
ttl = ms_range(limits.MIN_TTL_MS, limits.MAX_TTL_MS, "ttl_ms")
#: How long an acquire waits while the lease is held (the servers' wait_ms limit).
wait = ms_range(0, limits.MAX_WAIT_MS, "wait_ms")
#: A job's delay (the servers' delay_ms limit).
delay = ms_range(0, limits.MAX_DELAY_MS, "delay_ms")
#: A schedule's interval (the servers' every_ms limit).
every = ms_range(limits.MIN_INTERVAL_MS, limits.MAX_INTERVAL_MS, "every_ms")
#: A local wait or grace period: any duration of 0 or more.
seconds = duration()
#: A fencing token as the servers issue them.
token = integer(1, limits.MAX_TOKEN)
#: A job id.
job_id = integer(1, limits.MAX_TOKEN)
#: A count where 0 means "the default" or "no limit".
count = integer(0)
#: A page size (0: the server's default).
page_size = integer(0, limits.MAX_PAGE_SIZE)
#: A job's priority.
priority = integer(limits.MIN_PRIORITY, limits.MAX_PRIORITY)
#: A job's attempts (0: the server's default).
max_attempts = integer(0, limits.MAX_MAX_ATTEMPTS)
