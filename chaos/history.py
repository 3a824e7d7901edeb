"""The history of a chaos run: what every client invoked and what it was told.

A history is a list of :class:`Event` records in the style of Jepsen. A client
records an ``invoke`` event just before it sends a request and one completion
event when it learns the outcome, both with the same ``op_id``:

- ``ok``: the operation took effect (the server said so);
- ``fail``: the operation certainly did not take effect (e.g. ``STALE_TOKEN``,
  ``LEASE_HELD``: the server refused it as a whole);
- ``info``: the outcome is unknown (timeout, lost reply, ``BACKEND_UNAVAILABLE``
  after the request was sent, the client crashed). It may have taken effect at any
  time after its invocation. Never record an unknown outcome as ``fail``: the
  checker would then trust that it had no effect.

An invoke that never gets a completion (the process was SIGKILLed) is read as
``info`` completing at +infinity (:attr:`Operation.pending`).

Time is one monotonic clock for the whole harness: ``t_mono_ns`` comes from
``time.monotonic_ns()``, which is ``CLOCK_MONOTONIC`` and therefore shared by
every process on one host, so events from different clients' files can be
merged and compared in real time. ``t_wall_ns`` (``time.time_ns()``) is only for
humans and for lining a history up with server logs.

Files: each client process appends to its own JSONL file through one
:class:`HistoryWriter` (one JSON object per line, each line handed to the
kernel in a single ``write`` as soon as it is recorded), so a SIGKILL loses at
most the line being written. :func:`read_history` merges many files, skips a
partial last line, and sorts by ``t_mono_ns``.

Line format (every field always present, ``null`` when unset)::

    {"process":"c1","op_id":"c1/7f3a/12","op":"write","type":"invoke",
     "resource":"orders","token":42,"key":"k1","value":"v-c1-12",
     "idempotency_key":null,"error":null,"t_mono_ns":812345678901,
     "t_wall_ns":1732870000000000000,"extra":{"fence_mode":"monotonic"}}
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

OPS: Final = frozenset({"acquire", "renew", "release", "write", "read", "fence", "periodic", "job"})
"""Operation names: lease-server calls (acquire, renew, release), guard calls (write,
read, fence: an explicit ``Fence`` promise), ``periodic``: a job a periodic schedule
enqueued, as listed from the queue after the run (checker rule 8), and ``job``: a job
of the workers' queue as listed at the end, its value its state (rule 9)."""

TYPES: Final = frozenset({"invoke", "ok", "fail", "info"})
"""Event types: ``invoke`` starts an operation, the other three complete it."""

COMPLETIONS: Final = frozenset({"ok", "fail", "info"})

ExtraValue = str | int
"""Values allowed in :attr:`Event.extra`: JSON-safe scalars only."""

StrPath = str | os.PathLike[str]

_T = TypeVar("_T")


class HistoryError(ValueError):
    """A history file or event list is malformed (not a property of the system under test).

    Raised for a corrupt line that is not the last line of its file, an unknown op or
    type, a completion without an invoke, two completions of one operation, or an
    invoke and completion that disagree on process, op or resource.
    """


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a history: an invocation or a completion of one operation.

    ``op_id`` is unique per operation and shared by its invoke and completion.
    ``token`` is the fencing token sent (renew, release, write, fence) or received
    (the ok completion of an acquire). ``value`` is the value written (write) or read
    (the ok completion of a read; ``None`` means the key was not found). ``error`` is
    the ``ErrorInfo.reason`` of a fail/info completion (``STALE_TOKEN``,
    ``LEASE_HELD``, ``LEASE_LOST``, ``BACKEND_UNAVAILABLE``, ``DEADLINE_EXCEEDED``...).
    ``extra`` carries everything else as str/int values, e.g. ``ttl_ms``,
    ``fence_mode``, ``final: 1`` on the final reads, ``lost: 1`` when the client
    stopped believing it holds the lease, ``request_id`` of an acquire.
    """

    process: str
    op_id: str
    op: str
    type: str
    resource: str
    token: int | None = None
    key: str | None = None
    value: str | None = None
    idempotency_key: str | None = None
    error: str | None = None
    t_mono_ns: int = 0
    t_wall_ns: int = 0
    extra: Mapping[str, ExtraValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise HistoryError(f"unknown op {self.op!r} (expected one of {sorted(OPS)})")
        if self.type not in TYPES:
            raise HistoryError(f"unknown type {self.type!r} (expected one of {sorted(TYPES)})")
        for name, v in self.extra.items():
            # bool is an int subclass but would not survive the JSON round trip as an int.
            if not isinstance(name, str) or isinstance(v, bool) or not isinstance(v, str | int):
                raise HistoryError(f"extra[{name!r}] must be str or int, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready mapping written as one history line."""
        return {
            "process": self.process,
            "op_id": self.op_id,
            "op": self.op,
            "type": self.type,
            "resource": self.resource,
            "token": self.token,
            "key": self.key,
            "value": self.value,
            "idempotency_key": self.idempotency_key,
            "error": self.error,
            "t_mono_ns": self.t_mono_ns,
            "t_wall_ns": self.t_wall_ns,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Event:
        """Build an event from a decoded history line; raise ``HistoryError`` if malformed."""
        try:
            event = cls(
                process=_req(raw, "process", str),
                op_id=_req(raw, "op_id", str),
                op=_req(raw, "op", str),
                type=_req(raw, "type", str),
                resource=_req(raw, "resource", str),
                token=_opt(raw, "token", int),
                key=_opt(raw, "key", str),
                value=_opt(raw, "value", str),
                idempotency_key=_opt(raw, "idempotency_key", str),
                error=_opt(raw, "error", str),
                t_mono_ns=_req(raw, "t_mono_ns", int),
                t_wall_ns=_opt(raw, "t_wall_ns", int) or 0,
                extra=dict(raw.get("extra") or {}),
            )
        except (TypeError, AttributeError) as exc:
            raise HistoryError(f"malformed event {raw!r}: {exc}") from exc
        return event


def _req(raw: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = raw.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise HistoryError(f"field {name!r} must be {kind.__name__}, got {value!r}")
    return value


def _opt(raw: Mapping[str, Any], name: str, kind: type[_T]) -> _T | None:
    value = raw.get(name)
    if value is None:
        return None
    return _req(raw, name, kind)


class HistoryWriter:
    """Append events to one JSONL file; one writer per client process, one file each.

    Every :meth:`write` encodes the event as one line and hands it to the kernel in a
    single ``os.write`` on an ``O_APPEND`` descriptor (no user-space buffer), so a
    SIGKILLed process loses at most the line it was writing, and that line is never
    interleaved with another. ``fsync=True`` also survives a machine crash, at the
    cost of one disk flush per event; the harness only needs process crashes.

    Opening a file whose last line lacks its newline (a previous writer was killed
    mid-line) first repairs it the way :func:`read_history` reads it: a line that
    decodes is kept and terminated, any other is cut off, so new lines start clean.
    Thread-safe; usable as a context manager. ``write`` after ``close`` raises
    ``ValueError``.
    """

    def __init__(self, path: StrPath, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._repair_tail()

    def _repair_tail(self) -> None:
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            # Scan back in blocks for the last newline; lines are short, so one block
            # is nearly always enough.
            end, tail = size, b""
            while end > 0:
                start = max(0, end - 4096)
                f.seek(start)
                block = f.read(end - start)
                if end == size and block.endswith(b"\n"):
                    return
                cut = block.rfind(b"\n")
                if cut >= 0:
                    tail = block[cut + 1 :] + tail
                    break
                tail, end = block + tail, start
        if _decodes(tail):
            # Killed between the record and its newline: the record is whole, keep it.
            os.write(self._fd, b"\n")
        else:
            os.truncate(self.path, size - len(tail))

    def write(self, event: Event) -> None:
        """Append ``event`` as one line, handed to the kernel before returning."""
        data = _encode(event)
        with self._lock:
            if self._fd is None:
                raise ValueError(f"history writer for {self.path} is closed")
            view = memoryview(data)
            while view:
                # A regular-file write is normally whole; loop for the rare short write.
                written = os.write(self._fd, view)
                view = view[written:]
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_history(paths: StrPath | Iterable[StrPath]) -> list[Event]:
    """Read and merge history files into one list sorted by ``t_mono_ns``.

    ``paths`` is one path or many; a directory stands for every ``*.jsonl`` file in
    it. A final line without its newline whose JSON does not decode is the trace of
    a SIGKILL mid-write and is skipped; any other undecodable line raises
    ``HistoryError`` naming the file and line. Events with equal ``t_mono_ns`` keep
    their order within a file (an invoke stays before its completion).
    """
    events = list(iter_history(paths))
    events.sort(key=lambda e: e.t_mono_ns)  # stable: file order breaks ties
    return events


def iter_history(paths: StrPath | Iterable[StrPath]) -> Iterator[Event]:
    """The events of history files, file by file in each file's order (not merged by time):
    what a pass over a long history needs without holding it (see :func:`read_history`
    for ``paths`` and for the lines skipped)."""
    for path in _files(paths):
        yield from _read_file(path)


def _files(paths: StrPath | Iterable[StrPath]) -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        files.extend(sorted(path.glob("*.jsonl")) if path.is_dir() else [path])
    return files


def _read_file(path: Path) -> Iterator[Event]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield _decode(raw)
            except (UnicodeDecodeError, json.JSONDecodeError, HistoryError) as exc:
                if not raw.endswith(b"\n"):
                    return  # the writer was killed mid-line: that event never happened
                raise HistoryError(f"{path}:{lineno}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class HistoryParts:
    """A history split by resource into parts, one file each (:func:`split_history`).

    The checker judges each resource alone, so a history can be judged part by part:
    one part in memory at a time, however long the run. ``origin_ns`` (the first
    event's time) and ``last_seen`` (each process's last event) are what the checker's
    measurements need of the whole history."""

    directory: Path
    names: tuple[str, ...]
    origin_ns: int
    last_seen: Mapping[str, int]
    events: int

    def read(self, name: str) -> list[Event]:
        """The events of part ``name``, merged by time (see :func:`read_history`)."""
        return read_history(self.directory / f"{name}.jsonl")


def split_history(
    paths: StrPath | Iterable[StrPath], directory: StrPath, part: Callable[[str], str]
) -> HistoryParts:
    """Copy the history in ``paths`` into ``directory``, one file per part: an event goes
    to the part ``part(resource)`` names. Every event of an operation names the same
    resource, so an operation stays in one part; each file's order is kept."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    writers: dict[str, Any] = {}
    origin: int | None = None
    last_seen: dict[str, int] = {}
    n = 0
    try:
        for event in iter_history(paths):
            name = part(event.resource)
            f = writers.get(name)
            if f is None:
                f = writers[name] = (out / f"{name}.jsonl").open("ab")
            f.write(_encode(event))
            t = event.t_mono_ns
            origin = t if origin is None else min(origin, t)
            last_seen[event.process] = max(last_seen.get(event.process, t), t)
            n += 1
    finally:
        for f in writers.values():
            f.close()
    return HistoryParts(out, tuple(sorted(writers)), origin or 0, last_seen, n)


class HistoryTail:
    """The events added to a run's history files since the last :meth:`poll`.

    Reads only whole lines (a line not yet ended by its newline is read next time; a
    line torn by a SIGKILL is skipped) and picks up files that appear later (a
    restarted client's). Within a file, events come in the file's order, so an
    invocation always comes before (or with) its completion."""

    def __init__(self, directory: StrPath) -> None:
        self._dir = Path(directory)
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[Event]:
        """The events recorded since the last call."""
        new: list[Event] = []
        for path in sorted(self._dir.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = offset + end + 1
            for raw in data[:end].split(b"\n"):
                if not raw.strip():
                    continue
                try:
                    new.append(_decode(raw))
                except (UnicodeDecodeError, json.JSONDecodeError, HistoryError):
                    continue
        return new


def _encode(event: Event) -> bytes:
    return (json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _decode(raw: bytes) -> Event:
    decoded = json.loads(raw)
    if not isinstance(decoded, dict):
        raise HistoryError(f"expected a JSON object, got {type(decoded).__name__}")
    return Event.from_dict(decoded)


def _decodes(raw: bytes) -> bool:
    try:
        _decode(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, HistoryError):
        return False
    return True


class HistoryFollower:
    """Follow a run's history files while they grow: what the clients have recorded so far.

    For the harness's fault schedules, which wait for what a client was told (a
    newer holder's write acknowledged, a read that returned a value), not for a
    guessed amount of time. :meth:`poll` reads only the lines added since the last
    call and only whole ones (a line not yet ended by its newline is read next
    time; a line torn by a SIGKILL is skipped), picks up files that appear later (a
    restarted client's), and pairs each completion with its invocation.
    """

    def __init__(self, directory: StrPath) -> None:
        self._tail = HistoryTail(directory)
        self._invokes: dict[str, Event] = {}
        self._acked: dict[str, int] = {}
        self._reads: dict[str, list[tuple[int, str | None]]] = {}

    def poll(self) -> list[tuple[Event, Event]]:
        """(invoke, completion) pairs of the operations completed since the last call."""
        done: list[tuple[Event, Event]] = []
        for event in self._tail.poll():
            if event.type == "invoke":
                self._invokes[event.op_id] = event
                continue
            invoke = self._invokes.pop(event.op_id, None)
            if invoke is not None:
                self._note(invoke, event)
                done.append((invoke, event))
        return done

    def _note(self, invoke: Event, completion: Event) -> None:
        if completion.type != "ok":
            return
        if invoke.op == "write" and invoke.token is not None:
            self._acked[invoke.resource] = max(self._acked.get(invoke.resource, 0), invoke.token)
        elif invoke.op == "read":
            self._reads.setdefault(invoke.resource, []).append((invoke.t_mono_ns, completion.value))

    def acked_token(self, resource: str) -> int:
        """The highest token of an acknowledged (``ok``) write to ``resource`` seen so far
        (0 if none); call :meth:`poll` first."""
        return self._acked.get(resource, 0)

    def read_since(self, resource: str, since_ns: int, values: frozenset[str]) -> bool:
        """Whether a read of ``resource`` invoked at or after ``since_ns`` (monotonic ns)
        returned one of ``values``; call :meth:`poll` first."""
        return any(t >= since_ns and value in values for t, value in self._reads.get(resource, ()))


class _Unset:
    """Marker for "not given": ``None`` is a meaningful value (e.g. a read found nothing)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()

_FIELDS: Final = frozenset({"token", "key", "value", "idempotency_key", "error"})


class Recorder:
    """Record a client's operations: :meth:`invoke` before the request, :meth:`complete` after.

    ``sink`` receives every event as soon as it is made, typically
    ``HistoryWriter(path).write`` (or ``list.append`` in tests). ``process`` names the
    client process and must be unique within a run. ``op_id``\\ s are
    ``"{process}/{session}/{n}"`` with a random session per recorder, so a restarted
    process that reuses its name cannot collide with its former self. Clocks are
    injectable for tests. Thread-safe (a lease's renewal thread may record too).
    """

    def __init__(
        self,
        sink: Callable[[Event], object],
        process: str,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.process = process
        self._sink = sink
        self._clock = clock
        self._wall = wall_clock
        self._session = uuid.uuid4().hex[:8]
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: dict[str, Event] = {}

    def invoke(
        self,
        op: str,
        resource: str,
        *,
        token: int | None = None,
        key: str | None = None,
        value: str | None = None,
        idempotency_key: str | None = None,
        **extra: ExtraValue,
    ) -> str:
        """Record the invocation of ``op`` on ``resource`` now; return its ``op_id``.

        Call it immediately before sending the request. Keyword arguments other than
        the named ones go to ``extra`` (e.g. ``ttl_ms=3000``, ``final=1``).
        """
        with self._lock:
            op_id = f"{self.process}/{self._session}/{next(self._ids)}"
            event = Event(
                process=self.process,
                op_id=op_id,
                op=op,
                type="invoke",
                resource=resource,
                token=token,
                key=key,
                value=value,
                idempotency_key=idempotency_key,
                t_mono_ns=self._clock(),
                t_wall_ns=self._wall(),
                extra=extra,
            )
            self._open[op_id] = event
            self._sink(event)
        return op_id

    def complete(
        self,
        op_id: str,
        type: str,
        *,
        token: int | _Unset | None = UNSET,
        key: str | _Unset | None = UNSET,
        value: str | _Unset | None = UNSET,
        idempotency_key: str | _Unset | None = UNSET,
        error: str | None = None,
        **extra: ExtraValue,
    ) -> Event:
        """Record the outcome (``ok``, ``fail`` or ``info``) of ``op_id`` now; return the event.

        Fields not given are copied from the invocation, so an acquire passes only
        ``token=`` and a read only ``value=`` (``None``: not found). Any other keyword
        goes to ``extra`` (e.g. ``ttl_ms=``, ``lost=1``). Use ``info`` whenever the
        outcome is unknown. Raises ``KeyError`` for an unknown or already completed
        ``op_id`` and ``HistoryError`` for a type that is not a completion.
        """
        if type not in COMPLETIONS:
            raise HistoryError(f"completion type must be ok, fail or info, got {type!r}")
        with self._lock:
            inv = self._open.pop(op_id)
            event = Event(
                process=self.process,
                op_id=op_id,
                op=inv.op,
                type=type,
                resource=inv.resource,
                token=inv.token if isinstance(token, _Unset) else token,
                key=inv.key if isinstance(key, _Unset) else key,
                value=inv.value if isinstance(value, _Unset) else value,
                idempotency_key=(
                    inv.idempotency_key if isinstance(idempotency_key, _Unset) else idempotency_key
                ),
                error=error,
                t_mono_ns=self._clock(),
                t_wall_ns=self._wall(),
                extra=extra,
            )
            self._sink(event)
        return event

    def lost(self, resource: str, token: int | None, *, reason: str = "LEASE_LOST") -> str:
        """Record that this process stopped believing it holds ``resource`` (no RPC sent).

        Use it when the local deadline passes or the SDK reports the lease lost. It is
        recorded as a ``release`` whose outcome is ``info`` (the server may still hold
        the lease until it expires) with ``extra lost=1``; the checker ends the
        process's belief of ownership here. Returns the ``op_id``.
        """
        op_id = self.invoke("release", resource, token=token, lost=1)
        self.complete(op_id, "info", error=reason, lost=1)
        return op_id

    @property
    def in_flight(self) -> list[str]:
        """The ``op_id``\\ s invoked but not yet completed."""
        with self._lock:
            return list(self._open)


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion (``None`` while pending).

    ``start_ns`` is the invocation's ``t_mono_ns``; ``end_ns`` the completion's, or
    ``math.inf`` for a pending operation (so "A completed before B was invoked" is
    simply ``a.end_ns < b.start_ns`` for every pair). ``type`` is ``ok``, ``fail`` or
    ``info``; a pending operation is ``info``. Field accessors prefer the completion
    (an acquire's token, a read's value) and fall back to the invocation.
    """

    invoke: Event
    completion: Event | None

    @property
    def op_id(self) -> str:
        return self.invoke.op_id

    @property
    def process(self) -> str:
        return self.invoke.process

    @property
    def op(self) -> str:
        return self.invoke.op

    @property
    def resource(self) -> str:
        return self.invoke.resource

    @property
    def type(self) -> str:
        return self.completion.type if self.completion is not None else "info"

    @property
    def ok(self) -> bool:
        return self.type == "ok"

    @property
    def fail(self) -> bool:
        return self.type == "fail"

    @property
    def info(self) -> bool:
        return self.type == "info"

    @property
    def pending(self) -> bool:
        """No completion was recorded (the client died): info, completing at +infinity."""
        return self.completion is None

    @property
    def start_ns(self) -> int:
        return self.invoke.t_mono_ns

    @property
    def end_ns(self) -> float:
        # Kept as the completion's int (not converted): int/float comparisons are exact.
        return self.completion.t_mono_ns if self.completion is not None else math.inf

    @property
    def token(self) -> int | None:
        if self.completion is not None and self.completion.token is not None:
            return self.completion.token
        return self.invoke.token

    @property
    def key(self) -> str | None:
        return self.invoke.key

    @property
    def value(self) -> str | None:
        """A read's value comes from its completion; a write's from its invocation."""
        if self.op == "read":
            return self.completion.value if self.completion is not None else None
        return self.invoke.value

    @property
    def idempotency_key(self) -> str | None:
        return self.invoke.idempotency_key

    @property
    def error(self) -> str | None:
        return self.completion.error if self.completion is not None else None

    @property
    def extra(self) -> Mapping[str, ExtraValue]:
        """The invocation's extra updated with the completion's."""
        if self.completion is None or not self.completion.extra:
            return self.invoke.extra
        return {**self.invoke.extra, **self.completion.extra}


def pair_operations(events: Iterable[Event]) -> list[Operation]:
    """Pair invocations with completions by ``op_id``; return operations sorted by start.

    Events may arrive in any order. Raises ``HistoryError`` for a completion without
    an invocation, a second invocation or completion of one ``op_id``, or an
    invocation and completion that disagree on process, op or resource.
    """
    invokes: dict[str, Event] = {}
    completions: dict[str, Event] = {}
    for event in events:
        table = invokes if event.type == "invoke" else completions
        if event.op_id in table:
            raise HistoryError(f"op {event.op_id!r} has two {event.type} events")
        table[event.op_id] = event
    ops: list[Operation] = []
    for op_id, inv in invokes.items():
        done = completions.pop(op_id, None)
        if done is not None and (
            done.process != inv.process or done.op != inv.op or done.resource != inv.resource
        ):
            raise HistoryError(f"op {op_id!r}: completion disagrees with its invocation")
        ops.append(Operation(inv, done))
    if completions:
        orphan = next(iter(completions))
        raise HistoryError(
            f"{len(completions)} completion(s) without an invocation, e.g. {orphan!r}"
        )
    ops.sort(key=lambda o: o.start_ns)
    return ops


__all__ = [
    "COMPLETIONS",
    "OPS",
    "TYPES",
    "UNSET",
    "Event",
    "ExtraValue",
    "HistoryError",
    "HistoryFollower",
    "HistoryParts",
    "HistoryTail",
    "HistoryWriter",
    "Operation",
    "Recorder",
    "StrPath",
    "iter_history",
    "pair_operations",
    "read_history",
    "split_history",
]
