"""The verdict on a chaos run: a pure function from a history to violations and statistics.

:func:`check` takes the merged events of a run (see :mod:`chaos.history`) and the
guard's fence mode the run claims to test, and returns a :class:`CheckResult`.
No I/O, no clocks, no randomness: the same history always gets the same verdict.

Notation: operations pair an invocation (time ``start``) with a completion (time
``end``; a pending operation ends at +infinity). "A completed before B was
invoked" means ``A.end < B.start`` on the harness's one monotonic clock; that is
the only ordering the checker trusts. Operations that overlap in time impose
nothing on each other. Only ``ok`` operations are known to have taken effect;
``info`` ones may or may not have, so they never serve as evidence of an effect
but may explain an observed one; ``fail`` ones certainly had no effect.

When a write is *known applied* (:func:`_known_applied`): an ``ok`` write from its
completion, or earlier if a read already returned its value; an ``info`` write
(timeout, connection reset, a killed client) never from its own completion, which
says nothing, but from the completion of the first ``ok`` read that returned its
value (values are unique per write, so that read proves the write had landed).
A value that several writes carried (a retry re-sending it) makes none of them
known applied, since the read does not say which attempt landed; it does prove
that one did, so for rule 3a the lowest of their tokens fences from that read.
A write never known applied does not count as finished anywhere: not as a fence
for later writes (rule 3a), not as the newer write a read is judged against (3c),
not as overwritten or overwriting (4). Nor is it ever required to be present or
absent in the final state (4, 6).

Rules (asserted: each breach is a :class:`Violation`, and any violation makes the
run invalid). All rules are per resource.

1. ``duplicate-token`` (G1): no two ``ok`` acquires of a resource returned the same
   token. Acquires carrying the same ``extra["request_id"]`` are one claim (an
   idempotent retry returns the same token by design) and count once.
2. ``token-order`` (G1): if acquire A completed ``ok`` before acquire B was invoked,
   and B is ``ok``, then ``token(B) > token(A)``. Equal tokens are reported once,
   as ``duplicate-token``, so this rule flags ``token(B) < token(A)``.
3. ``stale-write-accepted`` (G3, G4, G5): an ``ok`` write with token ``t`` is flagged
   if, before it was invoked, one of these held with a token ``t' > t``:

   a. (every mode) a write to the resource known applied by then (see above: an
      ``info`` write only once a read showed it; for a value several writes
      carried, the lowest of their tokens once a read showed it), or a ``fence``
      (an explicit promise);
   b. (modes ``promise``, ``watch``, ``strict`` only) an ``ok`` acquire: the write is
      below a token already granted. In ``monotonic`` mode this is the documented open
      window (a former holder may write until the new holder's first write or
      promise) and is not flagged. In ``promise`` mode the workload must record the
      acquire's completion only after its promises returned (the SDK's
      ``hold(..., fence=[...])``), because that is when the promise starts to hold;
      in ``watch`` mode only once it saw the guard's fence reach the token (the
      event's delivery delay is the documented window). An acquire whose
      completion carries ``extra["fenced"] == 0`` (the client gave up waiting for
      that) is no barrier.

   c. (every mode) seen by a read: an ``ok`` read (any, not only a final one) of a
      key returned the value of a write W with token ``t``, although a write W2 of
      that key with a token ``t' > t`` was known applied before the read was
      invoked, and W was not known applied before W2 was invoked (that case is a
      lost W2, rule 4). Then W was applied after W2, below the fence W2 set. This
      catches writes that were delayed in the network and landed late, whatever
      their recorded outcome (a timed-out ``info`` write, or one of a killed
      client): timing alone cannot order them, the read can. W2s that may have
      been deduplicated (rule 4) are not counted; values are assumed unique per
      write (a retry may repeat one).

   ``mode="off"`` (the guard's unfenced control) gets rules 3a and 3c only; pass
   the mode the run claims to test instead, so the control is judged by the same
   rules and shows what fencing prevents.
4. ``lost-write`` (durability and order of acknowledged writes): for every final
   read (an ``ok`` read with ``extra["final"] == 1``, taken after all clients
   stopped), with ``value`` ``None`` meaning "not found":

   - a value must be the value of some ``ok`` or ``info`` write of that key (a value
     only a ``fail`` write carried means a rejected write took effect);
   - that write W must not be overwritten in real time: no ``ok`` write W2 of the
     key was invoked after W was known applied (an ``info`` W may have landed
     after its client gave up, so its own completion never counts). A W2 whose
     idempotency key an earlier-invoked ``ok``/``info`` write already carried is
     not counted, since the guard may have deduplicated it into a no-op (G6).
     Values are assumed unique per write;
   - "not found" is flagged when an ``ok`` write of the key exists.
5. ``duplicate-effect`` (G6): a final read of a key named ``effect/...`` holds a
   comma-separated list of idempotency keys, each appended by a read-modify-write;
   no idempotency key may appear in it twice.
6. ``lost-update`` and ``rejected-write-landed`` (read-modify-write increments, the
   lock-counter workload): a write whose invocation carries ``extra["increment"]``
   (a unique increment id) writes ``"N#id1,...,idN"``: the counter it read plus one
   and the list of increment ids it read plus its own. For each final read of a
   key such writes wrote, the listed ids are the increments that survived:

   - every ``ok`` increment must be listed (else ``lost-update``: an acknowledged
     increment was overwritten by one that had not seen it);
   - no ``fail`` increment may be listed (``rejected-write-landed``), unless
     another attempt of it (a re-sent outbox write keeps its id) was ``ok`` or
     ``info``: a refused replay says nothing of the attempt before it;
   - ``info`` increments may or may not be listed;
   - ``N`` must equal the number of ids, each listed once (else ``lost-update``).

   In ``monotonic`` mode (and the ``off`` control checked as ``monotonic``) a lost
   increment L is the documented window, a *finding* (:attr:`CheckResult.findings`),
   not a violation, when the increment that took its place in the final list (the
   one after the longest prefix L's list shares with it) carries a higher token:
   a newer holder read before the former holder's last write landed, then wrote
   over it (a former holder may write until the new holder's first write), and L
   itself was not flagged by rule 3 (a stale write is out of the window). Any
   other lost increment is a violation in every mode.
7. ``job-done-twice`` (queue jobs, at most once per attempt token): a job's
   completion is a ``release`` whose invocation carries ``extra["job"]`` and the
   claim's token. A job is done at most once: two ``ok`` completions of one job are
   flagged (whatever their tokens: a job done is never claimed again), and so is an
   ``ok`` completion with token ``t`` invoked after an ``ok`` claim (``acquire``
   with ``extra["job"]``) of the same job with a token ``t' > t`` had completed: the
   job had been rescued, the former attempt's token was stale and its completion
   had to be refused. ``info`` completions may or may not have landed and are not
   judged. That every job is done at least once is rule 9.
8. ``periodic-slot`` (periodic schedules, one job per period): the queue's jobs of a
   schedule, listed after the run, are ``periodic`` operations on
   ``periodic/<schedule>`` whose ``value`` is the start (ms) of the job's period and
   ``extra["every_ms"]`` the schedule's interval. Between the first and the last
   period listed, every period has exactly one job: a period with two jobs (two
   servers that did not agree it was done) or none (a period no server enqueued, the
   schedule's catch-up included) is flagged.

9. ``job-not-done`` (queue jobs, at least once): after all clients stopped, the
   harness does what is left to do (claims what is ready, rescues what killed workers
   left running) and lists every job of the queue: ``job`` operations on the job's
   resource, ``value`` its state, ``extra["attempts"]``/``["max_attempts"]``. A job
   listed in any state but ``succeeded`` is flagged, unless it is ``dead`` with its
   attempts used up (the queue gave up by its rule) and no completion of it was
   acknowledged; a job whose completion was acknowledged (an ``ok`` release with
   ``extra["job"]``) must be listed ``succeeded``.
Measured, never asserted (:class:`Stats`): operation counts by op and outcome;
``writes_ok``; ``stale_rejected`` (``fail`` writes and fences with error
``STALE_TOKEN``: the guard at work); ``overlap_count``/``overlap_ms`` (how often
and how long two processes at once believed they held a resource; a process
believes from its ok acquire's completion until it invokes a release, records an
event with ``extra["lost"] == 1``, or sees a renew fail with ``LEASE_LOST``; a
belief never ended closes at the process's last recorded event, since a process
that records nothing more does nothing more); ``takeover_latency_ms`` (from the
end of one claim, i.e. its release's ok completion or else its earliest possible
expiry, last ok acquire/renew invocation plus ``extra["ttl_ms"]``, to the next
ok acquire's completion). Overlap is expected under pauses and partitions: it is
what fencing makes harmless, so it is reported, not judged.

Cost: O(n log n): group by resource, sort, sweep with running maxima.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from chaos.history import Event, Operation, pair_operations

MODES: Final = frozenset({"monotonic", "promise", "watch", "strict", "off"})
"""Fence modes :func:`check` accepts (the guard's modes plus the ``off`` control)."""

GRANT_FENCED_MODES: Final = frozenset({"promise", "watch", "strict"})
"""Modes in which a granted token already fences older ones (rule 3b)."""

EFFECT_PREFIX: Final = "effect/"
"""Keys whose final value is a comma-separated list of applied idempotency keys."""

WINDOW_MODES: Final = frozenset({"monotonic", "off"})
"""Modes whose documented window lets a newer holder overwrite a former holder's last
increment (rule 6): such lost updates are findings there, violations elsewhere."""


class ViolationKind(StrEnum):
    """The rule a :class:`Violation` breaks (a ``str``, so it compares to plain names)."""

    DUPLICATE_TOKEN = "duplicate-token"
    TOKEN_ORDER = "token-order"
    STALE_WRITE_ACCEPTED = "stale-write-accepted"
    LOST_WRITE = "lost-write"
    DUPLICATE_EFFECT = "duplicate-effect"
    LOST_UPDATE = "lost-update"
    REJECTED_WRITE_LANDED = "rejected-write-landed"
    JOB_DONE_TWICE = "job-done-twice"
    PERIODIC_SLOT = "periodic-slot"
    JOB_NOT_DONE = "job-not-done"


@dataclass(frozen=True, slots=True)
class Violation:
    """One breach of a rule: which rule, where, a sentence saying why, and the ops involved.

    ``op_ids`` lists the offending operation first, then the ones that prove it wrong.
    """

    kind: str
    resource: str
    detail: str
    op_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stats:
    """What was measured during the run; reported, never part of the verdict.

    ``ops`` maps op name to outcome (``ok``/``fail``/``info``) to count; ``pending``
    counts operations with no completion (included in ``info``).
    """

    ops: dict[str, dict[str, int]]
    pending: int
    writes_ok: int
    stale_rejected: int
    overlap_count: int
    overlap_ms: float
    takeover_latency_ms: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The verdict: ``valid`` iff there are no ``violations``; ``stats`` are measured only.

    ``findings`` are breaches the mode under test documents as possible (the
    monotonic window's lost updates, rule 6): reported, never part of the verdict.
    """

    mode: str
    violations: tuple[Violation, ...]
    stats: Stats
    findings: tuple[Violation, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        """Violations per rule, every rule present (zero when clean)."""
        found = Counter(v.kind for v in self.violations)
        return {kind.value: found.get(kind.value, 0) for kind in ViolationKind}

    def kinds(self) -> set[str]:
        """The rules broken at least once."""
        return {v.kind for v in self.violations}

    def finding_counts(self) -> dict[str, int]:
        """Findings per rule (only rules with findings)."""
        return dict(Counter(f.kind for f in self.findings))

    def summary(self, *, examples: int = 5) -> str:
        """A short human-readable verdict: a table of rules, the measurements, examples."""
        s = self.stats
        total = sum(sum(by_type.values()) for by_type in s.ops.values())
        lines = [
            f"verdict: {'VALID' if self.valid else 'INVALID'}  mode={self.mode}  "
            f"ops={total} (pending {s.pending})  violations={len(self.violations)}",
            f"  {'rule':<22}{'violations':>10}",
        ]
        lines += [f"  {kind:<22}{n:>10}" for kind, n in self.counts().items()]
        if self.findings:
            lines.append(
                f"  findings (the {self.mode} mode's documented window, not violations): "
                + ", ".join(f"{k}={n}" for k, n in sorted(self.finding_counts().items()))
            )
        lat = s.takeover_latency_ms
        takeover = (
            f"n={len(lat)} p50={statistics.median(lat):.1f} max={max(lat):.1f}" if lat else "n=0"
        )
        lines.append(
            f"  measured: writes ok {s.writes_ok} | stale rejected {s.stale_rejected} | "
            f"ownership overlaps {s.overlap_count} ({s.overlap_ms:.1f} ms) | "
            f"takeover ms {takeover}"
        )
        per_op = " | ".join(
            f"{op} " + " ".join(f"{t}={n}" for t, n in sorted(by_type.items()))
            for op, by_type in sorted(s.ops.items())
        )
        if per_op:
            lines.append(f"  ops: {per_op}")
        for v in self.violations[:examples]:
            lines.append(f"  - [{v.kind}] {v.resource}: {v.detail}")
        if len(self.violations) > examples:
            lines.append(f"  ... and {len(self.violations) - examples} more")
        return "\n".join(lines)


def check(
    events: Iterable[Event],
    *,
    mode: str,
    origin_ns: int | None = None,
    last_seen: Mapping[str, float] | None = None,
) -> CheckResult:
    """Judge a history against rules 1-9 (see the module docstring) and measure it.

    ``mode`` is the fence mode the run claims to test: ``monotonic``, ``promise``,
    ``watch`` or ``strict``; it selects whether rule 3b applies and whether rule 6's
    window lost updates are findings. For the unfenced control pass the mode being
    tested (``off`` is accepted and judged like ``monotonic``). Raises ``ValueError``
    for an unknown mode and :class:`~chaos.history.HistoryError` for a malformed
    history.

    Every rule is per resource, so a history can also be judged in parts, each part
    holding every event of its resources (:func:`chaos.history.split_history`), and
    the parts' results merged (:func:`merge`): the same verdict, one part in memory at
    a time. A part then takes the whole history's ``origin_ns`` (its first event's
    time, where the details' times count from) and ``last_seen`` (each process's last
    event's time, where a belief never ended closes).
    """
    if mode not in MODES:
        raise ValueError(f"unknown fence mode {mode!r} (expected one of {sorted(MODES)})")
    ops = pair_operations(events)
    clock = _Clock(origin_ns if origin_ns is not None else ops[0].start_ns if ops else 0)
    by_resource: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        by_resource[op.resource].append(op)
    violations: list[Violation] = []
    findings: list[Violation] = []
    for resource in sorted(by_resource):
        rops = by_resource[resource]
        known = _known_applied(rops)
        acquires = [o for o in rops if o.op == "acquire" and o.ok and o.token is not None]
        violations += _duplicate_tokens(resource, acquires)
        violations += _token_order(resource, acquires, clock)
        stale = _stale_writes(resource, rops, mode, clock, known)
        violations += stale
        late = _stale_reads(resource, rops, clock, {v.op_ids[0] for v in stale}, known)
        violations += late
        violations += _lost_writes(resource, rops, known)
        violations += _duplicate_effects(resource, rops)
        bad, window = _lost_updates(resource, rops, mode, {v.op_ids[0] for v in stale + late})
        violations += bad
        findings += window
        violations += _job_completions(resource, rops)
        violations += _periodic_slots(resource, rops)
        violations += _jobs_not_done(resource, rops)
    return CheckResult(
        mode=mode,
        violations=tuple(violations),
        stats=_measure(ops, by_resource, last_seen),
        findings=tuple(findings),
    )


def merge(mode: str, results: Iterable[CheckResult]) -> CheckResult:
    """One verdict from the results of a history's parts (see :func:`check`): every
    violation and finding, the counts summed, the takeovers put together."""
    violations: list[Violation] = []
    findings: list[Violation] = []
    ops: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    pending = writes_ok = stale = overlap_count = 0
    overlap_ms = 0.0
    takeovers: list[float] = []
    for r in results:
        violations += r.violations
        findings += r.findings
        s = r.stats
        for op, by_type in s.ops.items():
            for t, n in by_type.items():
                ops[op][t] += n
        pending += s.pending
        writes_ok += s.writes_ok
        stale += s.stale_rejected
        overlap_count += s.overlap_count
        overlap_ms += s.overlap_ms
        takeovers += s.takeover_latency_ms
    stats = Stats(
        ops={op: dict(by_type) for op, by_type in ops.items()},
        pending=pending,
        writes_ok=writes_ok,
        stale_rejected=stale,
        overlap_count=overlap_count,
        overlap_ms=overlap_ms,
        takeover_latency_ms=tuple(takeovers),
    )
    return CheckResult(
        mode=mode, violations=tuple(violations), stats=stats, findings=tuple(findings)
    )


def _writers_by_value(rops: Sequence[Operation]) -> dict[tuple[str, str], list[Operation]]:
    """(key, value) -> the writes of the resource that may have put that value there.

    ``fail`` writes certainly had no effect, so they are never a value's writer.
    """
    writers: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for o in rops:
        if o.op == "write" and o.key is not None and o.value is not None and not o.fail:
            writers[(o.key, o.value)].append(o)
    return writers


def _shown(rops: Sequence[Operation]) -> Iterator[tuple[Operation, list[Operation]]]:
    """Each ``ok`` read that returned a value, with the writes that may have written it."""
    writers = _writers_by_value(rops)
    for r in rops:
        if r.op == "read" and r.ok and r.key is not None and r.value is not None:
            ws = writers.get((r.key, r.value))
            if ws:
                yield r, ws


def _known_applied(rops: Sequence[Operation]) -> dict[str, float]:
    """Op id -> when each write of the resource is known to have taken effect.

    An ``ok`` write from its completion; any write that is the only non-``fail``
    writer of its value, from the completion of the first ``ok`` read that returned
    that value, if earlier. Writes missing from the map are never known applied: an
    ``info`` completion proves nothing, whatever its time.
    """
    known = {o.op_id: o.end_ns for o in rops if o.op == "write" and o.key is not None and o.ok}
    for r, ws in _shown(rops):
        # With two possible writers of one value (a retry), the read shows that one of
        # them landed, not which: neither is known applied by it (see _retry_floors).
        if len(ws) == 1:
            w = ws[0]
            known[w.op_id] = min(known.get(w.op_id, math.inf), r.end_ns)
    return known


def _retry_floors(rops: Sequence[Operation]) -> list[tuple[float, Operation]]:
    """(read completion, the lowest-token writer) for each read of a value several wrote.

    A read that returns a value two writes carried (a retry re-sending it) proves one
    of them landed by the read's completion, so the fence had reached the lower of
    their tokens by then, whichever it was. Rule 3a counts that as a barrier; no
    single write becomes known applied by it.
    """
    floors = []
    for r, ws in _shown(rops):
        if len(ws) > 1 and all(w.token is not None for w in ws):
            floors.append((r.end_ns, min(ws, key=lambda w: (_tok(w), w.start_ns))))
    return floors


@dataclass(frozen=True, slots=True)
class _Clock:
    """Formats harness times relative to the first invocation, for readable details."""

    t0: int

    def __call__(self, t_ns: float) -> str:
        return "+inf" if t_ns == math.inf else f"+{(t_ns - self.t0) / 1e6:.3f}ms"


def _tok(op: Operation) -> int:
    token = op.token
    assert token is not None  # callers filter on it
    return token


# -- rule 1 ------------------------------------------------------------------


def _duplicate_tokens(resource: str, acquires: Sequence[Operation]) -> list[Violation]:
    claims: dict[int, dict[str, Operation]] = defaultdict(dict)
    for a in acquires:
        rid = a.extra.get("request_id")
        # A retried acquire with one request id is one claim, whatever it was recorded as.
        claims[_tok(a)].setdefault(f"rid:{rid}" if rid is not None else a.op_id, a)
    out = []
    for token, by_claim in sorted(claims.items()):
        if len(by_claim) > 1:
            dup = sorted(by_claim.values(), key=lambda o: o.start_ns)
            who = ", ".join(f"{o.op_id} ({o.process})" for o in dup)
            out.append(
                Violation(
                    ViolationKind.DUPLICATE_TOKEN,
                    resource,
                    f"token {token} was granted to {len(dup)} acquires: {who}",
                    tuple(o.op_id for o in dup),
                )
            )
    return out


# -- rule 2 ------------------------------------------------------------------


def _token_order(resource: str, acquires: Sequence[Operation], at: _Clock) -> list[Violation]:
    by_end = sorted(acquires, key=lambda o: o.end_ns)
    best: Operation | None = None  # highest token among acquires completed so far
    i = 0
    out = []
    for b in sorted(acquires, key=lambda o: o.start_ns):
        while i < len(by_end) and by_end[i].end_ns < b.start_ns:
            if best is None or _tok(by_end[i]) > _tok(best):
                best = by_end[i]
            i += 1
        if best is not None and _tok(b) < _tok(best):
            out.append(
                Violation(
                    ViolationKind.TOKEN_ORDER,
                    resource,
                    f"acquire {b.op_id} ({b.process}) invoked at {at(b.start_ns)} got token "
                    f"{_tok(b)}, below token {_tok(best)} of acquire {best.op_id} "
                    f"({best.process}) that completed at {at(best.end_ns)}",
                    (b.op_id, best.op_id),
                )
            )
    return out


# -- rule 3 ------------------------------------------------------------------


def _stale_writes(
    resource: str, rops: Sequence[Operation], mode: str, at: _Clock, known: dict[str, float]
) -> list[Violation]:
    other_ops = {"fence"} | ({"acquire"} if mode in GRANT_FENCED_MODES else set())
    # (time from which the barrier holds, barrier): a write once known applied, the
    # lowest of a retried value's writers once a read showed that value, a promise or
    # (fenced modes) a grant once completed ok.
    retried = _retry_floors(rops)
    barriers = sorted(
        (
            [(known[o.op_id], o) for o in rops if o.op == "write" and o.op_id in known]
            + retried
            + [
                (o.end_ns, o)
                for o in rops
                if o.op in other_ops
                and o.ok
                and not (o.op == "acquire" and o.extra.get("fenced") == 0)
            ]
        ),
        key=lambda b: b[0],
    )
    barriers = [(t, o) for t, o in barriers if o.token is not None]
    floors = {(t, o.op_id) for t, o in retried}
    writes = [o for o in rops if o.op == "write" and o.ok and o.token is not None]
    best: Operation | None = None  # highest-token barrier holding before the write's start
    best_at = 0.0
    i = 0
    out = []
    for w in sorted(writes, key=lambda o: o.start_ns):
        while i < len(barriers) and barriers[i][0] < w.start_ns:
            if best is None or _tok(barriers[i][1]) > _tok(best):
                best_at, best = barriers[i]
            i += 1
        if best is not None and _tok(w) < _tok(best):
            why = (
                f" (in {mode} mode a granted token fences older ones)"
                if best.op == "acquire"
                else ""
            )
            if (best_at, best.op_id) in floors:
                when = (
                    f"or a retry of its value {best.value!r} with a token no lower was seen "
                    f"applied by a read at {at(best_at)}"
                )
            elif best_at == best.end_ns:
                when = f"completed at {at(best_at)}"
            else:
                when = f"was seen applied by a read at {at(best_at)}"
            out.append(
                Violation(
                    ViolationKind.STALE_WRITE_ACCEPTED,
                    resource,
                    f"write {w.op_id} ({w.process}) with token {_tok(w)} invoked at "
                    f"{at(w.start_ns)} was accepted after {best.op} {best.op_id} "
                    f"({best.process}, {best.type}) with token {_tok(best)} {when}{why}",
                    (w.op_id, best.op_id),
                )
            )
    return out


def _stale_reads(
    resource: str,
    rops: Sequence[Operation],
    at: _Clock,
    flagged: set[str],
    known: dict[str, float],
) -> list[Violation]:
    """Rule 3c: a read saw a value written below the token of a write completed before it.

    ``flagged``: writes rule 3a already reported; a read seeing one adds nothing.
    """
    writes = [o for o in rops if o.op == "write" and o.key is not None and o.token is not None]
    if not writes:
        return []
    suspects = _maybe_deduplicated(writes)
    sources = _writers_by_value(writes)
    # Per key: writes that certainly applied themselves, by the time they were known
    # applied, with a running "highest token so far" to answer "best write known
    # applied before t" by bisection.
    ends: dict[str, list[float]] = {}
    best_so_far: dict[str, list[Operation]] = {}
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for w in writes:
        if w.op_id in known and w.op_id not in suspects:
            by_key[w.key or ""].append(w)
    for key, kw in by_key.items():
        kw.sort(key=lambda o: known[o.op_id])
        ends[key] = [known[o.op_id] for o in kw]
        running: list[Operation] = []
        for o in kw:
            running.append(o if not running or _tok(o) > _tok(running[-1]) else running[-1])
        best_so_far[key] = running
    out = []
    reported = set(flagged)  # one violation per late write, however many reads saw it
    for r in sorted(rops, key=lambda o: o.start_ns):
        if r.op != "read" or not r.ok or r.value is None or r.key is None:
            continue
        candidates = sources.get((r.key, r.value))
        if not candidates or r.key not in ends:
            continue
        i = bisect.bisect_left(ends[r.key], r.start_ns)
        if i == 0:
            continue
        best = best_so_far[r.key][i - 1]
        if all(
            _tok(s) < _tok(best) and not known.get(s.op_id, math.inf) < best.start_ns
            for s in candidates
        ):
            src = max(candidates, key=lambda o: o.start_ns)
            if src.op_id in reported:
                continue
            reported.add(src.op_id)
            out.append(
                Violation(
                    ViolationKind.STALE_WRITE_ACCEPTED,
                    resource,
                    f"read {r.op_id} ({r.process}) invoked at {at(r.start_ns)} saw {r.key!r} "
                    f"= {r.value!r} from write {src.op_id} ({src.process}, {src.type}) with "
                    f"token {_tok(src)}, which therefore landed after write {best.op_id} "
                    f"({best.process}, {best.type}) with token {_tok(best)} known applied "
                    f"at {at(known[best.op_id])}",
                    (src.op_id, r.op_id, best.op_id),
                )
            )
    return out


# -- rule 4 ------------------------------------------------------------------


def _final_reads(rops: Sequence[Operation]) -> list[Operation]:
    return [o for o in rops if o.op == "read" and o.ok and o.extra.get("final") == 1]


def _maybe_deduplicated(writes: Sequence[Operation]) -> set[str]:
    """Op ids of writes that may have been no-ops because their idempotency key was used."""
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for w in writes:
        if w.idempotency_key is not None and not w.fail:
            by_key[w.idempotency_key].append(w)
    suspects: set[str] = set()
    for group in by_key.values():
        if len(group) < 2:
            continue
        first = min(o.start_ns for o in group)
        tied = sum(1 for o in group if o.start_ns == first) > 1
        # Only the unique earliest invocation certainly was not deduplicated.
        suspects.update(o.op_id for o in group if tied or o.start_ns > first)
    return suspects


def _lost_writes(
    resource: str, rops: Sequence[Operation], known: dict[str, float]
) -> list[Violation]:
    reads = _final_reads(rops)
    if not reads:
        return []
    writes = [o for o in rops if o.op == "write" and o.key is not None]
    suspects = _maybe_deduplicated(writes)
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for w in writes:
        by_key[w.key or ""].append(w)
    out = []
    for r in reads:
        key = r.key or ""
        kw = by_key.get(key, [])
        acked = [w for w in kw if w.ok]
        followers = [w for w in acked if w.op_id not in suspects]
        # The ok write invoked last: anything that completed before it was overwritten.
        last = max(followers, key=lambda w: w.start_ns, default=None)
        value = r.value
        if value is None:
            if acked:
                newest = sorted(acked, key=lambda w: w.end_ns)[-3:]
                out.append(
                    Violation(
                        ViolationKind.LOST_WRITE,
                        resource,
                        f"final read {r.op_id} found no value for key {key!r} although "
                        f"{len(acked)} ok write(s) of it were acknowledged",
                        (r.op_id, *(w.op_id for w in reversed(newest))),
                    )
                )
            continue
        sources = [w for w in kw if w.value == value and not w.fail]
        if not sources:
            rejected = [w for w in kw if w.value == value]
            why = (
                f"; only rejected write {rejected[0].op_id} ({rejected[0].error}) carried it"
                if rejected
                else ""
            )
            out.append(
                Violation(
                    ViolationKind.LOST_WRITE,
                    resource,
                    f"final read {r.op_id} of key {key!r} found {value!r}, which no ok or "
                    f"info write of that key wrote{why}",
                    (r.op_id, *(w.op_id for w in rejected[:1])),
                )
            )
            continue
        if last is not None and all(last.start_ns > known.get(w.op_id, math.inf) for w in sources):
            src = max(sources, key=lambda w: w.end_ns)
            out.append(
                Violation(
                    ViolationKind.LOST_WRITE,
                    resource,
                    f"final read {r.op_id} of key {key!r} found {value!r} from write "
                    f"{src.op_id}, but ok write {last.op_id} ({last.process}, token "
                    f"{last.token}) was invoked after that write was known applied: its "
                    f"acknowledged value {last.value!r} was lost",
                    (r.op_id, last.op_id, src.op_id),
                )
            )
    return out


# -- rule 5 ------------------------------------------------------------------


def _duplicate_effects(resource: str, rops: Sequence[Operation]) -> list[Violation]:
    out = []
    for r in _final_reads(rops):
        if r.value is None or not (r.key or "").startswith(EFFECT_PREFIX):
            continue
        seen = Counter(item.strip() for item in r.value.split(",") if item.strip())
        dups = sorted(k for k, n in seen.items() if n > 1)
        if not dups:
            continue
        culprits = [
            o.op_id for o in rops if o.op == "write" and o.idempotency_key in dups and not o.fail
        ]
        listed = ", ".join(f"{k!r} x{seen[k]}" for k in dups)
        out.append(
            Violation(
                ViolationKind.DUPLICATE_EFFECT,
                resource,
                f"final read {r.op_id} of {r.key!r} shows idempotency key(s) applied more "
                f"than once: {listed}",
                (r.op_id, *culprits),
            )
        )
    return out


# -- rule 7 ------------------------------------------------------------------


def _job_completions(resource: str, rops: Sequence[Operation]) -> list[Violation]:
    claims = [o for o in rops if o.op == "acquire" and o.ok and "job" in o.extra]
    done = [o for o in rops if o.op == "release" and o.ok and "job" in o.extra]
    out: list[Violation] = []
    for first, again in itertools.pairwise(done):
        out.append(
            Violation(
                ViolationKind.JOB_DONE_TWICE,
                resource,
                f"job {again.extra['job']!r} completed again by {again.op_id} "
                f"({again.process}, token {again.token}) after {first.op_id} "
                f"({first.process}, token {first.token}) had completed it",
                (again.op_id, first.op_id),
            )
        )
    for d in done:
        t = _tok(d)
        newer = [c for c in claims if c.end_ns < d.start_ns and _tok(c) > t]
        if newer:
            c = max(newer, key=_tok)
            out.append(
                Violation(
                    ViolationKind.JOB_DONE_TWICE,
                    resource,
                    f"job {d.extra['job']!r} completed by {d.op_id} ({d.process}) with "
                    f"stale token {t}: claim {c.op_id} ({c.process}) held token "
                    f"{_tok(c)} before that completion was invoked",
                    (d.op_id, c.op_id),
                )
            )
    return out


# -- rule 9 ------------------------------------------------------------------


def _jobs_not_done(resource: str, rops: Sequence[Operation]) -> list[Violation]:
    done = [o for o in rops if o.op == "release" and o.ok and "job" in o.extra]
    out: list[Violation] = []
    for listed in (o for o in rops if o.op == "job" and o.ok):
        state = listed.value
        if state == "succeeded":
            continue
        attempts, most = listed.extra.get("attempts"), listed.extra.get("max_attempts")
        used_up = isinstance(attempts, int) and isinstance(most, int) and attempts >= most
        if done:
            detail = (
                f"job {listed.extra['job']!r} is {state!r} at the end, but its completion "
                f"{done[0].op_id} ({done[0].process}, token {done[0].token}) was acknowledged"
            )
        elif state == "dead" and used_up:
            continue
        else:
            detail = (
                f"job {listed.extra['job']!r} is {state!r} at the end (attempts "
                f"{attempts} of {most}): never done"
            )
        out.append(
            Violation(
                ViolationKind.JOB_NOT_DONE,
                resource,
                detail,
                (listed.op_id, *(d.op_id for d in done[:1])),
            )
        )
    return out


# -- rule 8 ------------------------------------------------------------------


def _periodic_slots(resource: str, rops: Sequence[Operation]) -> list[Violation]:
    listed = [o for o in rops if o.op == "periodic" and o.ok and o.value is not None]
    if not listed:
        return []
    every = int(listed[0].extra["every_ms"])
    by_period: dict[int, list[Operation]] = defaultdict(list)
    for o in listed:
        by_period[int(o.value or 0)].append(o)
    out: list[Violation] = []
    for period, jobs in sorted(by_period.items()):
        if len(jobs) > 1:
            out.append(
                Violation(
                    ViolationKind.PERIODIC_SLOT,
                    resource,
                    f"period {period} has {len(jobs)} jobs: "
                    + ", ".join(str(o.extra.get("job")) for o in jobs),
                    tuple(o.op_id for o in jobs),
                )
            )
    first, last = min(by_period), max(by_period)
    missed = [p for p in range(first, last + 1, every) if p not in by_period]
    if missed:
        shown = ", ".join(str(p) for p in missed[:5]) + (" ..." if len(missed) > 5 else "")
        out.append(
            Violation(
                ViolationKind.PERIODIC_SLOT,
                resource,
                f"{len(missed)} period(s) between {first} and {last} have no job: {shown}",
                (),
            )
        )
    off_grid = [p for p in by_period if (p - first) % every]
    if off_grid:
        out.append(
            Violation(
                ViolationKind.PERIODIC_SLOT,
                resource,
                f"period(s) off the schedule's {every} ms grid: "
                + ", ".join(str(p) for p in sorted(off_grid)[:5]),
                tuple(o.op_id for p in off_grid for o in by_period[p]),
            )
        )
    return out


# -- rule 6 ------------------------------------------------------------------


def parse_increments(value: str | None) -> tuple[int, list[str]] | None:
    """``"N#id1,...,idN"`` -> ``(N, [id1, ..., idN])``; ``None`` (not found) -> ``(0, [])``.

    Returns ``None`` for a value that is not in that form. The lock-counter workload
    writes these values (see rule 6 in the module docstring).
    """
    if value is None:
        return 0, []
    head, sep, tail = value.partition("#")
    if not sep or not head.isdigit():
        return None
    return int(head), [x for x in tail.split(",") if x]


def _lost_updates(
    resource: str, rops: Sequence[Operation], mode: str, stale: set[str]
) -> tuple[list[Violation], list[Violation]]:
    """Rule 6: (violations, findings) of the increments the final reads show.

    ``stale``: writes rule 3 flagged; an increment lost because it was itself a
    stale write is no window, whatever replaced it.
    """
    incs: dict[str, dict[str, Operation]] = defaultdict(dict)  # key -> increment id -> write
    for o in rops:
        inc = o.extra.get("increment") if o.op == "write" else None
        if isinstance(inc, str) and o.key is not None:
            # A re-sent increment (its outbox) keeps its id. One acknowledged attempt
            # means it landed; else one of unknown outcome means it may have (a refused
            # replay says nothing of an earlier attempt: the token is judged before the
            # key, G6); only when every attempt was refused did it certainly not land.
            prev = incs[o.key].get(inc)
            if prev is None or _certainty(o) > _certainty(prev):
                incs[o.key][inc] = o
    bad: list[Violation] = []
    window: list[Violation] = []
    for r in _final_reads(rops):
        key = r.key or ""
        by_id = incs.get(key)
        if not by_id:
            continue
        parsed = parse_increments(r.value)
        if parsed is None:
            continue  # not an increment list: rule 4 judges where it came from
        count, listed = parsed
        final = set(listed)
        if count != len(listed) or len(final) != len(listed):
            bad.append(
                Violation(
                    ViolationKind.LOST_UPDATE,
                    resource,
                    f"final read {r.op_id} of {key!r} says {count} increments but lists "
                    f"{len(listed)} ({len(final)} distinct)",
                    (r.op_id,),
                )
            )
        for inc, w in sorted(by_id.items(), key=lambda kv: kv[1].start_ns):
            if w.fail and inc in final:
                bad.append(
                    Violation(
                        ViolationKind.REJECTED_WRITE_LANDED,
                        resource,
                        f"final read {r.op_id} of {key!r} lists increment {inc!r} of write "
                        f"{w.op_id} ({w.process}, token {w.token}), which the guard "
                        f"rejected ({w.error})",
                        (w.op_id, r.op_id),
                    )
                )
            elif w.ok and inc not in final:
                v, in_window = _lost_increment(resource, key, r, w, listed, by_id, mode)
                in_window = in_window and w.op_id not in stale
                (window if in_window else bad).append(v)
    return bad, window


def _certainty(o: Operation) -> int:
    """Which attempt of an increment decides rule 6: ok, then unknown, then refused."""
    return 2 if o.ok else 0 if o.fail else 1


def _lost_increment(
    resource: str,
    key: str,
    final_read: Operation,
    lost: Operation,
    listed: list[str],
    by_id: dict[str, Operation],
    mode: str,
) -> tuple[Violation, bool]:
    """The violation (or finding) for ok increment ``lost`` missing from ``listed``."""
    parsed = parse_increments(lost.value)
    mine = parsed[1] if parsed is not None else []
    shared = 0
    for a, b in zip(mine, listed, strict=False):
        if a != b:
            break
        shared += 1
    # The increment that took the place of ``lost`` (or of the branch it built on).
    winner = by_id.get(listed[shared]) if shared < len(listed) else None
    in_window = (
        mode in WINDOW_MODES
        and winner is not None
        and winner.token is not None
        and lost.token is not None
        and winner.token > lost.token
    )
    if winner is not None:
        why = (
            f"increment {listed[shared]!r} of write {winner.op_id} ({winner.process}, "
            f"{winner.type}, token {winner.token}) took its place"
        )
    else:
        why = f"the final list has only {len(listed)} of its {len(mine) - 1} predecessors"
    note = (
        f" (the {mode} mode's documented window: a newer holder read before this write "
        "landed and wrote over it)"
        if in_window
        else ""
    )
    v = Violation(
        ViolationKind.LOST_UPDATE,
        resource,
        f"acknowledged increment of write {lost.op_id} ({lost.process}, token {lost.token}) "
        f"is missing from final read {final_read.op_id} of {key!r}: {why}{note}",
        (lost.op_id, final_read.op_id, *((winner.op_id,) if winner is not None else ())),
    )
    return v, in_window


# -- measurements -------------------------------------------------------------


def _measure(
    ops: Sequence[Operation],
    by_resource: dict[str, list[Operation]],
    whole_last_seen: Mapping[str, float] | None,
) -> Stats:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    last_seen: dict[str, float] = defaultdict(lambda: -math.inf)
    for o in ops:
        counts[o.op][o.type] += 1
        seen = o.start_ns if o.pending else o.end_ns
        last_seen[o.process] = max(last_seen[o.process], seen)
    for process, seen in (whole_last_seen or {}).items():
        last_seen[process] = max(last_seen[process], seen)
    overlap_count, overlap_ns = 0, 0.0
    latencies: list[float] = []
    for rops in by_resource.values():
        n, ns = _overlap(rops, last_seen)
        overlap_count += n
        overlap_ns += ns
        latencies += _takeovers(rops)
    return Stats(
        ops={op: dict(by_type) for op, by_type in counts.items()},
        pending=sum(1 for o in ops if o.pending),
        writes_ok=sum(1 for o in ops if o.op == "write" and o.ok),
        stale_rejected=sum(
            1 for o in ops if o.op in ("write", "fence") and o.fail and o.error == "STALE_TOKEN"
        ),
        overlap_count=overlap_count,
        overlap_ms=overlap_ns / 1e6,
        takeover_latency_ms=tuple(latencies),
    )


def _belief_markers(o: Operation) -> list[tuple[float, int]]:
    """(time, +1 start / -1 end) points where the process starts or stops believing it holds."""
    marks: list[tuple[float, int]] = []
    if o.op == "acquire" and o.ok:
        marks.append((o.end_ns, +1))
    if o.op == "release":
        marks.append((o.start_ns, -1))
    if o.op == "renew" and o.fail and o.error == "LEASE_LOST":
        marks.append((o.end_ns, -1))
    if o.invoke.extra.get("lost") == 1:
        marks.append((o.start_ns, -1))
    elif o.completion is not None and o.completion.extra.get("lost") == 1:
        marks.append((o.end_ns, -1))
    return marks


def _overlap(rops: Sequence[Operation], last_seen: dict[str, float]) -> tuple[int, float]:
    per_process: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for o in rops:
        per_process[o.process] += _belief_markers(o)
    edges: list[tuple[float, int]] = []
    for process, marks in per_process.items():
        since: float | None = None
        # Ends sort before starts at equal times: release-then-reacquire is no overlap.
        for t, kind in sorted(marks):
            if kind > 0 and since is None:
                since = t
            elif kind < 0 and since is not None:
                if t > since:
                    edges += [(since, +1), (t, -1)]
                since = None
        if since is not None and last_seen[process] > since:
            edges += [(since, +1), (last_seen[process], -1)]
    count, believers, opened, total = 0, 0, 0.0, 0.0
    for t, delta in sorted(edges):
        believers += delta
        if delta > 0 and believers == 2:
            count, opened = count + 1, t
        elif delta < 0 and believers == 1:
            total += t - opened
    return count, total


def _takeovers(rops: Sequence[Operation]) -> list[float]:
    acquires: dict[int, Operation] = {}
    released: dict[int, float] = {}
    expires: dict[int, float] = {}
    for o in rops:
        token = o.token
        if token is None or not o.ok:
            continue
        if o.op == "acquire":
            acquires.setdefault(token, o)
        if o.op == "release":
            released[token] = min(released.get(token, math.inf), o.end_ns)
        ttl = o.extra.get("ttl_ms")
        if o.op in ("acquire", "renew") and isinstance(ttl, int):
            # The server starts the ttl after the request was sent, so invoke + ttl is
            # the earliest the lease can expire: takeover latency is then never negative.
            expires[token] = max(expires.get(token, -math.inf), o.start_ns + ttl * 1_000_000)
    out = []
    ordered = [acquires[t] for t in sorted(acquires)]
    for prev, nxt in itertools.pairwise(ordered):
        ends = [t for t in (released.get(_tok(prev)), expires.get(_tok(prev))) if t is not None]
        if ends and min(ends) <= nxt.end_ns:
            out.append((nxt.end_ns - min(ends)) / 1e6)
    return out


__all__ = [
    "EFFECT_PREFIX",
    "GRANT_FENCED_MODES",
    "MODES",
    "WINDOW_MODES",
    "CheckResult",
    "Stats",
    "Violation",
    "ViolationKind",
    "check",
    "merge",
    "parse_increments",
]
