"""The lease exchanges as steps, run without a network: each twin only runs these, so
what is called, with which deadline, and what each outcome does is checked here once.

A scripted runner stands in for the twins' (:mod:`fencing.client._calls`): it records
every step and answers each call from a script (a reply, or an exception to throw in).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from fencing._renewal import RenewalPolicy
from fencing.client import _core
from fencing.errors import BackendUnavailableError, InvalidArgumentError, LeaseHeldError, LeaseLost
from fencing.limits import MAX_WAIT_MS
from fencing.v1 import lease_pb2

Lease = _core.LeaseBase[threading.Event]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stub(SimpleNamespace):
    """Methods that are only named in steps: each is a distinct marker."""

    def __init__(self) -> None:
        names = ("Acquire", "AcquireMany", "Renew", "RenewMany", "Release", "ReleaseMany")
        super().__init__(**{name: name for name in names})


class Client:
    def __init__(self, clock: FakeClock) -> None:
        self.target = "fake"
        self.rpc_timeout = 5.0
        self.release_timeout = 2.0
        self._clock: _core.Clock = clock
        self._stub = Stub()


def run(
    steps: _core.Steps[Any],
    script: list[object],
    clock: FakeClock,
    seen: list[str] | None = None,
) -> tuple[Any, list[str]]:
    """Run ``steps``, answering calls from ``script``; return the result and the log of
    steps (also kept in ``seen``)."""
    seen = [] if seen is None else seen
    reply: object = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value, seen
        reply, error = None, None
        if isinstance(step, _core.Sleep):
            seen.append(f"sleep {step.seconds}")
            clock.now += step.seconds
            continue
        seen.append(f"{step.method} timeout={step.timeout}")
        answer = script.pop(0)
        if callable(answer):  # an answer that takes its time
            answer = answer()
        if isinstance(answer, BaseException):
            error = answer
        else:
            reply = answer


def grant(resource: str = "r", token: int = 7, ttl_ms: int = 9_000) -> lease_pb2.Lease:
    return lease_pb2.Lease(resource=resource, holder="me", token=token, ttl_ms=ttl_ms)


def steps_for(clock: FakeClock) -> _core.LeaseSteps[Lease]:
    def new_lease(msg: lease_pb2.Lease, sent_at: float, received_at: float, ttl_ms: int) -> Lease:
        return _core.LeaseBase(
            msg,
            sent_at,
            RenewalPolicy(),
            clock,
            threading.Event(),
            threading.Lock(),
            received_at=received_at,
            ttl_ms=ttl_ms,
        )

    return _core.LeaseSteps(Client(clock), new_lease)


def held(clock: FakeClock, count: int) -> list[Lease]:
    steps = steps_for(clock)
    plan = _core.AcquirePlan("r0", "me", 9.0, None, clock)
    reply = lease_pb2.AcquireManyResponse(leases=[grant(f"r{i}", i + 1) for i in range(count)])
    leases, _ = run(steps.acquire(plan, [f"r{i}" for i in range(count)]), [reply], clock)
    return list(leases)


def test_acquire_retries_a_held_lease_at_once_and_a_transient_failure_after_a_pause() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 9.0, None, clock)
    script: list[object] = [
        LeaseHeldError(resource="r", holder="other", remaining_ms=5),
        BackendUnavailableError("down"),
        grant(),
    ]
    leases, seen = run(steps_for(clock).acquire(plan), script, clock)
    wait = MAX_WAIT_MS / 1000 + 5.0
    assert seen == [
        f"Acquire timeout={wait}",
        "sleep 0.0",
        f"Acquire timeout={wait}",
        "sleep 0.05",
        f"Acquire timeout={wait}",
    ]
    assert [(lease.resource, lease.token, lease.renew_ttl_ms) for lease in leases] == [
        ("r", 7, 9_000)
    ]


def test_acquire_raises_what_it_cannot_retry() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 9.0, None, clock)
    with pytest.raises(InvalidArgumentError):
        run(steps_for(clock).acquire(plan), [InvalidArgumentError("bad", field="ttl")], clock)


def test_exit_release_sends_one_release_for_one_lease_and_a_refusal_marks_it_lost() -> None:
    clock = FakeClock()
    [lease] = held(clock, 1)
    _, seen = run(steps_for(clock).release_on_exit([lease]), [LeaseLost("gone")], clock)
    assert seen == ["Release timeout=2.0"]
    assert lease.released and lease.lost.is_set()
    # Leaving again sends nothing: it was released.
    assert run(steps_for(clock).release_on_exit([lease]), [], clock)[1] == []


def test_exit_release_retries_transient_failures_within_its_bound_then_gives_up() -> None:
    clock = FakeClock()
    leases = held(clock, 2)
    down = BackendUnavailableError("down")
    _, seen = run(steps_for(clock).release_on_exit(leases), [down] * 10, clock)
    # Five retries 50 ms doubling (1.55 s in all, within the 2 s bound), then it gives up,
    # each call's deadline what is left of the bound.
    assert [s for s in seen if s.startswith("sleep")] == [
        "sleep 0.05",
        "sleep 0.1",
        "sleep 0.2",
        "sleep 0.4",
        "sleep 0.8",
    ]
    assert seen[0] == "ReleaseMany timeout=2.0"
    assert seen[-1].startswith("ReleaseMany timeout=0.45")
    assert all(lease.released and not lease.lost.is_set() for lease in leases)


def test_exit_release_marks_only_the_refused_leases_lost() -> None:
    clock = FakeClock()
    leases = held(clock, 3)
    reply = lease_pb2.ReleaseManyResponse(released=[True, False, True])
    run(steps_for(clock).release_on_exit(leases), [reply], clock)
    assert [lease.lost.is_set() for lease in leases] == [False, True, False]


def test_a_late_grant_is_renewed_before_it_is_handed_out_and_a_loss_releases_the_rest() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("a", "me", 0.3, None, clock)

    def late() -> lease_pb2.AcquireManyResponse:
        clock.now += 1.0  # the reply arrives after the whole ttl
        return lease_pb2.AcquireManyResponse(
            leases=[grant("a", 1, ttl_ms=300), grant("b", 2, ttl_ms=300)]
        )

    renewed = lease_pb2.RenewManyResponse(
        results=[lease_pb2.RenewResult(lost=True), lease_pb2.RenewResult(lost=False)]
    )
    released = lease_pb2.ReleaseResponse()
    timely = lease_pb2.AcquireManyResponse(
        leases=[grant("a", 3, ttl_ms=300), grant("b", 4, ttl_ms=300)]
    )
    script: list[object] = [late, renewed, released, timely]
    leases, seen = run(steps_for(clock).acquire(plan, ["a", "b"]), script, clock)
    # "a" expired in transit: renewed with a whole call's time (its own deadline had
    # passed), found lost, so "b" is released alone (all or nothing) and the set asked
    # for again at once, with the same request id.
    assert [step.split()[0] for step in seen] == [
        "AcquireMany",
        "RenewMany",
        "Release",
        "sleep",
        "AcquireMany",
    ]
    assert seen[1] == "RenewMany timeout=5.0"
    assert [lease.token for lease in leases] == [3, 4]


@pytest.mark.parametrize(
    ("lost", "body_raised", "cancelled", "raises"),
    [
        (False, False, False, False),
        (True, False, False, True),  # lost while the body ran quietly: LeaseLost at exit
        (True, True, False, False),  # the body's own error wins
        (True, True, True, True),  # the body was cancelled by the loss: LeaseLost
        (False, True, False, False),
    ],
)
def test_the_hold_exit_rule(lost: bool, body_raised: bool, cancelled: bool, raises: bool) -> None:
    clock = FakeClock()
    [lease] = held(clock, 1)
    if lost:
        lease._mark_lost("test")
    error = _core.hold_exit_error([lease], body_raised=body_raised, cancelled_by_loss=cancelled)
    assert (error is not None) == raises
    if error is not None:
        assert (error.resource, error.token) == ("r0", 1)
