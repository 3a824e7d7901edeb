"""The job rules, pure: what enqueue, claim, heartbeat, complete, fail, release and the
reaper do to one job record, and when a failed job is due again.

States of the classic SKIP LOCKED job queue, plus ``waiting`` for ordering keys::

    waiting --(the earlier job of its ordering key finished)--> ready
    ready   --claim--> running                  attempts + 1, a fresh token, a lease
    running --claim, lease expired, attempts left--> running   (rescue: a fresh token)
    running --complete--> succeeded
    running --fail, attempts left--> ready      due after the backoff
    running --fail, last attempt (or final)--> dead
    running --release--> ready                  due now; the attempt does not count
    running --reaper, lease expired, no attempts left--> dead
    waiting, ready, running --cancel (an operator)--> cancelled
    dead, cancelled, ready --retry (an operator)--> ready      due now; attempts kept
    succeeded, dead, cancelled --reaper, older than the retention--> deleted

**Admin** (:func:`cancel`, :func:`retry`): a cancel of a running job fences its claim
as a rescue does: it takes a fresh token (the caller draws it from the same counter),
so the worker's next call is stale, the event log gets EXPIRED of the claim (a watch
guard fences past it), a strict guard no longer finds a live claim, and a monotonic
guard can be fenced to the new token. A retry keeps the attempts used (the history
stays true, as River's JobRetry and Oban's retry_job keep it) and, when they are
exhausted, allows one more (``max_attempts = attempts + 1``). Cancelled jobs are kept
as long as dead ones.

The **token** of a claim comes from one counter per queue backend that only grows
(the backend passes it in), so every claim of a job gets a token larger than every
earlier claim of it: the guard sees a job's tokens in order. A job that names its own
``resource`` (one leases may name too) is different: its claim holds the lease on that
resource, and its token is that lease's, from the resource's one counter
(:mod:`lease_server.queue.resources`). The backend's claim gives it a provisional
token, never handed out, which :func:`retoken` replaces with the lease's (or
:func:`release` gives the job back when the lease is held); its events are the
lease's, so :func:`transitions` logs none of its own. A call after Claim must
present the job's current token; any other gets :class:`~fencing.errors.LeaseLost`
and changes nothing. An expired lease that nobody rescued yet is still current: the
rescue is what bumps the token and fences the old worker (as the guard does: the
old token is good until a newer one is seen). Repeating a call that already took
effect with the same token (a retry after a lost reply) is a no-op, not an error.

**A retried Claim** (its reply was lost) carries the request id of the first: every
claim stores the id of the Claim that made it, and a Claim whose id and worker find
claims still running under them gets those jobs again (:func:`replay`: same token,
same attempt, the lease extended) instead of new ones, so a lost reply never burns an
attempt, as a retried Acquire gets its lease back.

**Ordering keys**: at most one job per (queue, ordering key) is ready or running,
the earliest enqueued live one (its *head*); the others wait. Only the head can be
claimed, so jobs of a key run one at a time in enqueue order, with no fixed shard
count. When the head finishes (succeeded or dead) the next one becomes ready. A dead
job does not block its key.

**Events**: every change of a claim is also an event of the lease server's event log
(:func:`transitions`), appended in the same transaction as the change when the queue
shares a log with the lease backend, so a guard in ``watch`` mode fences a job's
resource at its rescue exactly as at a lease takeover: a claim or a rescue is ACQUIRED
(a rescue first EXPIRED of the claim it replaces), Complete, Fail and Release are
RELEASED, and the reaper's verdict is EXPIRED. Heartbeats are not logged (a watch
guard has nothing to learn from them), nor are replays.

Backends that run Python inside their transaction (memory, SQLite) call these
functions on the rows they locked; PostgreSQL implements the same rules in SQL for
the hot paths, and the contract suite holds all of them to it. Times are
milliseconds on the backend's clock; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from fencing import limits
from fencing._backoff import Backoff
from fencing.errors import LeaseLost
from lease_server.leases import Transition, TransitionKind

#: The default retry backoff of failed jobs, in milliseconds: 1 s, 2 s, 4 s ... 5 min.
DEFAULT_RETRY_BACKOFF = Backoff(base=1000, cap=300_000, factor=2.0, jitter=0.2)
#: last_error of a job rescued after its worker's lease expired.
EXPIRED_ERROR = "lease expired: attempt {attempt} by {owner} did not finish"
EXPIRED_PREFIX = "lease expired: attempt"
#: last_error of a job the reaper declared dead.
REAPED_ERROR = "lease expired after the final attempt"


class JobState(StrEnum):
    WAITING = "waiting"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Listed, never stored: a ready job not yet due (delayed, scheduled for later, or
    #: waiting out a retry's backoff), as River and Oban list it. It is stored as ready,
    #: and claimed by the ready rule once due (:func:`listed`).
    SCHEDULED = "scheduled"


LIVE_STATES = (JobState.WAITING, JobState.READY, JobState.RUNNING)
FINISHED_STATES = (JobState.SUCCEEDED, JobState.DEAD)
#: States a cancel applies to, and states a retry applies to.
CANCELLABLE_STATES = LIVE_STATES
RETRYABLE_STATES = (JobState.DEAD, JobState.CANCELLED, JobState.READY)
#: last_error of a cancelled job when the operator gave no reason.
CANCELLED_ERROR = "cancelled"


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue, validated. ``run_at_ms`` (> 0) wins over ``delay_ms``."""

    payload: bytes
    idempotency_key: str = ""
    max_attempts: int = limits.DEFAULT_MAX_ATTEMPTS
    delay_ms: int = 0
    run_at_ms: int = 0
    ordering_key: str = ""
    priority: int = 0
    resource: str = ""

    def due_at(self, now_ms: int) -> int:
        return self.run_at_ms if self.run_at_ms > 0 else now_ms + self.delay_ms


@dataclass(frozen=True, slots=True)
class JobRef:
    """A claimed job as a worker names it: id and the claim's token."""

    id: int
    token: int


@dataclass(frozen=True, slots=True)
class JobRecord:
    """Everything stored for one job."""

    id: int
    queue: str
    payload: bytes
    state: JobState
    resource: str = ""
    ordering_key: str = ""
    idempotency_key: str = ""
    priority: int = 0
    attempts: int = 0
    max_attempts: int = limits.DEFAULT_MAX_ATTEMPTS
    token: int = 0
    available_at_ms: int = 0
    #: The worker of the current claim, or of the last one once the job completed,
    #: failed, died or was cancelled (who ran it); "" when never claimed, or given back
    #: (a release, an operator's retry) to wait for the next claim.
    lease_owner: str = ""
    lease_until_ms: int = 0
    last_error: str = ""
    created_at_ms: int = 0
    finished_at_ms: int = 0
    #: When the current (or last) claim was made (0: never claimed).
    claimed_at_ms: int = 0

    @property
    def fenced_resource(self) -> str:
        """The guard resource this job's tokens fence."""
        return self.resource or default_resource(self.queue, self.id)

    def expired(self, now_ms: int) -> bool:
        """Running, and the lease ran out at ``now_ms`` (nobody rescued it yet)."""
        return self.state is JobState.RUNNING and self.lease_until_ms <= now_ms

    def lost(self, token: int) -> LeaseLost:
        return LeaseLost(
            f"job {self.id} of {self.queue!r}: token {token} is not its current claim",
            resource=self.fenced_resource,
            token=token,
        )


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The outcome of enqueuing one job: the job, and whether it is new."""

    id: int
    created: bool
    state: JobState


@dataclass(frozen=True, slots=True)
class Failed:
    """The outcome of Fail: the job's new state and, when ready, the delay before it is due."""

    state: JobState
    retry_in_ms: int = 0


@dataclass(frozen=True, slots=True)
class Administered:
    """The outcome of an operator's call on one job: the job after it, whether it
    changed, and (a cancel of a running job) the token that fenced the claim."""

    record: JobRecord
    changed: bool
    fence_token: int = 0


def administered(old: JobRecord, new: JobRecord | None) -> Administered:
    """What :func:`cancel` or :func:`retry` turning ``old`` into ``new`` (None: not
    applicable) amounts to."""
    if new is None:
        return Administered(old, False)
    fenced = old.state is JobState.RUNNING and new.token != old.token
    return Administered(new, True, new.token if fenced else 0)


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """Stats of one queue (see the proto's ``QueueStats``)."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    waiting: int = 0
    running: int = 0
    expired: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_ready_age_ms: int = 0
    retrying: int = 0
    finished_in_window: int = 0
    attempts_in_window: int = 0
    window_ms: int = limits.DEFAULT_WINDOW_MS

    @property
    def retry_rate(self) -> float:
        """Of the attempts of jobs finished in the window, the share that were retries."""
        if self.attempts_in_window <= 0:
            return 0.0
        retries = self.attempts_in_window - self.finished_in_window
        return max(0.0, retries / self.attempts_in_window)


class AttemptOutcome(StrEnum):
    """How one attempt (one claim) of a job ended, named as the job's states and events
    name it; ``running`` while it has not."""

    RUNNING = "running"
    #: Complete.
    SUCCEEDED = "succeeded"
    #: Fail (the job is ready again after its backoff, or dead).
    FAILED = "failed"
    #: Its lease ran out: a rescue took the job over (:data:`EXPIRED_ERROR`), or the
    #: reaper declared it dead (:data:`REAPED_ERROR`).
    EXPIRED = "expired"
    #: Release (or the server gave it back): the attempt did not count, so the next
    #: claim has the same attempt number.
    RELEASED = "released"
    #: An operator's cancel (the error is the reason).
    CANCELLED = "cancelled"


#: Outcomes whose attempt keeps the job's error (the others end without one).
_OUTCOMES_WITH_ERROR = (AttemptOutcome.FAILED, AttemptOutcome.EXPIRED, AttemptOutcome.CANCELLED)


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One attempt of a job: a claim, from its start to its end (see the proto's
    ``JobAttempt``). Times are ms on the backend's clock; ``ended_at_ms`` is 0 while it
    runs. ``error`` is at most :data:`fencing.limits.MAX_ERROR_BYTES` of UTF-8."""

    attempt: int
    started_at_ms: int
    worker: str
    token: int
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    ended_at_ms: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class AttemptChanges:
    """What changing a job's record does to its attempts (:func:`attempt_changes`).

    ``current``: the job's running attempt as it is now (ended, or still running with a
    new token): it replaces the job's running attempt, or is added when the history has
    none (a claim made before the history was kept). ``started``: a new attempt, added
    after it. A backend that adds one then keeps only the newest
    :data:`fencing.limits.MAX_JOB_ATTEMPTS_KEPT` attempts of the job (:func:`kept`).
    """

    current: JobAttempt | None = None
    started: JobAttempt | None = None

    def __bool__(self) -> bool:
        return self.current is not None or self.started is not None


def attempt_changes(old: JobRecord | None, new: JobRecord, now_ms: int) -> AttemptChanges:
    """The rule of the attempts' history, for every backend (PostgreSQL's trigger on
    ``jobs``, ``0026_job_attempts.sql``, applies the same):

    - a claim (the job runs with more attempts than it had: a claim, or a rescue) starts
      an attempt: its number, the claim's time, worker and token;
    - the claim that was running ends when the job no longer runs or a rescue took it
      over: ``expired`` (a rescue, the reaper), ``released`` (the attempt did not count),
      ``cancelled``, ``failed``, ``succeeded``; it keeps the job's error when it ended
      with one (:data:`fencing.limits.MAX_ERROR_BYTES` at most);
    - a running job that only changed its token (a job naming its own resource took its
      lease's token) keeps running with that token;
    - anything else (enqueue, heartbeat, replay, promotion, retry) changes no attempt.
    """
    if old is None or old == new:
        return AttemptChanges()
    running = old.state is JobState.RUNNING
    rescued = new.state is JobState.RUNNING and new.attempts > old.attempts
    current = None
    if running and (rescued or new.state is not JobState.RUNNING):
        outcome = _outcome(old, new, rescued)
        error = limits.truncate_error(new.last_error) if outcome in _OUTCOMES_WITH_ERROR else ""
        current = JobAttempt(
            attempt=old.attempts,
            started_at_ms=old.claimed_at_ms,
            worker=old.lease_owner,
            token=old.token,
            outcome=outcome,
            ended_at_ms=now_ms,
            error=error,
        )
    elif running and new.state is JobState.RUNNING and new.token != old.token:
        current = JobAttempt(old.attempts, old.claimed_at_ms, old.lease_owner, new.token)
    started = None
    if rescued or (not running and new.state is JobState.RUNNING):
        started = JobAttempt(new.attempts, new.claimed_at_ms, new.lease_owner, new.token)
    return AttemptChanges(current, started)


def _outcome(old: JobRecord, new: JobRecord, rescued: bool) -> AttemptOutcome:
    if rescued or (new.state is JobState.DEAD and new.last_error == REAPED_ERROR):
        return AttemptOutcome.EXPIRED
    if new.state is JobState.SUCCEEDED:
        return AttemptOutcome.SUCCEEDED
    if new.state is JobState.CANCELLED:
        return AttemptOutcome.CANCELLED
    if new.state is JobState.READY and new.attempts < old.attempts:
        return AttemptOutcome.RELEASED
    return AttemptOutcome.FAILED


def apply_attempts(history: list[JobAttempt], changes: AttemptChanges) -> list[JobAttempt]:
    """``history`` (oldest first) with ``changes`` applied, as every backend stores it:
    the running attempt replaced by ``current`` (or ``current`` added when none runs),
    ``started`` added, then only the newest :data:`~fencing.limits.MAX_JOB_ATTEMPTS_KEPT`
    kept (:func:`kept`)."""
    out = list(history)
    if changes.current is not None:
        if out and out[-1].outcome is AttemptOutcome.RUNNING:
            out[-1] = changes.current
        else:
            out.append(changes.current)
    if changes.started is not None:
        out.append(changes.started)
    return kept(out)


def kept(history: list[JobAttempt]) -> list[JobAttempt]:
    """The attempts of a job that stay (oldest first): the newest
    :data:`~fencing.limits.MAX_JOB_ATTEMPTS_KEPT`."""
    return history[-limits.MAX_JOB_ATTEMPTS_KEPT :]


def default_resource(queue: str, job_id: int) -> str:
    return f"job/{queue}/{job_id}"


def parse_default_resource(resource: str) -> tuple[str, int] | None:
    """(queue, job id) of a resource named as :func:`default_resource` names it, or None."""
    if not resource.startswith("job/"):
        return None
    queue, _, job_id = resource[4:].rpartition("/")
    if not queue or not job_id.isdigit():
        return None
    return queue, int(job_id)


# -- transitions ------------------------------------------------------------------------------


def new_job(job_id: int, queue: str, spec: NewJob, blocked: bool, now_ms: int) -> JobRecord:
    """The record of a freshly enqueued job; ``blocked`` if its ordering key has a live job."""
    return JobRecord(
        id=job_id,
        queue=queue,
        payload=spec.payload,
        state=JobState.WAITING if blocked else JobState.READY,
        resource=spec.resource,
        ordering_key=spec.ordering_key,
        idempotency_key=spec.idempotency_key,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        available_at_ms=spec.due_at(now_ms),
        created_at_ms=now_ms,
    )


def claimable(record: JobRecord, now_ms: int) -> bool:
    """Ready and due, or running with an expired lease and attempts left (a rescue)."""
    if record.state is JobState.READY:
        return record.available_at_ms <= now_ms
    return record.expired(now_ms) and record.attempts < record.max_attempts


def claim_order(record: JobRecord) -> tuple[int, int, int, int]:
    """Sort key among claimable jobs: rescues first, then priority, due time, enqueue order."""
    if record.state is JobState.RUNNING:
        return (0, 0, record.lease_until_ms, record.id)
    return (1, -record.priority, record.available_at_ms, record.id)


def claim(record: JobRecord, worker: str, ttl_ms: int, token: int, now_ms: int) -> JobRecord:
    """Give the job to ``worker`` with ``token`` (> every earlier token) until now + ttl."""
    if not claimable(record, now_ms):
        raise ValueError(f"job {record.id} is not claimable")  # a backend bug, never a user error
    _check_fresh(record, token)
    last_error = record.last_error
    if record.state is JobState.RUNNING:
        last_error = EXPIRED_ERROR.format(attempt=record.attempts, owner=record.lease_owner)
    return replace(
        record,
        state=JobState.RUNNING,
        attempts=record.attempts + 1,
        token=token,
        lease_owner=worker,
        lease_until_ms=now_ms + ttl_ms,
        last_error=last_error,
        claimed_at_ms=now_ms,
    )


def replays(record: JobRecord, worker: str) -> bool:
    """Whether ``record``, found under the request id of a retried Claim from ``worker``,
    is that claim's job still: running under it (the claim was not ended nor rescued:
    a rescue, complete, fail, release or cancel takes the job from it). The backend
    finds the job by the request id its claim stored; this is the rest of the rule."""
    return record.state is JobState.RUNNING and record.lease_owner == worker


def replay(record: JobRecord, ttl_ms: int, now_ms: int) -> JobRecord:
    """The claim ``record`` given again to a retried Claim whose reply was lost: the same
    token and attempt, its lease extended to now + ttl as a heartbeat would (the claim is
    still current even if its lease expired: only a rescue ends it). No event is logged,
    as for a heartbeat."""
    if record.state is not JobState.RUNNING:
        raise ValueError(f"job {record.id} is not running")  # a backend bug, never a user error
    return replace(record, lease_until_ms=now_ms + ttl_ms)


def _check_fresh(record: JobRecord, token: int) -> None:
    """A token from the claims' counter must exceed the job's; a job naming its own
    resource has tokens of that resource's lease counter, which the claims' counter
    does not pass (its provisional tokens are replaced, never handed out)."""
    if not record.resource and token <= record.token:
        raise ValueError(f"token {token} does not exceed job {record.id}'s token {record.token}")


def retoken(record: JobRecord | None, ref: JobRef, token: int) -> JobRecord:
    """The claim ``ref`` (current, of a job naming its own resource) with ``token``, the
    lease on that resource its claim took; ``LeaseLost`` if ``ref`` is not current.
    A repeat changes nothing."""
    if record is not None and record.state is JobState.RUNNING and record.token == token:
        return record
    current = require_current(record, ref)
    if not current.resource:
        raise ValueError(f"job {current.id} names no resource of its own")
    return replace(current, token=token)


def _named(record: JobRecord | None, ref: JobRef, queue: str) -> JobRecord | None:
    """The record, unless it does not exist or is not in ``queue`` (when one is named)."""
    if record is None or (queue and record.queue != queue):
        return None
    return record


def require_current(record: JobRecord | None, ref: JobRef, queue: str = "") -> JobRecord:
    """The record if ``ref.token`` is its current claim (running) and it belongs to ``queue``
    (any queue if empty); ``LeaseLost`` otherwise."""
    if _named(record, ref, queue) is None:
        raise LeaseLost(f"job {ref.id} does not exist in {queue!r}", resource="", token=ref.token)
    assert record is not None
    if record.state is not JobState.RUNNING or record.token != ref.token:
        raise record.lost(ref.token)
    return record


def heartbeat(
    record: JobRecord | None, ref: JobRef, ttl_ms: int, now_ms: int, queue: str = ""
) -> JobRecord:
    """Extend the current claim's lease to now + ttl."""
    current = require_current(record, ref, queue)
    return replace(current, lease_until_ms=now_ms + ttl_ms)


def complete(record: JobRecord | None, ref: JobRef, now_ms: int, queue: str = "") -> JobRecord:
    """Mark the job succeeded; a repeat with the same token returns the record unchanged."""
    named = _named(record, ref, queue)
    if named is not None and named.state is JobState.SUCCEEDED and named.token == ref.token:
        return named
    current = require_current(record, ref, queue)
    return replace(
        current,
        state=JobState.SUCCEEDED,
        lease_until_ms=0,
        last_error="",
        finished_at_ms=now_ms,
    )


def retry_delay_ms(attempts: int, policy: Backoff, rand: float, retry_in_ms: int = 0) -> int:
    """When a job that failed its ``attempts``-th attempt is due again (ms from now)."""
    if retry_in_ms > 0:
        return retry_in_ms
    return round(policy.delay(attempts, rand))


def fail(
    record: JobRecord | None,
    ref: JobRef,
    error: str,
    delay_ms: int,
    now_ms: int,
    *,
    final: bool = False,
    queue: str = "",
) -> tuple[JobRecord, Failed]:
    """Record a failed attempt: ready after ``delay_ms``, or dead if none is left (or final).

    A repeat with the same token (the job is ready or dead with it) changes nothing.
    """
    named = _named(record, ref, queue)
    if (
        named is not None
        and named.token == ref.token
        and named.state in (JobState.READY, JobState.DEAD)
    ):
        return named, Failed(named.state, max(0, named.available_at_ms - now_ms))
    current = require_current(record, ref, queue)
    error = limits.truncate_error(error)
    if final or current.attempts >= current.max_attempts:
        dead = replace(
            current,
            state=JobState.DEAD,
            lease_until_ms=0,
            last_error=error,
            finished_at_ms=now_ms,
        )
        return dead, Failed(JobState.DEAD)
    ready = replace(
        current,
        state=JobState.READY,
        available_at_ms=now_ms + delay_ms,
        lease_until_ms=0,
        last_error=error,
    )
    return ready, Failed(JobState.READY, delay_ms)


def release(
    record: JobRecord | None, ref: JobRef, now_ms: int, queue: str = "", delay_ms: int = 0
) -> JobRecord:
    """Give the job back, due now (or after ``delay_ms``: the server gives back a job whose
    resource's lease is held, until about when it expires); the attempt does not count.
    A repeat changes nothing."""
    named = _named(record, ref, queue)
    if named is not None and named.state is JobState.READY and named.token == ref.token:
        return named
    current = require_current(record, ref, queue)
    return replace(
        current,
        state=JobState.READY,
        attempts=max(0, current.attempts - 1),
        available_at_ms=now_ms + delay_ms,
        lease_owner="",
        lease_until_ms=0,
    )


def reapable(record: JobRecord, now_ms: int) -> bool:
    """Running, lease expired, and no attempt left: only the reaper can end it (dead)."""
    return record.expired(now_ms) and record.attempts >= record.max_attempts


def reap(record: JobRecord, now_ms: int) -> JobRecord:
    """The reaper's verdict on an exhausted, expired job: dead."""
    if not reapable(record, now_ms):
        raise ValueError(f"job {record.id} is not reapable")
    return replace(
        record,
        state=JobState.DEAD,
        lease_until_ms=0,
        last_error=REAPED_ERROR,
        finished_at_ms=now_ms,
    )


def cancel(record: JobRecord, token: int, reason: str, now_ms: int) -> JobRecord | None:
    """The job cancelled, or None when it is in no cancellable state (nothing changes).

    ``token`` (> every earlier token, drawn from the claims' counter) replaces a running
    job's token, so its claim is stale from this step on; other jobs keep theirs.
    """
    if record.state not in CANCELLABLE_STATES:
        return None
    if record.state is JobState.RUNNING:
        _check_fresh(record, token)
    return replace(
        record,
        state=JobState.CANCELLED,
        token=token if record.state is JobState.RUNNING else record.token,
        lease_until_ms=0,
        last_error=limits.truncate_error(reason or CANCELLED_ERROR),
        finished_at_ms=now_ms,
    )


def retry(record: JobRecord, blocked: bool, now_ms: int) -> JobRecord | None:
    """The job due now, or None when it is in no retryable state (nothing changes).

    ``blocked``: another job of its ordering key is live, so it waits (``waiting``) for
    that one as a newly enqueued job would. Attempts are kept; an exhausted job is
    allowed one more. A ready job that failed before (waiting out its backoff) only has
    its due time brought to now; one that never ran is left alone (a retry does not
    bring a delayed job forward).
    """
    if record.state not in RETRYABLE_STATES:
        return None
    if record.state is JobState.READY and record.attempts == 0:
        return None  # never failed: a delayed job is not brought forward by a retry
    state = JobState.READY
    if record.state is not JobState.READY and blocked:
        state = JobState.WAITING
    return replace(
        record,
        state=state,
        max_attempts=max(record.max_attempts, record.attempts + 1),
        available_at_ms=min(record.available_at_ms, now_ms)
        if record.state is JobState.READY
        else now_ms,
        lease_owner="",
        lease_until_ms=0,
        finished_at_ms=0,
    )


def listed(record: JobRecord, now_ms: int) -> JobRecord:
    """The job as an operator's listing shows it at ``now_ms``: a ready job not yet due is
    ``scheduled`` (``ready`` lists only the due ones); every other state as stored."""
    if record.state is JobState.READY and record.available_at_ms > now_ms:
        return replace(record, state=JobState.SCHEDULED)
    return record


def transitions(old: JobRecord | None, new: JobRecord, now_ms: int) -> list[Transition]:
    """What changing ``old`` into ``new`` at ``now_ms`` appends to the event log, in order.

    - a claim that ended (the job was running with token *t* and now runs with another
      token, or no longer runs) is EXPIRED(*t*) when it was taken over by a rescue or
      declared dead by the reaper (:data:`REAPED_ERROR`), RELEASED(*t*) otherwise
      (Complete, Fail, Release: its worker ended it);
    - a new claim (the job runs with a token it did not have) is ACQUIRED with the ttl
      granted, so a rescue appends EXPIRED(*t*) then ACQUIRED(*t'*), as a lease takeover;
    - anything else (enqueue, a heartbeat, a promotion, a replay) appends nothing;
    - a job naming its own ``resource`` appends nothing: its claims are leases on that
      resource, whose acquire, release and expiry the lease backend logs.

    Each names the job (``job_id``, ``queue``) and its guard resource; the holder is the
    claim's worker. The PostgreSQL backend's trigger on ``jobs`` applies the same rule.
    """
    if old is None or old == new or new.resource:
        return []
    out: list[Transition] = []
    resource = new.fenced_resource
    ended = new.token != old.token or new.state is not JobState.RUNNING
    if old.state is JobState.RUNNING and ended:
        reaped = new.state is JobState.DEAD and new.last_error == REAPED_ERROR
        kind = (
            TransitionKind.EXPIRED if new.token != old.token or reaped else TransitionKind.RELEASED
        )
        out.append(Transition(kind, resource, old.token, old.lease_owner, 0, new.id, new.queue))
    if new.state is JobState.RUNNING and new.token != old.token:
        ttl_ms = max(0, new.lease_until_ms - now_ms)
        out.append(
            Transition(
                TransitionKind.ACQUIRED,
                resource,
                new.token,
                new.lease_owner,
                ttl_ms,
                new.id,
                new.queue,
            )
        )
    return out


def promote(record: JobRecord) -> JobRecord:
    """The next job of an ordering key becomes ready (its due time still applies)."""
    if record.state is not JobState.WAITING:
        raise ValueError(f"job {record.id} is not waiting")
    return replace(record, state=JobState.READY)


def prunable(
    record: JobRecord, succeeded_before_ms: int | None, dead_before_ms: int | None
) -> bool:
    """Finished before the retention cutoff of its state (None: keep that state forever)."""
    if record.state is JobState.SUCCEEDED and succeeded_before_ms is not None:
        return record.finished_at_ms < succeeded_before_ms
    if record.state in (JobState.DEAD, JobState.CANCELLED) and dead_before_ms is not None:
        return record.finished_at_ms < dead_before_ms
    return False


def count(queue: str, records: list[JobRecord], now_ms: int, window_ms: int) -> QueueCounts:
    """Stats of one queue's records (the memory backend; SQL backends aggregate the same)."""
    ready = scheduled = waiting = running = expired = succeeded = dead = retrying = 0
    cancelled = 0
    finished = attempts = 0
    oldest: int | None = None
    for r in records:
        if r.state is JobState.READY:
            if r.available_at_ms <= now_ms:
                ready += 1
                oldest = r.available_at_ms if oldest is None else min(oldest, r.available_at_ms)
            else:
                scheduled += 1
        elif r.state is JobState.WAITING:
            waiting += 1
        elif r.state is JobState.RUNNING:
            running += 1
            expired += r.lease_until_ms <= now_ms
        elif r.state is JobState.SUCCEEDED:
            succeeded += 1
        elif r.state is JobState.CANCELLED:
            cancelled += 1
        else:
            dead += 1
        if r.state in (JobState.READY, JobState.WAITING) and r.attempts > 0:
            retrying += 1
        if r.state in FINISHED_STATES and r.finished_at_ms >= now_ms - window_ms:
            finished += 1
            attempts += r.attempts
    return QueueCounts(
        queue=queue,
        ready=ready,
        scheduled=scheduled,
        waiting=waiting,
        running=running,
        expired=expired,
        succeeded=succeeded,
        dead=dead,
        cancelled=cancelled,
        oldest_ready_age_ms=0 if oldest is None else max(0, now_ms - oldest),
        retrying=retrying,
        finished_in_window=finished,
        attempts_in_window=attempts,
        window_ms=window_ms,
    )
