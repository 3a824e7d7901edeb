"""Leader election on a lease, fenced by its term (blocking; the asyncio twin is
:mod:`fencing.async_election`).

Like etcd's ``concurrency.Election``, kazoo's ``Election`` or client-go's
``leaderelection``::

    election = Election(leases, guard, "scheduler", ttl=10)
    with election.campaign("10.0.0.7:8080") as leader:   # blocks until elected
        guard.put(leader, "plan", b"...")                 # fenced by leader.term
        leader.check()                                    # LeaseLost once deposed

    for leader in election.observe():                     # current leader at once,
        print(leader)                                     # then each change

The **term** is the token of the election's lease: each new leader's term is larger
than every earlier one. ``campaign`` promises the term to the guard (``Fence``) before
it returns, so from then on the guard refuses every write of an earlier term: a
deposed leader that still believes it leads (paused, partitioned) changes nothing.
A :class:`Leadership` is itself a fenced claim (``resource`` = the election's name,
``token`` = the term), so it can be handed to ``guard.put``/``write`` directly.

Where the proclaimed value lives
--------------------------------
The value (e.g. the leader's address) is a guarded record in the guard: key
:data:`LEADER_KEY` of the election's resource, written with the term. Chosen because

- it is fenced by the term itself: a deposed leader's late ``proclaim`` is refused
  like any other stale write, so readers never see an old leader's address as the
  current one (a lease-server field would need its own check, and a new wire field);
- the record carries the term that wrote it (``written_by_token``): a reader joins it
  with the lease's current token, and a value of an earlier term is not reported as
  the current leader's (``Leader.value`` is None until the new leader proclaims);
- no change to the lease server's schema, wire or backends.

The cost: reading the leader asks both servers (Describe, then Read), and a
proclamation is seen by observers through the lease's event stream: ``proclaim``
renews the lease after writing, and every event of the election's resource makes an
observer read the leader again.

Loss: the leadership is lost when its lease is (a renewal refused, the local
deadline passed). ``lost`` is set, ``on_lost`` callbacks run, ``check()`` raises
:class:`~fencing.errors.LeaseLost`, and a ``with`` block ends with ``LeaseLost``
(as ``LeaseClient.hold`` does). ``resign()`` gives the leadership up at once.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fencing.client.guard import GuardClient
from fencing.client.lease import Lease, LeaseClient
from fencing.errors import InvalidArgumentError, LeaseLost
from fencing.types import LeaseState, Record

#: The guard key, in the election's resource, that holds the proclaimed value.
#: How often :meth:`Election.observe` reads the proclaimed value while no event comes.
DEFAULT_POLL_S = 0.25

LEADER_KEY = "fencing.election/leader"


@dataclass(frozen=True)
class Leader:
    """Who leads an election: ``term`` (the lease's token), ``holder`` (the lease
    holder's name) and ``value`` (what this term proclaimed; None if nothing yet)."""

    name: str
    term: int
    holder: str
    value: str | None


def leader_of(name: str, state: LeaseState, record: Record | None) -> Leader | None:
    """The leader the lease's state and the guard's record say: None when nobody holds
    the election's lease; a value only if it was written by the current term."""
    if not state.held:
        return None
    value = None
    if record is not None and record.written_by_token == state.token:
        value = record.value.decode(errors="backslashreplace")
    return Leader(name, state.token, state.holder, value)


class Leadership:
    """A won election: the lease held (renewed by the client's session), its term, and
    the proclaimed value. Returned by :meth:`Election.campaign`; a fenced claim
    (``resource``, ``token``) for the guard. Use it as a context manager, or call
    :meth:`resign`."""

    def __init__(
        self, election: Election, lease: Lease, hold: AbstractContextManager[Lease]
    ) -> None:
        self.election = election
        self.lease = lease
        self._hold: AbstractContextManager[Lease] | None = hold

    @property
    def resource(self) -> str:
        return self.lease.resource

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def term(self) -> int:
        """This leadership's term: the lease's fencing token."""
        return self.lease.token

    @property
    def lost(self) -> Any:
        """Set once the leadership is lost (a :class:`threading.Event`)."""
        return self.lease.lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the leadership is lost, resigned, or past its
        local deadline."""
        self.lease.check()

    def proclaim(self, value: str) -> None:
        """Publish ``value`` (e.g. this leader's address) as this term's, fenced by the
        term: refused with :class:`StaleTokenError` once a later term exists. Observers
        read it within their ``poll``."""
        self.lease.check()
        self.election.guard.put(self, LEADER_KEY, value.encode())

    def resign(self) -> None:
        """Give the leadership up now (release the lease). Never raises ``LeaseLost``:
        a leadership already lost is already given up."""
        with contextlib.suppress(LeaseLost):
            self.__exit__(None, None, None)

    def __enter__(self) -> Leadership:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Resign; a block left normally after a loss ends with ``LeaseLost``. The
        block's exception goes to the hold (not a plain close), which tells by it
        whether a loss is the block's end."""
        hold, self._hold = self._hold, None
        if hold is None:
            return None
        return hold.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<Leadership {self.resource!r} term={self.term} {self.lease!r}>"


class Election:
    """Leader election on the lease named ``name``; the guard stores the proclaimed
    value and fences each term's writes. ``ttl``: the leader's lease, in seconds."""

    def __init__(
        self, leases: LeaseClient, guard: GuardClient, name: str, *, ttl: float = 10.0
    ) -> None:
        self.leases = leases
        self.guard = guard
        self.name = name
        self.ttl = ttl

    def campaign(
        self,
        value: str | None = None,
        *,
        timeout: float | None = None,
        on_lost: Callable[[Leadership], object] | None = None,
    ) -> Leadership:
        """Block until this client leads (up to ``timeout`` seconds, None: forever;
        then :class:`AcquireTimeoutError`), then proclaim ``value`` if given.

        The term is promised to the guard before this returns. The lease is renewed
        by the client's session until :meth:`Leadership.resign` or the end of a
        ``with`` block; ``on_lost(leadership)`` is called when it is lost.
        """
        hold = self.leases.hold(self.name, self.ttl, timeout=timeout, fence=[self.guard])
        lease = hold.__enter__()
        leadership = Leadership(self, lease, hold)
        try:
            if on_lost is not None:
                lease.on_lost(lambda _lease: on_lost(leadership))
            if value is not None:
                leadership.proclaim(value)
        except BaseException:
            if not leadership.__exit__(*sys.exc_info()):
                raise
        return leadership

    def leader(self) -> Leader | None:
        """The current leader, or None if nobody leads."""
        state = self.leases.describe(self.name)
        if not state.held:
            return None
        return leader_of(self.name, state, self.guard.read(self.name, LEADER_KEY))

    def observe(self, *, poll: float = DEFAULT_POLL_S) -> Generator[Leader | None, None, None]:
        """Yield the current leader at once (None: nobody leads), then each change:
        a new term, a new proclaimed value, or nobody (a resignation or an expiry).
        Each yield is the state read when something changed, so changes quicker than
        the reader fold into the latest: an observer always ends at the current
        leader, but may skip one that came and went in between.

        Terms come from the lease server's Watch stream on the election's resource
        (opened before the first read, so no grant, release or expiry falls between
        them). A proclaimed value is a guarded record, and renewals are not events,
        so the value is also read every ``poll`` seconds while no event comes. Ends
        only with an error (``BackendUnavailableError`` when a server stops);
        closing the generator cancels the stream.
        """
        if poll <= 0:
            raise InvalidArgumentError(f"poll must be > 0, got {poll}", field="poll")
        events: queue.Queue[BaseException | None] = queue.Queue()
        stream = self.leases.watch_stream(self.name)

        def follow() -> None:
            try:
                for _event in stream:
                    events.put(None)
            except BaseException as exc:  # handed to the reader, which raises it
                events.put(exc)

        reader = threading.Thread(target=follow, daemon=True, name=f"observe-{self.name}")
        reader.start()
        try:
            last = self.leader()
            yield last
            while True:
                try:
                    failure = events.get(timeout=poll)
                except queue.Empty:
                    failure = None
                if failure is not None:
                    raise failure
                now = self.leader()
                if now != last:
                    last = now
                    yield now
        finally:
            stream.close()
            reader.join(5)


__all__ = ["DEFAULT_POLL_S", "LEADER_KEY", "Election", "Leader", "Leadership", "leader_of"]
