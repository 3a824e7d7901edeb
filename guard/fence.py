"""The fence rule: one pure function, applied inside each store's own transaction.

A store reads the resource's fence (highest token applied or promised), asks
:func:`admit` whether a write with ``token`` may proceed and what the fence becomes,
and writes the data and the new fence in the same transaction (G3). It never reads
in one call and writes in another.

A write with an idempotency key is judged by :func:`judge`, in this order (G6):

1. the token against the fence: below it, ``StaleTokenError`` whether or not the key
   is known (the error says whether the key was applied, and by which token);
2. in ``strict`` mode, the token against the live lease or job claim: not live,
   ``LeaseLost``;
3. only then the key: a recorded key is a replay, answered with the token that
   applied it, and nothing is applied again;
4. otherwise the write is applied and the fence becomes ``max(token, fence)``.

So a replay is only ever told to a token that may write now, and a paused former
holder re-sending a key a newer holder used is refused, never told "success" for
someone else's write. The SQL (``serving/migrations``) and Lua (``guard/lua``)
stores implement the same order; the contract suites hold every store to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from fencing.errors import LeaseLost, StaleTokenError


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


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a store remembers of an applied write's idempotency key: the fence that
    write left, and the token that applied it."""

    fence: int
    token: int


@dataclass(frozen=True, slots=True)
class Judgement:
    """An admitted write's outcome: the fence after it, and for a replay (a recorded
    key: nothing is applied) the token that applied the key (``replayed_by_token``,
    0 when the write is applied now)."""

    fence: int
    replayed_by_token: int = 0

    @property
    def replayed(self) -> bool:
        return self.replayed_by_token != 0


def not_live(
    resource: str, token: int, key_applied: bool | None = None, applied_by_token: int = 0
) -> LeaseLost:
    """The strict refusal of a token that is not below the fence but is not the live
    lease or job claim (expired, released, taken over, or never granted)."""
    return LeaseLost(
        f"token {token} is not the live lease or job claim of {resource!r} (strict mode)",
        resource=resource,
        token=token,
        key_applied=key_applied,
        applied_by_token=applied_by_token,
    )


def judge(
    resource: str,
    token: int,
    fence: int,
    mode: FenceMode = FenceMode.MONOTONIC,
    *,
    has_key: bool = False,
    recorded: Recorded | None = None,
    live: bool = True,
) -> Judgement:
    """Judge one write: the token first, then its idempotency key (see the module doc).

    ``has_key``: the write carries an idempotency key; ``recorded``: what the store
    remembers of that key for this resource (None: never applied, or pruned);
    ``live``: strict mode only, whether ``token`` is the live lease or job claim.
    Raises ``StaleTokenError`` (below the fence) or ``LeaseLost`` (strict, not live),
    both saying whether the key was applied and by which token.
    """
    key_applied = (recorded is not None) if has_key else None
    applied_by = recorded.token if recorded is not None else 0
    if mode is not FenceMode.OFF and token < fence:
        raise StaleTokenError(
            resource=resource,
            token=token,
            current_token=fence,
            key_applied=key_applied,
            applied_by_token=applied_by,
        )
    if mode is FenceMode.STRICT and not live:
        raise not_live(resource, token, key_applied, applied_by)
    if recorded is not None:
        return Judgement(recorded.fence, replayed_by_token=recorded.token)
    return Judgement(max(token, fence))


def judge_all(
    claims: Sequence[tuple[str, int, int]],
    mode: FenceMode = FenceMode.MONOTONIC,
    *,
    has_key: bool = False,
    recorded: Sequence[Recorded | None] = (),
    live: Sequence[bool] = (),
) -> tuple[list[int], list[int]] | None:
    """Judge a multi-resource write: every token first, then its idempotency key.

    ``claims`` as for :func:`admit_all`; ``recorded`` and ``live`` per claim, in the
    same order (empty: none recorded, all live). One stale token raises
    ``StaleTokenError`` for the first stale resource in sorted order, then (strict) one
    token that is not live raises ``LeaseLost`` for the first such resource in sorted
    order, each with what is recorded of the key under that resource. Returns None
    when the write is to be applied (the fences are :func:`admit_all`'s), or, for a
    replay (the key recorded under the write's first resource), ``(fences, tokens)``:
    per claim the recorded fence and the token that applied it (the current fence and
    0 where the key was pruned).
    """
    rec = list(recorded) or [None] * len(claims)
    lives = list(live) or [True] * len(claims)
    order = sorted(range(len(claims)), key=lambda i: claims[i])

    def key_info(i: int) -> tuple[bool | None, int]:
        r = rec[i]
        return ((r is not None) if has_key else None), (r.token if r is not None else 0)

    if mode is not FenceMode.OFF:
        for i in order:
            resource, token, fence = claims[i]
            if token < fence:
                applied, by = key_info(i)
                raise StaleTokenError(
                    resource=resource,
                    token=token,
                    current_token=fence,
                    key_applied=applied,
                    applied_by_token=by,
                )
    if mode is FenceMode.STRICT:
        for i in order:
            if not lives[i]:
                applied, by = key_info(i)
                raise not_live(claims[i][0], claims[i][1], applied, by)
    if has_key and claims and rec[0] is not None:
        return (
            [r.fence if r is not None else c[2] for c, r in zip(claims, rec, strict=True)],
            [r.token if r is not None else 0 for r in rec],
        )
    return None


def may_fence(resource: str, token: int, mode: FenceMode, *, live: bool = True) -> None:
    """In strict mode a promise (``Fence``) must come from the live lease or job claim:
    a token nobody holds (expired, released, never granted) must not raise the fence,
    or it could wedge the resource for every real holder. ``LeaseLost`` otherwise."""
    if mode is FenceMode.STRICT and not live:
        raise not_live(resource, token)


def reset_to(resource: str, to_token: int, fence: int) -> int:
    """The fence after an operator's reset (``ResetFence``): exactly ``to_token``.

    ``to_token`` is the lease server's counter for the resource (its ``last_token``:
    the highest token it ever granted), so a reset never goes below a granted token
    and every former holder stays fenced; it may lower a fence a token nobody was
    granted wedged. The guard cannot check the counter itself in monotonic mode: the
    operation is authorised separately and audited for that reason.
    """
    if to_token < 0:
        raise ValueError("to_token must not be negative")
    return to_token
