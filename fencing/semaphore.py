"""A counting semaphore on leases: at most ``limit`` holders at once, each with its own
fencing token (blocking; the asyncio twin is :mod:`fencing.async_semaphore`).

Like ``consul lock -n N`` or kazoo's ``Semaphore``::

    crawlers = Semaphore(leases, "crawlers", limit=3, ttl=10, fence=[guard])
    with crawlers.hold() as slot:                  # blocks while 3 others hold it
        guard.put(slot, "progress", b"...")        # fenced by the slot's token
        slot.check()                               # LeaseLost once it is gone

Design: N slot leases
---------------------
The semaphore is ``limit`` ordinary leases, ``NAME/slot-0`` .. ``NAME/slot-{limit-1}``;
holding the semaphore is holding one of them. Chosen because

- the lease server's guarantee is per resource: one holder per resource, tokens
  increasing per resource. Each slot keeps it, so at most ``limit`` holders exist at
  any moment, with no new server state, wire field or backend schema;
- a fencing token only means something against one monotonic sequence. N holders of
  one resource would share one sequence, and the guard, which keeps the highest
  token it saw per resource, would refuse every holder but the newest. A slot has
  its own sequence: the guard fences each slot apart, so a paused holder of slot 2
  that wakes after its slot was taken over is refused, while the holders of the other
  slots write on. What a holder writes fenced therefore lives under its slot's
  resource (``slot.resource``), as ``fencing lock -n N`` passes it to the command;
- renewal, release, loss, ``on_lost`` and ``check()`` are a lease's own: a slot is a
  :class:`~fencing.client.lease.Lease` held by the client's session.

The cost: taking a slot tries the slots one by one without waiting (up to ``limit``
calls, starting at a random slot so contenders spread), and while every slot is held
it waits for a ``RELEASED``/``EXPIRED`` event of the semaphore's slots (a ``Watch``
on the prefix ``NAME/slot-``) or at most :data:`RESCAN_S`, then tries again. Waiters
are not served in arrival order (a lease's own waiters are). Every holder must use
the same ``limit``: the limit is the number of slot resources, not stored anywhere.
``limit`` is 1 .. :data:`MAX_LIMIT`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from fencing import propagation
from fencing.client.lease import Fencer, Lease, LeaseClient
from fencing.errors import AcquireTimeoutError, FencingError, InvalidArgumentError, LeaseHeldError
from fencing.types import LeaseState

#: The most slots a semaphore may have (each is tried with its own call).
MAX_LIMIT = 1000
#: The longest a waiter sleeps between two tries when no event came (events wake it
#: sooner; this bounds the wait should the watch stream break).
RESCAN_S = 1.0


def slot_resources(name: str, limit: int) -> list[str]:
    """The lease resources of a semaphore's slots; checks ``limit``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(
            f"limit must be an integer 1 .. {MAX_LIMIT}, got {limit!r}", field="limit"
        )
    if not name:
        raise InvalidArgumentError("a semaphore needs a name", field="name")
    return [f"{slot_prefix(name)}{i}" for i in range(limit)]


def slot_prefix(name: str) -> str:
    """What every slot resource of semaphore ``name`` starts with (its watch prefix)."""
    return f"{name}/slot-"


def try_order(slots: Sequence[str], rng: random.Random | None = None) -> list[str]:
    """The slots in the order one attempt tries them: all, from a random one on."""
    start = (rng or random).randrange(len(slots))
    return [*slots[start:], *slots[:start]]


def timeout_error(name: str, limit: int, timeout: float | None) -> AcquireTimeoutError:
    return AcquireTimeoutError(
        f"all {limit} slots of semaphore {name!r} stayed held for {timeout} s", resource=name
    )


class _Wakeups:
    """Sets :attr:`event` on every event of the semaphore's slots (a watch stream read
    by a daemon thread). Opened before a scan, so a release after it is not missed."""

    def __init__(self, leases: LeaseClient, prefix: str) -> None:
        self.event = threading.Event()
        self._stream = leases.watch_stream(prefix=prefix)
        threading.Thread(target=self._read, name="fencing-semaphore-watch", daemon=True).start()

    def _read(self) -> None:
        try:
            for _event in self._stream:
                self.event.set()
        except FencingError:
            pass  # closed, or the server went away: the waiter rescans every RESCAN_S
        except Exception:  # pragma: no cover - a cancelled stream may surface raw
            pass

    def close(self) -> None:
        self._stream.close()


class Semaphore:
    """At most ``limit`` holders of ``name`` at once, each holding one slot lease with its
    own fencing token; see the module docstring for the design.

    ``ttl`` is each slot lease's; ``fence`` the guards each new slot token is promised
    to before the slot is returned (as ``LeaseClient.acquire(fence=...)``).
    """

    def __init__(
        self,
        leases: LeaseClient,
        name: str,
        limit: int,
        ttl: float,
        *,
        fence: Sequence[Fencer] = (),
    ) -> None:
        self.leases = leases
        self.name = name
        self.limit = limit
        self.ttl = ttl
        self.fence = list(fence)
        self.slots = slot_resources(name, limit)

    def acquire_nowait(self) -> Lease:
        """A free slot's lease now (not renewed), or :class:`LeaseHeldError` if all are held."""
        for resource in try_order(self.slots):
            with contextlib.suppress(LeaseHeldError):
                return self.leases.acquire_nowait(resource, self.ttl, fence=self.fence)
        raise LeaseHeldError(f"all {self.limit} slots of semaphore {self.name!r} are held")

    def acquire(self, timeout: float | None = None) -> Lease:
        """A slot's lease (not renewed: use :meth:`hold`), waiting up to ``timeout``
        seconds (None: forever) while all are held; then :class:`AcquireTimeoutError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wakeups: _Wakeups | None = None
        try:
            while True:
                try:
                    return self.acquire_nowait()
                except LeaseHeldError:
                    pass
                if wakeups is None:  # watch first, then look again: no release is missed
                    wakeups = _Wakeups(self.leases, slot_prefix(self.name))
                    continue
                wait = RESCAN_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise timeout_error(self.name, self.limit, timeout)
                wakeups.event.wait(wait)
                wakeups.event.clear()
        finally:
            if wakeups is not None:
                wakeups.close()

    @contextlib.contextmanager
    def hold(
        self, *, timeout: float | None = None, on_lost: Callable[[Lease], object] | None = None
    ) -> Iterator[Lease]:
        """Take a slot (:meth:`acquire`), keep it renewed by the client's session, release
        it on exit; loss as for ``LeaseClient.hold`` (``lease.lost``, ``on_lost``,
        ``check()``, the block ends with :class:`~fencing.errors.LeaseLost`)."""
        lease = self.acquire(timeout)
        with self.leases._holding([lease], on_lost), propagation.bound(lease):
            yield lease

    def holders(self) -> list[LeaseState]:
        """The slots held now, in slot order (one ``List`` of the slots' prefix)."""
        mine = set(self.slots)
        return [s for s in self.leases.list_held(slot_prefix(self.name)) if s.resource in mine]
