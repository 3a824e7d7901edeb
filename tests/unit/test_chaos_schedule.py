"""What the fault schedules rely on, without processes: which busy worker a strike takes,
whether a struck client's prepared write is still unsent, and following the histories
the clients are writing (chaos/scenarios.py, chaos/history.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import cast

from chaos.cluster import Cluster
from chaos.faults import FaultLog
from chaos.history import HistoryFollower, HistoryWriter, Recorder
from chaos.scenarios import RunContext
from chaos.workload import COUNTER_KEY, Intent, Journal, Profile


class FakeProc:
    """A client process as a schedule sees it: alive or not. ``on_look`` runs whenever a
    schedule asks whether it is alive."""

    def __init__(self, on_look: Callable[[], None] = lambda: None) -> None:
        self._on_look = on_look

    @property
    def alive(self) -> bool:
        self._on_look()
        return True


class FakeNode:
    def __init__(self, name: str, on_look: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.proc = FakeProc(on_look)


class FakeCluster:
    def __init__(self, clients: dict[str, FakeNode]) -> None:
        self.clients = clients


def context(tmp_path: Path, clients: dict[str, FakeNode], *, seconds: float = 30.0) -> RunContext:
    (tmp_path / "history").mkdir(exist_ok=True)
    return RunContext(
        cluster=cast(Cluster, FakeCluster(clients)),
        log=FaultLog(),
        rng=random.Random(1),
        resources=["r0"],
        profile=Profile(),
        journal_dir=tmp_path / "journal",
        deadline=time.monotonic() + seconds,
        history_dir=tmp_path / "history",
    )


def test_busy_workers_tolerates_clients_started_while_it_looks(tmp_path: Path) -> None:
    # The harness starts the clients while the schedule already polls them: here each
    # look at a client starts the next one, as the main thread may meanwhile.
    clients: dict[str, FakeNode] = {}

    def start_next() -> None:
        if len(clients) < 4:
            name = f"c{len(clients)}"
            clients[name] = FakeNode(name, start_next)

    start_next()
    Journal(tmp_path / "journal", "c3").note(Intent("job/chaos/1", 4, COUNTER_KEY, "1#c3/i1"))
    ctx = context(tmp_path, clients)
    found = next(ctx.busy_workers(needs_s=0.0))
    assert found.name == "c3"


def test_busy_workers_offers_each_prepared_write_once(tmp_path: Path) -> None:
    nodes = {"c0": FakeNode("c0"), "c1": FakeNode("c1")}
    journal = tmp_path / "journal"
    Journal(journal, "c0").note(Intent("job/chaos/1", 4, COUNTER_KEY, "1#c0/i1"))
    ctx = context(tmp_path, dict(nodes), seconds=1.0)
    workers = ctx.busy_workers(needs_s=0.0)
    assert next(workers).name == "c0"
    # c0 still has the same write noted (the strike missed it, the write is in flight):
    # the next strike waits for another prepared write, c1's here.
    Journal(journal, "c1").note(Intent("job/chaos/2", 5, COUNTER_KEY, "1#c1/i1"))
    assert next(workers).name == "c1"
    # c0's next write is a new note: offered again.
    Journal(journal, "c0").note(Intent("job/chaos/1", 4, COUNTER_KEY, "2#c0/i1,c0/i2"))
    assert next(workers).name == "c0"


def test_a_prepared_write_is_unsent_until_the_history_shows_it_invoked(tmp_path: Path) -> None:
    ctx = context(tmp_path, {})
    intent = Intent("job/chaos/1", 4, COUNTER_KEY, "1#c0/i1", "c0/i1", increment="c0/i1")
    assert ctx.unsent_write("c0") is None  # nothing prepared
    Journal(tmp_path / "journal", "c0").note(intent)
    with HistoryWriter(tmp_path / "history" / "c0.jsonl") as writer:
        rec = Recorder(writer.write, "c0")
        read = rec.invoke("read", intent.resource, key=COUNTER_KEY)
        rec.complete(read, "ok", value=None)
        assert ctx.unsent_write("c0") == intent
        fields = asdict(intent)
        rec.invoke("write", intent.resource, token=4, key=COUNTER_KEY, value=fields["value"])
        # Invoked (sent, or about to be): a strike now is too late.
        assert ctx.unsent_write("c0") is None


def test_the_follower_reads_whole_new_lines_and_pairs_them(tmp_path: Path) -> None:
    history = tmp_path / "history"
    history.mkdir()
    follower = HistoryFollower(history)
    assert follower.poll() == []
    with HistoryWriter(history / "c0.jsonl") as writer:
        rec = Recorder(writer.write, "c0")
        w = rec.invoke("write", "r0", token=3, key=COUNTER_KEY, value="1#c0/1")
        assert follower.poll() == []  # invoked, not completed
        rec.complete(w, "ok")
        done = follower.poll()
        assert [(i.op, c.type) for i, c in done] == [("write", "ok")]
        assert follower.acked_token("r0") == 3
        assert follower.poll() == []  # nothing new
    # A later file (another client) and a line still being written.
    with (history / "c1.jsonl").open("ab") as raw, HistoryWriter(history / "c2.jsonl") as w2:
        rec1 = Recorder(w2.write, "c2")
        r = rec1.invoke("read", "r0", key=COUNTER_KEY)
        since = time.monotonic_ns()
        rec1.complete(r, "ok", value="1#c0/1")
        raw.write(b'{"process": "c1", "op_id": "c1/x/1"')  # no newline yet
        raw.flush()
        assert [c.value for _, c in follower.poll()] == ["1#c0/1"]
    assert follower.read_since("r0", 0, frozenset({"1#c0/1"}))
    assert not follower.read_since("r0", since + 10**9, frozenset({"1#c0/1"}))
    assert not follower.read_since("r0", 0, frozenset({"2#c9/9"}))
    follower.poll()  # the unfinished line is neither an error nor an event
    writes = [(i.op, c.type) for i, c in follower.poll()]
    assert writes == []
    # A refused or unknown write is not acknowledged.
    with HistoryWriter(history / "c3.jsonl") as writer:
        rec3 = Recorder(writer.write, "c3")
        for outcome, token in (("fail", 9), ("info", 8)):
            op = rec3.invoke("write", "r0", token=token, key=COUNTER_KEY, value=f"x{token}")
            rec3.complete(op, outcome, error="STALE_TOKEN")
    follower.poll()
    assert follower.acked_token("r0") == 3
    assert follower.acked_token("r1") == 0
