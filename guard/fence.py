"""The fence rule: one pure function, applied inside each store's own transaction.

A store reads the resource's fence (highest token applied or promised), asks
:func:`admit` whether a write with ``token`` may proceed and what the fence becomes,
and writes the data and the new fence in the same transaction (G3). It never reads
in one call and writes in another.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from fencing.errors import StaleTokenError


class FenceMode(StrEnum):
    """How a guard judges a write's token.

    ``monotonic``: token >= fence (the default). ``watch``: the same rule for writes,
    and the guard also advances fences itself from the lease server's Watch stream
    (to t on ACQUIRED(t), past t on RELEASED(t) or EXPIRED(t); see
    :mod:`guard.follower`), so a former holder is fenced at takeover (G4).
    ``strict``: also the token must be the live, unexpired lease at commit time,
    checked by the store in the write's own transaction (needs the store and the
    lease backend in one PostgreSQL database or one Redis). ``off``: accept every
    token; exists only as the chaos harness's control, to show the violations
    fencing prevents. Never use it in production.
    """

    MONOTONIC = "monotonic"
    WATCH = "watch"
    STRICT = "strict"
    OFF = "off"


def admit(resource: str, token: int, fence: int, mode: FenceMode = FenceMode.MONOTONIC) -> int:
    """Return the fence after accepting a write with ``token``, or raise ``StaleTokenError``.

    Equal tokens are admitted, so one holder can write many times under one lease.
    Strict mode holds the token to this rule too (G3 holds in every mode but ``off``);
    the store adds the live-lease check in the same transaction.
    """
    if mode is not FenceMode.OFF and token < fence:
        raise StaleTokenError(resource=resource, token=token, current_token=fence)
    return max(token, fence)


def advance(resource: str, token: int, fence: int) -> int:
    """Return the fence after an explicit ``Fence(token)`` (a promise): never lowers it.

    A promise with a token older than the fence is refused with ``StaleTokenError``,
    because it tells the caller that a newer holder already fenced the resource.
    """
    if token < fence:
        raise StaleTokenError(resource=resource, token=token, current_token=fence)
    return token


def admit_all(
    claims: Sequence[tuple[str, int, int]], mode: FenceMode = FenceMode.MONOTONIC
) -> list[int]:
    """The fences after a multi-resource write, or ``StaleTokenError`` for the whole write.

    ``claims`` holds ``(resource, token, fence)`` per resource, each resource once. All
    are judged before anything is applied: one stale token refuses the whole write, and
    the error names the first stale resource in sorted order (code point order, which is
    byte order of the UTF-8 and PostgreSQL's ``COLLATE "C"``), so every store names the
    same one. Returns the new fences in the order of ``claims``.
    """
    for resource, token, fence in sorted(claims):
        admit(resource, token, fence, mode)
    return [admit(resource, token, fence, mode) for resource, token, fence in claims]
