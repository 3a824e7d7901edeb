"""The chaos checker and history recording: generated valid histories pass, mutated ones fail.

Valid histories come from a small model of the system: a lease server per resource
(counter, holder, expiry at any moment), a fenced register per resource (the guard:
fence, store, applied idempotency keys) and clients that invoke one operation at a
time. Every operation takes effect atomically at a point between its invocation and
its completion, replies may be lost (``info``), requests may be dropped (``info``,
no effect) and clients may be killed (pending forever), so the model's histories
satisfy every rule by construction. Each mutation injects exactly one kind of
violation; the checker must report exactly that kind.
"""

from __future__ import annotations

import itertools
import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.checker import GRANT_FENCED_MODES, CheckResult, ViolationKind, check, merge
from chaos.history import (
    Event,
    ExtraValue,
    HistoryError,
    HistoryWriter,
    Operation,
    Recorder,
    pair_operations,
    read_history,
    split_history,
)
from tests.thorough import examples

MS = 1_000_000
STEP_NS = 1_000  # model steps are 1 µs apart, so mutations can slot events in between
TOKEN_STEP = 10  # tokens grow by 10, so a mutation can invent an unused lower token
KEYS = ("k0", "k1")
EFFECT_KEY = "effect/e"
ALL_MODES = ("monotonic", "promise", "watch", "strict")

GEN = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
MUT = settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- building histories by hand ----------------------------------------------


class History:
    """Hand-written histories: one call per operation, times in milliseconds."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._ids = itertools.count(1)

    def op(
        self,
        process: str,
        op: str,
        resource: str,
        start_ms: float,
        end_ms: float | None,
        type: str = "ok",
        *,
        token: int | None = None,
        key: str | None = None,
        value: str | None = None,
        idempotency_key: str | None = None,
        error: str | None = None,
        **extra: ExtraValue,
    ) -> str:
        """Add an operation; ``end_ms=None`` leaves it pending. Returns its op_id."""
        op_id = f"{process}:{next(self._ids)}"
        self.events += make_op(
            process,
            op_id,
            op,
            resource,
            round(start_ms * MS),
            None if end_ms is None else round(end_ms * MS),
            type,
            token=token,
            key=key,
            value=value,
            idempotency_key=idempotency_key,
            error=error,
            extra=extra,
        )
        return op_id

    def check(self, mode: str = "monotonic") -> CheckResult:
        return check(self.events, mode=mode)


def make_op(
    process: str,
    op_id: str,
    op: str,
    resource: str,
    start_ns: int,
    end_ns: int | None,
    type: str,
    *,
    token: int | None = None,
    key: str | None = None,
    value: str | None = None,
    idempotency_key: str | None = None,
    error: str | None = None,
    extra: dict[str, ExtraValue] | None = None,
) -> list[Event]:
    """The invoke (and completion unless ``end_ns`` is None) events of one operation.

    As a client records them: an acquire learns its token and a read its value only
    at completion.
    """
    base = Event(
        process=process,
        op_id=op_id,
        op=op,
        type="invoke",
        resource=resource,
        token=None if op == "acquire" else token,
        key=key,
        value=None if op == "read" else value,
        idempotency_key=idempotency_key,
        t_mono_ns=start_ns,
        extra=extra or {},
    )
    if end_ns is None:
        return [base]
    done = replace(base, type=type, token=token, value=value, error=error, t_mono_ns=end_ns)
    return [base, done]


# -- the model ------------------------------------------------------------------


@dataclass
class InFlight:
    op_id: str
    op: str
    resource: str
    token: int | None
    key: str | None = None
    value: str | None = None
    idem: str | None = None
    applied: bool = False
    result: str = "info"
    error: str | None = None
    granted: int | None = None


@dataclass
class Guard:
    fence: int = 0
    store: dict[str, str] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)


@dataclass
class Client:
    name: str
    rec: Recorder
    alive: bool = True
    inflight: InFlight | None = None
    holds: dict[str, int] = field(default_factory=dict)
    unsure_effect: str | None = None  # idempotency key of an effect with unknown outcome
    n: int = 0


@dataclass
class Sim:
    events: list[Event]
    fence_on_acquire: bool
    end_ns: int


@st.composite
def simulations(draw: st.DrawFn) -> Sim:
    """A valid history of the fenced-register model.

    ``fence_on_acquire`` models the promise/watch/strict guards: a grant fences older
    tokens at once. Without it the guard is monotonic (fenced by writes and promises).
    """
    fence_on_acquire = draw(st.booleans())
    resources = ["r0", "r1"][: draw(st.integers(1, 2))]
    now = [0]

    def clock() -> int:
        return now[0]

    events: list[Event] = []
    clients = [
        Client(f"c{i}", Recorder(events.append, f"c{i}", clock=clock))
        for i in range(draw(st.integers(2, 4)))
    ]
    leases: dict[str, tuple[str, int] | None] = {r: None for r in resources}
    counters = dict.fromkeys(resources, 0)
    guards = {r: Guard() for r in resources}

    def chance(one_in: int) -> bool:
        return draw(st.integers(0, one_in - 1)) == 0

    def invoke(c: Client) -> None:
        options: list[tuple[str, str]] = [("acquire", r) for r in resources if r not in c.holds]
        for r in c.holds:
            options += [("renew", r), ("release", r), ("fence", r), ("effect", r)]
            options += [("write", r)] * 3
        op, r = draw(st.sampled_from(options))
        c.n += 1
        token = c.holds.get(r)
        if op == "acquire":
            f = InFlight(c.rec.invoke("acquire", r, ttl_ms=100), op, r, None)
        elif op in ("renew", "release", "fence"):
            if op == "release":
                del c.holds[r]  # belief ends when the client decides to release
            f = InFlight(c.rec.invoke(op, r, token=token), op, r, token)
        elif op == "write":
            key, value = draw(st.sampled_from(KEYS)), f"{c.name}-{c.n}"
            f = InFlight(c.rec.invoke(op, r, token=token, key=key, value=value), op, r, token)
            f.key, f.value = key, value
        else:
            # Read-modify-write of the effect list; retrying an effect of unknown outcome
            # re-reads and re-appends the same idempotency key, which the guard must drop.
            idem = c.unsure_effect if c.unsure_effect and chance(2) else f"{c.name}-e{c.n}"
            cur = guards[r].store.get(EFFECT_KEY)
            value = f"{cur},{idem}" if cur else idem
            op_id = c.rec.invoke(
                "write", r, token=token, key=EFFECT_KEY, value=value, idempotency_key=idem
            )
            f = InFlight(op_id, "write", r, token, EFFECT_KEY, value, idem)
        c.inflight = f

    def apply(c: Client, f: InFlight) -> None:
        f.applied = True
        if chance(10):
            return  # the request never arrived: no effect, the client will see info
        g, r = guards[f.resource], f.resource
        f.result = "ok"
        if f.op == "acquire":
            if leases[r] is None:
                counters[r] += 1
                f.granted = counters[r] * TOKEN_STEP
                leases[r] = (c.name, f.granted)
                if fence_on_acquire:
                    g.fence = max(g.fence, f.granted)
            else:
                f.result, f.error = "fail", "LEASE_HELD"
        elif f.op in ("renew", "release"):
            if leases[r] != (c.name, f.token):
                f.result, f.error = "fail", "LEASE_LOST"
            elif f.op == "release":
                leases[r] = None
        else:
            assert f.token is not None
            if f.token < g.fence:
                f.result, f.error = "fail", "STALE_TOKEN"
                return
            g.fence = f.token
            if f.op == "write" and not (f.idem and f.idem in g.applied):
                assert f.key is not None
                assert f.value is not None
                g.store[f.key] = f.value
                if f.idem:
                    g.applied.add(f.idem)

    def complete(c: Client, f: InFlight) -> None:
        c.inflight = None
        kind = "info" if chance(10) else f.result
        c.rec.complete(
            f.op_id,
            kind,
            token=f.granted if f.op == "acquire" else f.token,
            error=f.error if kind == "fail" else ("DEADLINE_EXCEEDED" if kind == "info" else None),
        )
        if kind == "ok" and f.op == "acquire":
            assert f.granted is not None
            c.holds[f.resource] = f.granted
        if kind == "fail" and f.error in ("LEASE_LOST", "STALE_TOKEN"):
            c.holds.pop(f.resource, None)
        if f.idem is not None:
            c.unsure_effect = f.idem if kind == "info" else None

    for _ in range(draw(st.integers(10, 150))):
        now[0] += STEP_NS
        alive = [c for c in clients if c.alive]
        if not alive:
            break
        roll = draw(st.integers(0, 19))
        if roll < 2:
            leases[draw(st.sampled_from(resources))] = None  # the server expired the lease
        elif roll == 2 and len(alive) > 1:
            draw(st.sampled_from(alive)).alive = False  # SIGKILL: in-flight op stays pending
        else:
            c = draw(st.sampled_from(alive))
            if c.inflight is None:
                invoke(c)
            elif not c.inflight.applied:
                apply(c, c.inflight)
            else:
                complete(c, c.inflight)

    now[0] += 10 * STEP_NS
    end_ns = now[0]
    reader = Recorder(events.append, "final", clock=clock)
    for r in resources:
        for key in (*KEYS, EFFECT_KEY):
            op_id = reader.invoke("read", r, key=key, final=1)
            reader.complete(op_id, "ok", value=guards[r].store.get(key))
    return Sim(events, fence_on_acquire, end_ns)


def modes_for(sim: Sim) -> tuple[str, ...]:
    """The modes a simulated guard is valid in: every mode if grants fence, else monotonic."""
    return ALL_MODES if sim.fence_on_acquire else ("monotonic",)


def inject(
    sim: Sim,
    op: str,
    resource: str,
    start_ns: int,
    end_ns: int,
    *,
    token: int | None,
    key: str | None = None,
    value: str | None = None,
) -> list[Event]:
    """The simulation's events plus one ok operation by a fresh process."""
    extra_op = make_op(
        "intruder", "intruder:1", op, resource, start_ns, end_ns, "ok",
        token=token, key=key, value=value,
    )  # fmt: skip
    return [*sim.events, *extra_op]


# -- generated: valid histories pass, each mutation is caught --------------------


@GEN
@given(simulations())
def test_model_histories_are_valid(sim: Sim) -> None:
    for mode in modes_for(sim):
        result = check(sim.events, mode=mode)
        assert result.valid, result.summary()


@GEN
@given(simulations(), st.randoms(use_true_random=False))
def test_verdict_does_not_depend_on_event_order(sim: Sim, rnd: random.Random) -> None:
    shuffled = list(sim.events)
    rnd.shuffle(shuffled)
    for mode in ALL_MODES:
        assert check(shuffled, mode=mode).counts() == check(sim.events, mode=mode).counts()


def ok_ops(sim: Sim, *ops: str) -> list[Operation]:
    return [o for o in pair_operations(sim.events) if o.op in ops and o.ok]


@MUT
@given(simulations(), st.data())
def test_reused_token_is_flagged_as_duplicate_token(sim: Sim, data: st.DataObject) -> None:
    acquires = ok_ops(sim, "acquire")
    if not acquires:
        return
    a = data.draw(st.sampled_from(acquires))
    # Same interval as the original: concurrent with it, ordered like it against the rest.
    assert isinstance(a.end_ns, int)
    events = inject(sim, "acquire", a.resource, a.start_ns, a.end_ns, token=a.token)
    for mode in modes_for(sim):
        assert check(events, mode=mode).kinds() == {ViolationKind.DUPLICATE_TOKEN}


@MUT
@given(simulations(), st.data())
def test_lower_later_token_is_flagged_as_token_order(sim: Sim, data: st.DataObject) -> None:
    acquires = ok_ops(sim, "acquire")
    if not acquires:
        return
    a = data.draw(st.sampled_from(acquires))
    assert isinstance(a.end_ns, int)
    assert a.token is not None
    lower = a.token - TOKEN_STEP // 2  # unused by any grant
    events = inject(sim, "acquire", a.resource, a.end_ns + 1, a.end_ns + 2, token=lower)
    for mode in modes_for(sim):
        result = check(events, mode=mode)
        assert result.kinds() == {ViolationKind.TOKEN_ORDER}
        assert all("intruder:1" in v.op_ids for v in result.violations)


@MUT
@given(simulations(), st.data())
def test_accepted_stale_write_is_flagged(sim: Sim, data: st.DataObject) -> None:
    barriers = ok_ops(sim, "write", "fence")
    if not barriers:
        return
    b = data.draw(st.sampled_from(barriers))
    assert isinstance(b.end_ns, int)
    assert b.token is not None
    events = inject(
        sim, "write", b.resource, b.end_ns + 1, b.end_ns + 2,
        token=b.token - TOKEN_STEP // 2, key="stale/k", value="stale",
    )  # fmt: skip
    for mode in modes_for(sim):
        result = check(events, mode=mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}
        assert result.violations[0].op_ids[0] == "intruder:1"


@MUT
@given(simulations(), st.data())
def test_late_write_seen_by_a_read_is_flagged(sim: Sim, data: st.DataObject) -> None:
    barriers = [o for o in ok_ops(sim, "write") if o.key in KEYS]
    if not barriers:
        return
    b = data.draw(st.sampled_from(barriers))
    assert isinstance(b.end_ns, int)
    assert b.token is not None
    # A write of unknown outcome below b's token, and a read after b that shows it.
    events = [
        *sim.events,
        *make_op(
            "intruder", "intruder:1", "write", b.resource, 1, None, "info",
            token=b.token - TOKEN_STEP // 2, key=b.key, value="late",
        ),
        *make_op(
            "observer", "observer:1", "read", b.resource, b.end_ns + 1, b.end_ns + 2, "ok",
            key=b.key, value="late",
        ),
    ]  # fmt: skip
    for mode in modes_for(sim):
        result = check(events, mode=mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}
        assert result.violations[0].op_ids[:2] == ("intruder:1", "observer:1")


@MUT
@given(simulations(), st.data())
def test_a_lost_reply_never_makes_a_valid_history_invalid(sim: Sim, data: st.DataObject) -> None:
    # An unknown outcome never counts as finished: turning any acknowledged write
    # into one whose reply was lost (it did apply) must not create a violation.
    writes = ok_ops(sim, "write")
    if not writes:
        return
    lost = {o.op_id for o in data.draw(st.lists(st.sampled_from(writes), min_size=1))}
    events = [
        replace(e, type="info", error="DEADLINE_EXCEEDED")
        if e.op_id in lost and e.type == "ok"
        else e
        for e in sim.events
    ]
    for mode in modes_for(sim):
        result = check(events, mode=mode)
        assert result.valid, result.summary()


@MUT
@given(simulations(), st.data())
def test_a_write_below_an_unknown_write_a_read_showed_is_flagged(
    sim: Sim, data: st.DataObject
) -> None:
    ops = pair_operations(sim.events)
    # Every write that may have put a value there: a retried effect re-sends its value,
    # possibly under a newer lease, and the read does not say which attempt landed.
    writers: dict[tuple[str, str | None, str | None], list[Operation]] = {}
    for o in ops:
        if o.op == "write" and not o.fail:
            writers.setdefault((o.resource, o.key, o.value), []).append(o)
    shown = [
        (r, ws)
        for r in ops
        if r.op == "read" and r.ok
        for ws in [writers.get((r.resource, r.key, r.value), [])]
        if any(w.info for w in ws)
    ]
    if not shown:
        return
    r, ws = data.draw(st.sampled_from(shown))
    assert isinstance(r.end_ns, int)
    floor = min(w.token for w in ws if w.token is not None)
    # Without the read, an unknown write's timed-out completion would prove nothing
    # (the property above); the read proves one of its writers landed, so a token
    # below all of theirs after the read is stale.
    events = inject(
        sim, "write", r.resource, r.end_ns + 1, r.end_ns + 2,
        token=floor - TOKEN_STEP // 2, key="stale/k", value="stale",
    )  # fmt: skip
    for mode in modes_for(sim):
        result = check(events, mode=mode)
        assert ViolationKind.STALE_WRITE_ACCEPTED in result.kinds()
        assert any(v.op_ids[0] == "intruder:1" for v in result.violations)


def final_reads(events: list[Event]) -> list[Event]:
    """The completion events of the final reads (``final=1`` is on their invocations)."""
    final = {o.op_id for o in pair_operations(events) if o.extra.get("final") == 1}
    return [e for e in events if e.type == "ok" and e.op_id in final]


def acked_keys(sim: Sim) -> set[tuple[str, str | None]]:
    return {(o.resource, o.key) for o in ok_ops(sim, "write")}


@MUT
@given(simulations(), st.data())
def test_dropped_acknowledged_write_is_flagged_as_lost(sim: Sim, data: st.DataObject) -> None:
    acked = acked_keys(sim)
    reads = [e for e in final_reads(sim.events) if (e.resource, e.key) in acked]
    if not reads:
        return
    victim = data.draw(st.sampled_from(reads))
    events = [replace(e, value=None) if e is victim else e for e in sim.events]
    for mode in modes_for(sim):
        assert check(events, mode=mode).kinds() == {ViolationKind.LOST_WRITE}


@MUT
@given(simulations(), st.data())
def test_overwritten_value_read_back_is_flagged_as_lost(sim: Sim, data: st.DataObject) -> None:
    writes = [o for o in ok_ops(sim, "write") if o.key in KEYS]
    pairs = [
        (w1, w2)
        for w1 in writes
        for w2 in writes
        if (w1.resource, w1.key) == (w2.resource, w2.key) and w2.start_ns > w1.end_ns
    ]
    if not pairs:
        return
    old, _ = data.draw(st.sampled_from(pairs))
    events = [
        replace(e, value=old.value)
        if e.op == "read" and e.type == "ok" and (e.resource, e.key) == (old.resource, old.key)
        else e
        for e in sim.events
    ]
    for mode in modes_for(sim):
        assert check(events, mode=mode).kinds() == {ViolationKind.LOST_WRITE}


@MUT
@given(simulations(), st.data())
def test_effect_retried_into_the_list_twice_is_flagged(sim: Sim, data: st.DataObject) -> None:
    reads = [e for e in final_reads(sim.events) if e.key == EFFECT_KEY and e.value]
    if not reads:
        return
    read = data.draw(st.sampled_from(reads))
    assert read.value is not None
    again = data.draw(st.sampled_from(read.value.split(",")))
    doubled = f"{read.value},{again}"
    # A retry of unknown outcome that the guard applied although its key was used: the
    # only write that could explain the doubled list, so rule 4 stays satisfied.
    events = [
        *(replace(e, value=doubled) if e is read else e for e in sim.events),
        *make_op(
            "intruder", "intruder:1", "write", read.resource, sim.end_ns - 1, None, "info",
            token=10**9, key=EFFECT_KEY, value=doubled, idempotency_key=again,
        ),
    ]  # fmt: skip
    for mode in modes_for(sim):
        assert check(events, mode=mode).kinds() == {ViolationKind.DUPLICATE_EFFECT}


# -- rule 1: duplicate-token --------------------------------------------------------


def test_sequential_duplicate_token_is_reported_once_as_duplicate_token() -> None:
    h = History()
    a = h.op("a", "acquire", "r", 0, 1, token=7)
    b = h.op("b", "acquire", "r", 2, 3, token=7)
    result = h.check()
    assert [v.kind for v in result.violations] == [ViolationKind.DUPLICATE_TOKEN]
    assert result.violations[0].op_ids == (a, b)


def test_concurrent_duplicate_token_is_flagged() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 5, token=7)
    h.op("b", "acquire", "r", 1, 4, token=7)
    assert h.check().kinds() == {ViolationKind.DUPLICATE_TOKEN}


def test_idempotent_acquire_retry_returning_the_same_token_is_valid() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=7, request_id="req-1")
    h.op("a", "acquire", "r", 2, 3, token=7, request_id="req-1")
    assert h.check().valid


def test_same_token_on_different_resources_is_valid() -> None:
    h = History()
    h.op("a", "acquire", "r1", 0, 1, token=1)
    h.op("b", "acquire", "r2", 2, 3, token=1)
    assert h.check().valid


def test_failed_and_info_acquires_carry_no_token_claim() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=5)
    h.op("b", "acquire", "r", 2, 3, "info", token=5)
    h.op("c", "acquire", "r", 4, 5, "fail", token=1, error="LEASE_HELD")
    assert h.check().valid


# -- rule 2: token-order ------------------------------------------------------------


def test_later_acquire_with_lower_token_is_flagged() -> None:
    h = History()
    a = h.op("a", "acquire", "r", 0, 1, token=5)
    b = h.op("b", "acquire", "r", 2, 3, token=3)
    result = h.check()
    assert result.kinds() == {ViolationKind.TOKEN_ORDER}
    assert result.violations[0].op_ids == (b, a)


def test_concurrent_acquires_impose_no_order() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 3, token=5)
    h.op("b", "acquire", "r", 1, 2, token=3)
    assert h.check().valid


def test_acquire_invoked_exactly_at_a_completion_is_concurrent() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=5)
    h.op("b", "acquire", "r", 1, 2, token=3)
    assert h.check().valid


def test_token_order_compares_with_the_highest_earlier_token() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=9)
    h.op("b", "acquire", "r", 2, 3, token=2)
    h.op("c", "acquire", "r", 4, 5, token=4)  # above b but below a
    assert h.check().counts()[ViolationKind.TOKEN_ORDER] == 2


# -- rule 3: stale-write-accepted ---------------------------------------------------


def test_write_below_a_completed_newer_write_is_flagged_in_every_mode() -> None:
    h = History()
    newer = h.op("b", "write", "r", 0, 1, token=2, key="k", value="b")
    stale = h.op("a", "write", "r", 2, 3, token=1, key="k2", value="a")
    for mode in (*ALL_MODES, "off"):
        result = h.check(mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}, mode
        assert result.violations[0].op_ids == (stale, newer)


def test_write_below_a_completed_promise_is_flagged() -> None:
    h = History()
    h.op("b", "fence", "r", 0, 1, token=5)
    h.op("a", "write", "r", 2, 3, token=3, key="k", value="a")
    assert h.check("monotonic").kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_rejected_or_unknown_stale_writes_and_failed_promises_are_not_flagged() -> None:
    h = History()
    h.op("b", "write", "r", 0, 1, "info", token=9, key="k", value="b9")
    h.op("c", "fence", "r", 0, 1, "fail", token=8, error="STALE_TOKEN")
    h.op("b", "write", "r", 2, 3, token=5, key="k", value="b5")
    h.op("a", "write", "r", 4, 5, "fail", token=3, key="k", value="a", error="STALE_TOKEN")
    h.op("a", "write", "r", 6, 7, "info", token=3, key="k", value="a2")
    assert h.check().valid


def test_concurrent_writes_with_lower_token_are_not_flagged() -> None:
    h = History()
    h.op("b", "write", "r", 0, 3, token=2, key="k", value="b")
    h.op("a", "write", "r", 1, 4, token=1, key="k", value="a")
    assert h.check().valid


def test_old_holder_write_after_takeover_is_the_monotonic_window_but_flagged_with_promises() -> (
    None
):
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1)
    h.op("a", "write", "r", 2, 3, token=1, key="k", value="a1")
    grant = h.op("b", "acquire", "r", 4, 5, token=2)  # a's lease expired; a is paused
    stale = h.op("a", "write", "r", 6, 7, token=1, key="k", value="a2")  # a wakes up
    assert h.check("monotonic").valid
    assert h.check("off").valid  # off is judged like monotonic
    for mode in GRANT_FENCED_MODES:
        result = h.check(mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}, mode
        assert result.violations[0].op_ids == (stale, grant)
        assert "granted token" in result.violations[0].detail


def test_an_acquire_not_yet_seen_fenced_is_no_barrier() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1)
    h.op("b", "acquire", "r", 4, 5, token=2, fenced=0)  # the watch guard had not caught up
    h.op("a", "write", "r", 6, 7, token=1, key="k", value="a2")
    for mode in GRANT_FENCED_MODES:
        assert h.check(mode).valid, mode


def test_monotonic_window_closes_at_the_new_holders_first_write() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1)
    h.op("b", "acquire", "r", 4, 5, token=2)
    h.op("b", "write", "r", 6, 7, token=2, key="k", value="b")
    h.op("a", "write", "r", 8, 9, token=1, key="j", value="a")
    assert h.check("monotonic").kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_unfenced_control_run_is_flagged_when_checked_as_the_mode_under_test() -> None:
    # What the guard with fencing off lets through: a paused holder's write after the
    # new holder wrote. Its value is then the final one, which rule 4 accepts (the
    # stale write came later in real time): rule 3 is what catches it.
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1, fence_mode="off")
    h.op("b", "acquire", "r", 10, 11, token=2)
    h.op("b", "write", "r", 12, 13, token=2, key="k", value="b")
    h.op("a", "write", "r", 14, 15, token=1, key="k", value="a")
    h.op("z", "read", "r", 20, 21, key="k", value="a", final=1)
    result = h.check("monotonic")
    assert not result.valid
    assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}
    assert "INVALID" in result.summary()


def test_late_write_seen_by_a_read_after_a_newer_write_is_flagged_in_every_mode() -> None:
    # A write delayed in the network: its client timed out (info), a newer holder
    # wrote, then the old write landed; a later read shows it.
    h = History()
    late = h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="a")
    newer = h.op("b", "write", "r", 5, 6, token=2, key="k", value="b")
    read = h.op("o", "read", "r", 8, 9, key="k", value="a")
    for mode in (*ALL_MODES, "off"):
        result = h.check(mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}, mode
        assert result.violations[0].op_ids == (late, read, newer)
        assert "landed after" in result.violations[0].detail


def test_late_write_of_a_killed_client_seen_by_the_final_read_is_flagged() -> None:
    h = History()
    h.op("a", "write", "r", 0, None, "info", token=1, key="k", value="a")  # killed
    h.op("b", "write", "r", 5, 6, token=2, key="k", value="b")
    h.op("z", "read", "r", 20, 21, key="k", value="a", final=1)
    assert h.check().kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_read_may_see_a_lower_token_before_the_newer_write_completed() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="a")
    h.op("b", "write", "r", 5, 9, token=2, key="k", value="b")
    h.op("o", "read", "r", 6, 7, key="k", value="a")  # concurrent with b's write
    h.op("o", "read", "r", 10, 11, key="k", value="b")
    assert h.check().valid


def test_read_of_an_overwritten_ok_value_is_a_lost_write_not_a_late_one() -> None:
    # a's write completed before b's began: it cannot have landed after it. Seeing it
    # again means b's write was lost (rule 4 on final reads), not that a's was late.
    h = History()
    h.op("a", "write", "r", 0, 1, token=1, key="k", value="a")
    h.op("b", "write", "r", 5, 6, token=2, key="k", value="b")
    h.op("o", "read", "r", 8, 9, key="k", value="a")
    assert h.check().valid
    h.op("z", "read", "r", 20, 21, key="k", value="a", final=1)
    assert h.check().kinds() == {ViolationKind.LOST_WRITE}


def test_equal_tokens_and_other_keys_do_not_fence_a_read_value() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=2, key="k", value="a")
    h.op("b", "write", "r", 5, 6, token=2, key="k", value="b")
    h.op("b", "write", "r", 5, 6, token=3, key="j", value="c")
    h.op("o", "read", "r", 8, 9, key="k", value="a")
    assert h.check().valid


def test_a_possibly_deduplicated_write_does_not_fence_a_read_value() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="effect/e", value="x", idempotency_key="x")
    # A retry under a newer token, deduplicated by the guard: it applied nothing.
    h.op("a", "write", "r", 2, 3, token=2, key="effect/e", value="x,x", idempotency_key="x")
    h.op("o", "read", "r", 8, 9, key="effect/e", value="x")
    assert h.check().valid


def test_stale_write_caught_by_timing_is_not_reported_again_by_its_readers() -> None:
    h = History()
    h.op("b", "write", "r", 0, 1, token=2, key="k", value="b")
    stale = h.op("a", "write", "r", 2, 3, token=1, key="k", value="a")
    h.op("o", "read", "r", 4, 5, key="k", value="a")
    h.op("o", "read", "r", 6, 7, key="k", value="a")
    result = h.check()
    assert [v.op_ids[0] for v in result.violations] == [stale]


# -- rule 4: lost-write ---------------------------------------------------------------


def lost_write_history(final: str | None) -> History:
    h = History()
    h.op("a", "write", "r", 0, 1, token=1, key="k", value="v1")
    h.op("a", "write", "r", 2, 3, token=1, key="k", value="v2")
    h.op("b", "write", "r", 4, 5, "fail", token=0, key="k", value="v0", error="STALE_TOKEN")
    h.op("z", "read", "r", 10, 11, key="k", value=final, final=1)
    return h


def test_final_value_of_the_last_write_is_valid() -> None:
    assert lost_write_history("v2").check().valid


@pytest.mark.parametrize(
    ("final", "why"),
    [
        ("v1", "was lost"),  # v2 was acknowledged after v1 completed
        (None, "found no value"),
        ("never", "no ok or info write"),
        ("v0", "only rejected write"),
    ],
)
def test_final_value_that_loses_an_acknowledged_write_is_flagged(
    final: str | None, why: str
) -> None:
    result = lost_write_history(final).check()
    assert result.kinds() == {ViolationKind.LOST_WRITE}
    assert why in result.violations[0].detail


def test_concurrent_writes_may_land_in_either_order() -> None:
    for final in ("v1", "v2"):
        h = History()
        h.op("a", "write", "r", 0, 3, token=1, key="k", value="v1")
        h.op("b", "write", "r", 1, 2, token=1, key="k", value="v2")
        h.op("z", "read", "r", 10, 11, key="k", value=final, final=1)
        assert h.check().valid, final


def test_write_of_unknown_outcome_may_or_may_not_have_landed() -> None:
    for final in ("v1", "v2"):
        h = History()
        h.op("a", "write", "r", 0, 1, token=1, key="k", value="v1")
        h.op("a", "write", "r", 2, None, "info", token=1, key="k", value="v2")  # killed
        h.op("z", "read", "r", 10, 11, key="k", value=final, final=1)
        assert h.check().valid, final


def test_write_of_unknown_outcome_may_land_after_its_client_gave_up() -> None:
    # a's first write timed out; it reached the guard after a's next write of the
    # same token, so its value is the final one. Nothing was lost that was promised.
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="v1")
    h.op("a", "write", "r", 2, 3, token=1, key="k", value="v2")
    h.op("z", "read", "r", 10, 11, key="k", value="v1", final=1)
    assert h.check().valid


def test_only_unknown_writes_allow_not_found() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="v1")
    h.op("z", "read", "r", 10, 11, key="k", value=None, final=1)
    assert h.check().valid


def test_deduplicated_retry_does_not_count_as_overwriting() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="effect/e", value="x", idempotency_key="x")
    h.op("b", "write", "r", 2, 3, token=1, key="effect/e", value="x,y", idempotency_key="y")
    # a retries x with a fresh read-modify-write: the guard drops it as already applied.
    h.op("a", "write", "r", 4, 5, token=1, key="effect/e", value="x,y,x", idempotency_key="x")
    h.op("z", "read", "r", 10, 11, key="effect/e", value="x,y", final=1)
    assert h.check().valid


def test_reads_not_marked_final_are_not_judged() -> None:
    h = lost_write_history("v1")
    h.events = [replace(e, extra={}) if e.op == "read" else e for e in h.events]
    assert h.check().valid


# -- rule 5: duplicate-effect -----------------------------------------------------------


def effect_history(final: str, key: str = "effect/e") -> History:
    h = History()
    h.op("a", "write", "r", 0, 1, token=1, key=key, value="a", idempotency_key="a")
    h.op("a", "write", "r", 2, 3, "info", token=1, key=key, value="a,b", idempotency_key="b")
    h.op("b", "write", "r", 4, None, "info", token=2, key=key, value=final, idempotency_key="a")
    h.op("z", "read", "r", 10, 11, key=key, value=final, final=1)
    return h


def test_each_effect_once_is_valid() -> None:
    assert effect_history("a,b,c").check().valid


def test_effect_applied_twice_is_flagged() -> None:
    result = effect_history("a,b,a").check()
    assert result.kinds() == {ViolationKind.DUPLICATE_EFFECT}
    assert "'a' x2" in result.violations[0].detail


def test_repeated_items_outside_effect_keys_are_not_effects() -> None:
    assert effect_history("a,b,a", key="log").check().valid


# -- measurements, summary, input errors ------------------------------------------------


def test_overlap_and_takeover_latency_are_measured_not_judged() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 10, token=1, ttl_ms=50)
    h.op("b", "acquire", "r", 55, 70, token=2, ttl_ms=100)  # a's lease expired at >= 50
    h.op("a", "write", "r", 80, 81, "fail", token=1, error="STALE_TOKEN", key="k", value="x")
    h.op("a", "release", "r", 100, 101, "fail", token=1, error="LEASE_LOST")
    h.op("b", "release", "r", 120, 125, token=2)
    h.op("c", "acquire", "r", 126, 130, token=3)
    h.op("c", "release", "r", 140, 141, token=3)
    result = h.check()
    assert result.valid
    s = result.stats
    assert s.overlap_count == 1
    assert s.overlap_ms == pytest.approx(30.0)  # a believed 10..100, b 70..120
    assert s.takeover_latency_ms == pytest.approx((20.0, 5.0))  # 50 -> 70, 125 -> 130
    assert (s.stale_rejected, s.writes_ok, s.pending) == (1, 0, 0)
    assert s.ops["acquire"] == {"ok": 3}
    assert s.ops["release"] == {"fail": 1, "ok": 2}


def test_lost_marker_ends_belief() -> None:
    events: list[Event] = []
    t = itertools.count(0, MS)
    a = Recorder(events.append, "a", clock=lambda: next(t))
    b = Recorder(events.append, "b", clock=lambda: next(t))
    a.complete(a.invoke("acquire", "r"), "ok", token=1)
    a.lost("r", 1)  # local deadline passed
    b.complete(b.invoke("acquire", "r"), "ok", token=2)
    b.complete(b.invoke("write", "r", token=2, key="k", value="v"), "ok")
    result = check(events, mode="monotonic")
    assert result.valid
    assert result.stats.overlap_count == 0
    assert result.stats.ops["release"] == {"info": 1}


def test_summary_lists_every_rule() -> None:
    text = lost_write_history("v1").check().summary()
    assert text.startswith("verdict: INVALID")
    for kind in ViolationKind:
        assert kind.value in text


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fence mode"):
        check([], mode="eventually")


def test_empty_history_is_valid() -> None:
    assert check([], mode="strict").valid


@pytest.mark.parametrize(
    "mangle",
    [
        lambda evs: evs[1:],  # completion without invocation
        lambda evs: [*evs, evs[0]],  # two invocations of one op
        lambda evs: [evs[0], replace(evs[1], resource="other")],
    ],
)
def test_malformed_history_is_an_error_not_a_verdict(
    mangle: Callable[[list[Event]], list[Event]],
) -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1)
    with pytest.raises(HistoryError):
        check(mangle(h.events), mode="monotonic")


def test_large_history_is_checked_in_one_sweep() -> None:
    # 100k events: 25 resources, 200 rounds each of a holder writing under its token,
    # then a stale write rejected and a release. O(n^2) would time out here.
    h = History()
    rounds, resources = 200, 25
    for n in range(rounds):
        for k in range(resources):
            r, tok, t = f"r{k}", n + 1, n * 10.0 + k * 0.001
            h.op(f"p{n % 7}", "acquire", r, t, t + 0.1, token=tok, ttl_ms=100)
            for j in range(7):
                h.op(f"p{n % 7}", "write", r, t + 0.2 + j, t + 0.7 + j, token=tok, key="k",
                     value=f"{r}-{tok}-{j}")  # fmt: skip
            h.op("old", "write", r, t + 8, t + 8.5, "fail", token=tok - 1, key="k",
                 value="x", error="STALE_TOKEN")  # fmt: skip
            h.op(f"p{n % 7}", "release", r, t + 9, t + 9.5, token=tok)
    end = rounds * 10.0 + 100
    for k in range(resources):
        h.op("z", "read", f"r{k}", end, end + 1, key="k", value=f"r{k}-{rounds}-6", final=1)
    assert len(h.events) >= 100_000
    result = h.check("watch")
    assert result.valid, result.summary()
    assert result.stats.stale_rejected == rounds * resources
    assert len(result.stats.takeover_latency_ms) == (rounds - 1) * resources


# -- history files ----------------------------------------------------------------------


def recorded(tmp_path: Path, name: str, clock: Callable[[], int]) -> Path:
    path = tmp_path / f"{name}.jsonl"
    with HistoryWriter(path) as w:
        rec = Recorder(w.write, name, clock=clock)
        op = rec.invoke("acquire", "orders", ttl_ms=3000)
        rec.complete(op, "ok", token=42, ttl_ms=3000)
        op = rec.invoke("write", "orders", token=42, key="k", value="é✓", idempotency_key="i1")
        rec.complete(op, "fail", error="STALE_TOKEN", current_token=43)
        rec.invoke("read", "orders", key="k", final=1)  # killed before the reply
    return path


def test_history_round_trips_through_jsonl(tmp_path: Path) -> None:
    events: list[Event] = []
    ticks = itertools.count(100)
    path = tmp_path / "a.jsonl"
    with HistoryWriter(path) as w:

        def both(e: Event) -> None:
            w.write(e)
            events.append(e)

        rec = Recorder(both, "a", clock=lambda: next(ticks))
        op = rec.invoke("write", "orders", token=42, key="k", value="é✓", idempotency_key="i1")
        rec.complete(op, "ok")
        rec.invoke("read", "orders", key="k", final=1)
        assert len(rec.in_flight) == 1
    assert read_history(path) == events
    done = events[1]
    assert (done.token, done.key, done.value, done.idempotency_key) == (42, "k", "é✓", "i1")
    ops = pair_operations(read_history([path]))
    assert [o.type for o in ops] == ["ok", "info"]
    assert ops[1].pending


def test_partial_last_line_from_a_killed_writer_is_skipped(tmp_path: Path) -> None:
    path = recorded(tmp_path, "c1", itertools.count(1).__next__)
    whole = read_history(path)
    extra = replace(whole[-1], op_id="x")
    line = json.dumps(extra.to_dict()) + "\n"
    for cut in (1, len(line) // 2, len(line) - 2):  # SIGKILL anywhere inside the record
        with path.open("ab") as f:
            f.write(line[:cut].encode())
        assert read_history(path) == whole
        HistoryWriter(path).close()  # reopening cuts the partial line off
        assert path.read_bytes().endswith(b"\n")
        assert read_history(path) == whole
    # Killed after the record but before its newline: the record is whole and kept.
    with path.open("ab") as f:
        f.write(line[:-1].encode())
    assert read_history(path) == [*whole, extra]
    HistoryWriter(path).close()
    assert path.read_bytes().endswith(b"}\n")
    assert read_history(path) == [*whole, extra]


def test_reopened_writer_appends_clean_lines_after_a_partial_one(tmp_path: Path) -> None:
    path = recorded(tmp_path, "c1", itertools.count(1).__next__)
    with path.open("ab") as f:
        f.write(b'{"process":"c1","op_')
    with HistoryWriter(path) as w:
        Recorder(w.write, "c1b", clock=lambda: 99).invoke("renew", "orders", token=42)
    assert [e.process for e in read_history(path)] == ["c1"] * 5 + ["c1b"]


def test_corrupt_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = recorded(tmp_path, "c1", itertools.count(1).__next__)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"{not json\n" + b"".join(lines[1:]))
    with pytest.raises(HistoryError, match=r"c1\.jsonl:2"):
        read_history(path)


def test_files_merge_by_monotonic_time(tmp_path: Path) -> None:
    recorded(tmp_path, "odd", itertools.count(1, 2).__next__)
    recorded(tmp_path, "even", itertools.count(2, 2).__next__)
    merged = read_history(tmp_path)  # a directory means its *.jsonl files
    assert [e.t_mono_ns for e in merged] == list(range(1, 11))
    assert {e.process for e in merged} == {"odd", "even"}
    assert check(merged, mode="monotonic").stats.stale_rejected == 2


def test_recorder_completion_inherits_invocation_fields() -> None:
    events: list[Event] = []
    rec = Recorder(events.append, "p", clock=lambda: 5, wall_clock=lambda: 7)
    op = rec.invoke("read", "r", key="k")
    done = rec.complete(op, "ok", value=None, written_by_token=3)
    assert (done.op, done.resource, done.key, done.value, done.t_wall_ns) == (
        "read", "r", "k", None, 7,
    )  # fmt: skip
    assert done.extra == {"written_by_token": 3}
    with pytest.raises(KeyError):
        rec.complete(op, "ok")
    with pytest.raises(HistoryError):
        rec.complete(rec.invoke("read", "r"), "invoke")


@pytest.mark.parametrize(
    "raw",
    [
        {"op": "delete"},
        {"type": "maybe"},
        {"token": "7"},
        {"t_mono_ns": True},
        {"extra": {"final": True}},
    ],
)
def test_malformed_events_are_refused(raw: dict[str, object]) -> None:
    good = make_op("p", "p:1", "write", "r", 1, 2, "ok", token=1, key="k", value="v")[0]
    with pytest.raises(HistoryError):
        Event.from_dict({**good.to_dict(), **raw})


# -- unknown outcomes and what a read proves ---------------------------------------


def test_a_write_of_unknown_outcome_does_not_fence_later_writes_by_its_completion() -> None:
    # b's newer write timed out: it may never have landed, so a's older write after
    # it proves nothing. Mutation: the same write acknowledged is a barrier.
    h = History()
    newer = h.op("b", "write", "r", 0, 1, "info", token=2, key="k", value="b")
    h.op("a", "write", "r", 5, 6, token=1, key="k", value="a")
    for mode in (*ALL_MODES, "off"):
        assert h.check(mode).valid, mode
    h.events = [
        replace(e, type="ok") if e.op_id == newer and e.type == "info" else e for e in h.events
    ]
    assert h.check().kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


@pytest.mark.parametrize("retried", [False, True], ids=["once", "retried"])
def test_a_write_of_unknown_outcome_seen_by_a_read_fences_from_that_read(retried: bool) -> None:
    # A read showed b's timed-out write: it had landed by the read's completion, so
    # a's older write invoked after that read is stale, in every mode. Retried: b
    # re-sent the same value and was killed; the read does not say which attempt
    # landed, but one did, so the fence had reached token 2 all the same.
    h = History()
    newer = h.op("b", "write", "r", 0, 1, "info", token=2, key="k", value="b", idempotency_key="x")
    if retried:
        h.op("b", "write", "r", 1.5, None, "info", token=2, key="k", value="b", idempotency_key="x")
    seen = h.op("o", "read", "r", 2, 3, key="k", value="b")
    stale = h.op("a", "write", "r", 5, 6, token=1, key="k", value="a")
    for mode in (*ALL_MODES, "off"):
        result = h.check(mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}, mode
        assert result.violations[0].op_ids == (stale, newer)
        assert "seen applied by a read" in result.violations[0].detail
        assert ("a retry" in result.violations[0].detail) == retried
    # Control: a read still running when a's write was invoked proves nothing yet.
    h.events = [
        replace(e, t_mono_ns=8 * MS) if e.op_id == seen and e.type == "ok" else e for e in h.events
    ]
    assert h.check().valid


def test_a_read_of_a_value_retried_under_a_newer_token_fences_only_the_lowest() -> None:
    # The retry carried a newer token (re-sent after a re-acquire): the read proves
    # the fence reached the lower of the two, not which attempt landed.
    h = History()
    h.op("b", "write", "r", 0, 1, "info", token=2, key="e", value="b", idempotency_key="x")
    h.op("b", "write", "r", 2, 3, "info", token=4, key="e", value="b", idempotency_key="x")
    h.op("o", "read", "r", 4, 5, key="e", value="b")
    between = h.op("a", "write", "r", 6, 7, token=3, key="k", value="a")
    assert h.check().valid
    h.events = [replace(e, token=1) if e.op_id == between else e for e in h.events]
    assert h.check().kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_late_write_seen_after_an_unknown_newer_write_was_seen_is_flagged() -> None:
    # Neither write was acknowledged; the reads order them: b (token 2) had landed
    # by 3 ms, then a read shows a (token 1): a landed after b, below its fence.
    h = History()
    late = h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="a")
    newer = h.op("b", "write", "r", 0, 1, "info", token=2, key="k", value="b")
    h.op("o", "read", "r", 2, 3, key="k", value="b")
    read = h.op("o", "read", "r", 5, 6, key="k", value="a")
    for mode in (*ALL_MODES, "off"):
        result = h.check(mode)
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}, mode
        assert result.violations[0].op_ids == (late, read, newer)


def test_late_write_needs_the_newer_write_known_applied() -> None:
    # Control of the above: without the read that showed b, b may never have
    # landed, and a read of a after b's timeout is no evidence of anything.
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="a")
    newer = h.op("b", "write", "r", 2, 3, "info", token=2, key="k", value="b")
    h.op("o", "read", "r", 5, 6, key="k", value="a")
    h.op("z", "read", "r", 10, 11, key="k", value="a", final=1)
    assert h.check().valid
    # Mutation: b acknowledged; then the reads prove a late write.
    h.events = [
        replace(e, type="ok") if e.op_id == newer and e.type == "info" else e for e in h.events
    ]
    assert h.check().kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_an_unknown_write_is_never_overwritten_by_its_own_completion() -> None:
    # v1's write timed out at 1 ms; an ok write invoked at 2 ms does not prove v1
    # was overwritten: v1 may have landed after it. Mutation: v1 acknowledged.
    h = History()
    first = h.op("a", "write", "r", 0, 1, "info", token=2, key="k", value="v1")
    h.op("b", "write", "r", 2, 3, token=2, key="k", value="v2")
    h.op("z", "read", "r", 10, 11, key="k", value="v1", final=1)
    assert h.check().valid
    h.events = [
        replace(e, type="ok") if e.op_id == first and e.type == "info" else e for e in h.events
    ]
    assert h.check().kinds() == {ViolationKind.LOST_WRITE}


def test_an_unknown_write_seen_by_a_read_is_overwritten_from_that_read() -> None:
    h = History()
    h.op("a", "write", "r", 0, 1, "info", token=2, key="k", value="v1")
    h.op("o", "read", "r", 2, 3, key="k", value="v1")
    h.op("b", "write", "r", 4, 5, token=2, key="k", value="v2")
    h.op("z", "read", "r", 10, 11, key="k", value="v1", final=1)
    result = h.check()
    assert result.kinds() == {ViolationKind.LOST_WRITE}
    assert "was lost" in result.violations[0].detail


def test_unknown_writes_are_never_required_present_or_absent() -> None:
    for final in (None, "v1", "v2"):
        h = History()
        h.op("a", "write", "r", 0, 1, "info", token=1, key="k", value="v1")
        h.op("a", "write", "r", 2, None, "info", token=1, key="k", value="v2")
        h.op("z", "read", "r", 10, 11, key="k", value=final, final=1)
        assert h.check().valid, final


# -- rule 6: lost-update (the lock-counter) -------------------------------------------


def inc(
    h: History,
    process: str,
    start: float,
    end: float | None,
    type: str,
    token: int,
    ids: list[str],
    error: str | None = None,
) -> str:
    """An increment write: the counter and id list it read plus its own id (``ids[-1]``)."""
    return h.op(
        process,
        "write",
        "r",
        start,
        end,
        type,
        token=token,
        key="counter",
        value=f"{len(ids)}#{','.join(ids)}",
        error=error,
        increment=ids[-1],
    )


def final(h: History, ids: list[str] | None, count: int | None = None) -> str:
    value = None if ids is None else f"{len(ids) if count is None else count}#{','.join(ids)}"
    return h.op("z", "read", "r", 100, 101, key="counter", value=value, final=1)


def test_counter_with_every_increment_is_valid() -> None:
    h = History()
    inc(h, "a", 0, 1, "ok", 1, ["a1"])
    inc(h, "a", 2, 3, "ok", 1, ["a1", "a2"])
    inc(h, "b", 10, 11, "ok", 2, ["a1", "a2", "b1"])
    final(h, ["a1", "a2", "b1"])
    for mode in (*ALL_MODES, "off"):
        result = h.check(mode)
        assert result.valid and not result.findings, mode


def lost_update_history(old_token: int) -> tuple[History, str]:
    # a read the counter at 1, then paused; b took over (token 2), read it too, a
    # woke and wrote (accepted: b had not written), then b wrote over a's increment.
    h = History()
    inc(h, "a", 0, 1, "ok", 1, ["a1"])
    h.op("b", "acquire", "r", 4, 5, token=2)
    lost = inc(h, "a", 6, 7, "ok", old_token, ["a1", "a2"])
    inc(h, "b", 8, 9, "ok", 2, ["a1", "b1"])
    final(h, ["a1", "b1"])
    return h, lost


def test_monotonic_window_lost_update_is_a_finding_not_a_violation() -> None:
    h, lost = lost_update_history(1)
    result = h.check("monotonic")
    assert result.valid
    assert [f.kind for f in result.findings] == [ViolationKind.LOST_UPDATE]
    assert result.findings[0].op_ids[0] == lost
    assert "documented window" in result.findings[0].detail
    assert "findings" in result.summary()


def test_lost_update_is_a_violation_in_the_fenced_modes() -> None:
    h, lost = lost_update_history(1)
    for mode in ("promise", "watch", "strict"):
        result = h.check(mode)
        # In these modes a's write below b's granted token is also stale (rule 3b).
        assert ViolationKind.LOST_UPDATE in result.kinds(), mode
        assert not result.findings, mode
        assert any(v.op_ids[0] == lost for v in result.violations if v.kind == "lost-update")


def test_lost_update_not_explained_by_a_newer_token_is_a_violation_in_monotonic() -> None:
    # The increment that replaced a's carries the same token: no window explains it.
    h, _ = lost_update_history(2)
    result = h.check("monotonic")
    assert result.kinds() == {ViolationKind.LOST_UPDATE}
    assert not result.findings


def test_an_unknown_increment_may_or_may_not_be_listed() -> None:
    for listed in (["a1"], ["a1", "a2"]):
        h = History()
        inc(h, "a", 0, 1, "ok", 1, ["a1"])
        inc(h, "a", 2, 3, "info", 1, ["a1", "a2"])
        final(h, listed)
        assert h.check().valid, listed


def test_a_rejected_increment_in_the_final_list_is_flagged() -> None:
    h = History()
    inc(h, "b", 0, 1, "ok", 2, ["b1"])
    bad = inc(h, "a", 2, 3, "fail", 1, ["b1", "a1"], error="STALE_TOKEN")
    final(h, ["b1"])
    assert h.check().valid
    h.events = h.events[:-2]
    final(h, ["b1", "a1"])
    result = h.check()
    # The final value is the rejected write's own (rule 4) and lists it (rule 6).
    assert ViolationKind.REJECTED_WRITE_LANDED in result.kinds()
    assert any(v.op_ids[0] == bad for v in result.violations)


def test_a_counter_that_disagrees_with_its_list_is_flagged() -> None:
    h = History()
    inc(h, "a", 0, 1, "ok", 1, ["a1"])
    final(h, ["a1"], count=2)
    assert ViolationKind.LOST_UPDATE in h.check().kinds()


def test_a_missing_counter_loses_every_acknowledged_increment() -> None:
    h = History()
    inc(h, "a", 0, 1, "ok", 1, ["a1"])
    final(h, None)
    assert ViolationKind.LOST_UPDATE in h.check().kinds()


def test_a_lost_increment_that_was_itself_stale_is_no_window() -> None:
    # a woke after b had written (token 2) and wrote (accepted: unfenced); then c
    # (token 3), which had read before a's write landed, wrote over it. a's write
    # is stale (rule 3a), so its loss is a violation, not the window.
    h = History()
    inc(h, "b", 0, 1, "ok", 2, ["b1"])
    stale = inc(h, "a", 2, 3, "ok", 1, ["a1"])
    inc(h, "c", 4, 5, "ok", 3, ["b1", "c1"])
    final(h, ["b1", "c1"])
    result = h.check("monotonic")
    assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED, ViolationKind.LOST_UPDATE}
    assert not result.findings
    assert {v.op_ids[0] for v in result.violations} == {stale}


def test_a_replayed_increment_refused_after_its_first_attempt_landed_is_valid() -> None:
    # a was killed with its increment in flight (pending); it landed, and b built on
    # it. a's next incarnation re-sent it from its outbox with the old token: refused
    # (STALE_TOKEN; the token is judged before the key). The refusal of the replay
    # says nothing of the first attempt, which the final list rightly shows.
    h = History()
    inc(h, "a", 0, None, "info", 1, ["a1"])
    h.op("b", "read", "r", 2, 3, key="counter", value="1#a1")
    inc(h, "b", 4, 5, "ok", 2, ["a1", "b1"])
    replay = inc(h, "a~1", 6, 7, "fail", 1, ["a1"], error="STALE_TOKEN")
    final(h, ["a1", "b1"])
    result = h.check()
    assert result.valid, result.summary()
    # Had every attempt been refused, the listed increment would be a violation.
    h.events = [e for e in h.events if not e.op_id.startswith("a:")]
    result = h.check()
    assert ViolationKind.REJECTED_WRITE_LANDED in result.kinds()
    assert any(v.op_ids[0] == replay for v in result.violations)


# -- rule 7: job-done-twice ---------------------------------------------------------

JOB = "job/chaos/7"


def rescued_job(stale_completion: str) -> tuple[History, str]:
    """a claims the job (token 1) and is paused past its claim; b rescues it (token 2)
    and completes it; a wakes and completes with its stale token. Returns a's completion."""
    h = History()
    h.op("a", "acquire", JOB, 0, 1, token=1, job="7", ttl_ms=100)
    h.op("b", "acquire", JOB, 200, 201, token=2, job="7", ttl_ms=100)
    h.op("b", "release", JOB, 210, 211, token=2, job="7")
    error = "STALE_TOKEN" if stale_completion == "fail" else None
    stale = h.op("a", "release", JOB, 220, 221, stale_completion, token=1, job="7", error=error)
    return h, stale


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_rescued_job_whose_stale_completion_is_refused_is_valid(mode: str) -> None:
    h, _ = rescued_job("fail")
    result = h.check(mode)
    assert result.valid, result.summary()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_stale_completion_accepted_is_flagged(mode: str) -> None:
    # The control: a worker completing with its stale token on a path that does not
    # check it; the job is done twice.
    h, stale = rescued_job("ok")
    result = h.check(mode)
    assert result.kinds() == {"job-done-twice"}, result.summary()
    assert {v.op_ids[0] for v in result.violations} == {stale}


def test_a_stale_completion_alone_is_flagged() -> None:
    # The rescuer never completed (killed): the stale completion is still one the
    # job's newer claim had to make the queue refuse.
    h = History()
    h.op("a", "acquire", JOB, 0, 1, token=1, job="7")
    h.op("b", "acquire", JOB, 200, 201, token=2, job="7")
    stale = h.op("a", "release", JOB, 220, 221, token=1, job="7")
    result = h.check()
    assert result.kinds() == {"job-done-twice"}
    assert result.violations[0].op_ids == (stale, result.violations[0].op_ids[1])


def test_a_job_completed_twice_under_one_token_is_flagged() -> None:
    h = History()
    h.op("a", "acquire", JOB, 0, 1, token=1, job="7")
    first = h.op("a", "release", JOB, 2, 3, token=1, job="7")
    again = h.op("a~1", "release", JOB, 4, 5, token=1, job="7")
    result = h.check()
    assert result.kinds() == {"job-done-twice"}
    assert result.violations[0].op_ids == (again, first)


def test_completions_of_unknown_outcome_or_racing_the_rescue_are_not_judged() -> None:
    h = History()
    h.op("a", "acquire", JOB, 0, 1, token=1, job="7")
    # a's completion was sent while b's rescue was still in flight: concurrent.
    h.op("a", "release", JOB, 150, 160, token=1, job="7")
    h.op("b", "acquire", JOB, 155, 201, token=2, job="7")
    h.op("b", "release", JOB, 210, 211, "info", token=2, job="7", error="UNAVAILABLE")
    assert h.check().valid, h.check().summary()


def test_lease_releases_are_no_job_completions() -> None:
    h = History()
    h.op("a", "acquire", "r", 0, 1, token=1)
    h.op("a", "release", "r", 2, 3, token=1)
    h.op("b", "acquire", "r", 4, 5, token=2)
    h.op("a", "release", "r", 6, 7, token=1)
    assert h.check().valid


# -- rule 8: periodic-slot ----------------------------------------------------------

PERIODIC = "periodic/soak"


def listed(periods: list[int], every_ms: int = 5000) -> History:
    """The periodic jobs listed after a run: one per entry of ``periods`` (ms)."""
    h = History()
    for i, period in enumerate(periods):
        h.op(
            "final",
            "periodic",
            PERIODIC,
            10 + i,
            10 + i,
            value=str(period),
            job=i + 1,
            every_ms=every_ms,
            final=1,
        )
    return h


def test_one_job_per_period_is_valid() -> None:
    result = listed([5000, 10000, 15000, 20000]).check()
    assert result.valid, result.summary()


@pytest.mark.parametrize(
    ("periods", "says"),
    [
        ([5000, 10000, 10000, 15000], "period 10000 has 2 jobs"),
        ([5000, 15000, 20000], "1 period(s) between 5000 and 20000 have no job: 10000"),
        ([5000, 10000, 12500, 15000], "off the schedule's 5000 ms grid: 12500"),
    ],
)
def test_a_period_twice_missed_or_off_the_grid_is_flagged(periods: list[int], says: str) -> None:
    result = listed(periods).check()
    assert result.kinds() == {"periodic-slot"}, result.summary()
    assert any(says in v.detail for v in result.violations), result.summary()


def test_failed_listings_and_other_resources_are_not_judged() -> None:
    h = listed([5000, 15000])
    h.events = [e for e in h.events if e.type == "invoke"] + [
        replace(e, type="info") for e in h.events if e.type != "invoke"
    ]
    assert h.check().valid


# -- judged in parts: the same verdict, one part in memory at a time ------------------


def judged_in_parts(events: list[Event], mode: str, part: Callable[[str], str]) -> CheckResult:
    """``events`` written as the clients write them (a file per process), split on disk
    by ``part`` and judged part by part, as a soak's final check does."""
    with tempfile.TemporaryDirectory() as tmp:
        history = Path(tmp) / "history"
        history.mkdir()
        writers: dict[str, HistoryWriter] = {}
        for e in sorted(events, key=lambda e: e.t_mono_ns):
            if e.process not in writers:
                writers[e.process] = HistoryWriter(history / f"{e.process}.jsonl")
            writers[e.process].write(e)
        for w in writers.values():
            w.close()
        parts = split_history(history, Path(tmp) / "parts", part)
        assert parts.events == len(events)
        return merge(
            mode,
            [
                check(
                    parts.read(n), mode=mode, origin_ns=parts.origin_ns, last_seen=parts.last_seen
                )
                for n in parts.names
            ],
        )


def same_verdict(whole: CheckResult, parts: CheckResult) -> None:
    assert parts.counts() == whole.counts()
    assert parts.finding_counts() == whole.finding_counts()
    assert sorted(map(str, parts.violations)) == sorted(map(str, whole.violations))
    a, b = whole.stats, parts.stats
    assert (b.ops, b.pending, b.writes_ok, b.stale_rejected) == (
        a.ops, a.pending, a.writes_ok, a.stale_rejected,
    )  # fmt: skip
    assert b.overlap_count == a.overlap_count
    assert b.overlap_ms == pytest.approx(a.overlap_ms)
    assert sorted(b.takeover_latency_ms) == pytest.approx(sorted(a.takeover_latency_ms))


@MUT
@given(simulations(), st.data())
def test_a_history_judged_in_parts_gets_the_verdict_of_the_whole(
    sim: Sim, data: st.DataObject
) -> None:
    events = sim.events
    barriers = ok_ops(sim, "write", "fence")
    if data.draw(st.booleans()) and barriers:  # and with a violation in it
        b = data.draw(st.sampled_from(barriers))
        assert isinstance(b.end_ns, int) and b.token is not None
        events = inject(
            sim, "write", b.resource, b.end_ns + 1, b.end_ns + 2,
            token=b.token - TOKEN_STEP // 2, key="stale/k", value="stale",
        )  # fmt: skip
    for mode in ALL_MODES:
        whole = check(events, mode=mode)
        same_verdict(whole, judged_in_parts(events, mode, lambda resource: resource))
        same_verdict(whole, judged_in_parts(events, mode, lambda _resource: "all"))


# -- rule 9: every job done at least once --------------------------------------------


def listed_job(h: History, state: str, *, attempts: int = 1, done: bool = False) -> None:
    res = "job/chaos/1"
    h.op("w", "acquire", res, 0, 1, token=3, ttl_ms=1000, job=1)
    if done:
        h.op("w", "release", res, 2, 3, token=3, job=1)
    h.op(
        "final", "job", res, 10, 10, value=state, job=1, attempts=attempts, max_attempts=5, final=1
    )


@pytest.mark.parametrize(
    ("state", "attempts", "done", "flagged"),
    [
        ("succeeded", 1, True, False),
        ("succeeded", 1, False, False),  # its completion's reply was lost: done all the same
        ("dead", 5, False, False),  # the queue gave up by its rule
        ("dead", 2, False, True),  # buried with attempts left
        ("ready", 1, False, True),  # left undone
        ("running", 1, False, True),
        ("dead", 5, True, True),  # an acknowledged completion lost
        ("ready", 1, True, True),
    ],
)
def test_a_job_listed_at_the_end_must_have_been_done(
    state: str, attempts: int, done: bool, flagged: bool
) -> None:
    h = History()
    listed_job(h, state, attempts=attempts, done=done)
    result = h.check("strict")
    assert result.kinds() == ({ViolationKind.JOB_NOT_DONE} if flagged else set())
