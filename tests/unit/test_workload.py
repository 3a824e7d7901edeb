"""The chaos workload's parts (clock, journal, profile) and one client against real servers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from chaos.checker import ViolationKind, check
from chaos.history import HistoryWriter, Recorder, pair_operations, read_history
from chaos.workload import (
    COUNTER_KEY,
    EFFECT_KEY,
    Client,
    Intent,
    Journal,
    Outcome,
    Profile,
    SkewedClock,
    client_of,
    parse_counter,
    parser,
    pending_write,
    process_name,
    record_final_reads,
)
from fencing import GuardClient, LeaseClient, Put
from fencing.testing import running_servers
from guard.fence import FenceMode


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_skewed_clock_runs_at_its_rate_and_jumps_by_its_offset() -> None:
    base = FakeTime()
    clock = SkewedClock(base)
    start = clock()
    base.now += 2
    assert clock() == pytest.approx(start + 2)
    clock.set(0.25, offset=-1.0)
    assert clock() == pytest.approx(start + 1)  # jumped back a second
    base.now += 4
    assert clock() == pytest.approx(start + 2)  # four real seconds, one local
    clock.set(1.0)
    base.now += 1
    assert clock() == pytest.approx(start + 3)  # back to real time without jumping back
    assert clock.rate == 1.0
    with pytest.raises(ValueError, match="rate"):
        clock.set(-1)


BASE_ARGS = [
    *("--name", "c0", "--lease", "a:1", "--guard", "b:2"),
    *("--history-dir", "h", "--journal-dir", "j", "--resources", "r0", "--duration", "1"),
]


def test_profile_flags_parse_back_to_the_profile() -> None:
    profile = Profile(ttl_ms=(700, 900), job_ms=(10, 20), check="job", guard_timeout_s=0.5)
    args = parser().parse_args([*BASE_ARGS, *profile.argv()])
    assert args.ttl_ms == profile.ttl_ms
    assert args.job_ms == profile.job_ms
    assert args.check == "job"
    assert args.guard_timeout == 0.5
    assert args.acquire_timeout == profile.acquire_timeout_s


def test_ranges_must_be_ordered() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--name", "c", "--ttl-ms", "900:100"])


def test_counter_values_and_process_names() -> None:
    assert parse_counter(None) == 0
    assert parse_counter("41#c2/7") == 41
    assert parse_counter("garbage") == 0
    assert process_name("c3", 0) == "c3"
    assert client_of(process_name("c3", 2)) == "c3"


def test_journal_holds_a_write_exactly_while_it_is_outstanding(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "c1")
    assert journal.pending() is None
    intent = Intent("r0", 7, COUNTER_KEY, "3#c1/9", None)
    journal.note(intent)
    assert pending_write(tmp_path, "c1")
    assert journal.pending() == intent
    journal.clear()
    journal.clear()  # idempotent
    assert not pending_write(tmp_path, "c1")


def client_args(tmp_path: Path, lease: str, guard: str, *extra: str, name: str = "c0") -> list[str]:
    return [
        *("--name", name, "--lease", lease, "--guard", guard),
        *("--history-dir", str(tmp_path / "history"), "--journal-dir", str(tmp_path / "j")),
        *("--resources", "r0,r1", "--seed", "3"),
        *Profile(job_ms=(50, 150), step_ms=(5, 20), idle_ms=(0, 5)).argv(),
        *extra,
    ]


def test_clients_against_real_servers_leave_a_valid_history(tmp_path: Path) -> None:
    with running_servers() as servers:
        clients = [
            Client(
                parser().parse_args(
                    client_args(
                        tmp_path,
                        servers.lease_address,
                        servers.guard_address,
                        "--duration",
                        "1.0",
                        name=f"c{i}",
                    )
                )
            )
            for i in range(3)
        ]
        threads = [threading.Thread(target=c.run) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for c in clients:
            c.close()
        assert record_final_reads(servers.guard_address, ["r0", "r1"], tmp_path / "history") == 4
    events = read_history(tmp_path / "history")
    result = check(events, mode="monotonic")
    assert result.valid, result.summary()
    ops = pair_operations(events)
    assert {o.op for o in ops} >= {"acquire", "read", "write", "release"}
    writes = [o for o in ops if o.op == "write" and o.ok]
    assert any(o.key == EFFECT_KEY and o.idempotency_key for o in writes)
    acquires = [o for o in ops if o.op == "acquire" and o.ok]
    assert all(isinstance(o.extra.get("ttl_ms"), int) for o in acquires)
    finals = [o for o in ops if o.extra.get("final") == 1]
    assert len(finals) == 4


@pytest.mark.parametrize("mode", [FenceMode.MONOTONIC, FenceMode.OFF])
def test_restarted_client_resends_its_journal_and_the_guard_judges_it(
    tmp_path: Path, mode: FenceMode
) -> None:
    history = tmp_path / "history"
    history.mkdir()
    with (
        running_servers(mode=mode) as servers,
        GuardClient(servers.guard_address) as guard,
        LeaseClient(servers.lease_address, holder="other") as leases,
        HistoryWriter(history / "other.jsonl") as writer,
    ):
        rec = Recorder(writer.write, "other")
        # The dead incarnation of c0 prepared a write under token 1; since then a
        # newer holder took over and wrote.
        leases.acquire("r0", ttl=0.5).release()
        op = rec.invoke("acquire", "r0", ttl_ms=5000)
        newer = leases.acquire("r0", ttl=5)
        rec.complete(op, "ok", token=newer.token, ttl_ms=5000)
        op = rec.invoke("write", "r0", token=newer.token, key=COUNTER_KEY, value="5#other/1")
        guard.write(newer, Put(COUNTER_KEY, b"5#other/1"))
        rec.complete(op, "ok")
        Journal(tmp_path / "j", "c0").note(Intent("r0", 1, COUNTER_KEY, "1#c0/1", None))
        args = client_args(
            tmp_path,
            servers.lease_address,
            servers.guard_address,
            *("--duration", "0", "--incarnation", "1"),
        )
        client = Client(parser().parse_args(args))
        client.run()
        client.close()
        record = guard.read("r0", COUNTER_KEY)
        newer.release()
    assert not pending_write(tmp_path / "j", "c0")
    events = read_history(history)
    replay = next(o for o in pair_operations(events) if o.extra.get("replay") == 1)
    assert replay.process == "c0~1"
    assert replay.token == 1
    assert record is not None
    result = check(events, mode="monotonic")
    if mode is FenceMode.MONOTONIC:
        assert (replay.type, replay.error) == ("fail", "STALE_TOKEN")
        assert record.value == b"5#other/1"
        assert result.valid, result.summary()
    else:
        assert replay.ok
        assert record.value == b"1#c0/1"
        assert result.kinds() == {ViolationKind.STALE_WRITE_ACCEPTED}


def test_a_write_that_fails_without_a_refusal_is_recorded_as_unknown(tmp_path: Path) -> None:
    # A closed channel (or a reset connection) says nothing about whether the
    # request reached the guard: the checker must not trust it to have had no effect.
    with running_servers() as servers:
        args = client_args(
            tmp_path, servers.lease_address, servers.guard_address, "--duration", "0"
        )
        client = Client(parser().parse_args(args))
        with LeaseClient(servers.lease_address, holder="c0") as leases:
            lease = leases.acquire("r0", ttl=5)
            client.guard.close()
            outcome = client.write(lease, Intent("r0", lease.token, COUNTER_KEY, "1#c0/1"))
            lease.release()
        client.close()
    (write,) = [o for o in pair_operations(read_history(tmp_path / "history")) if o.op == "write"]
    assert outcome is Outcome.UNKNOWN
    assert write.type == "info", write.error


def run_counter_clients(tmp_path: Path, lease: str, guard: str, n: int = 3) -> None:
    clients = [
        Client(
            parser().parse_args(
                client_args(
                    tmp_path,
                    lease,
                    guard,
                    "--duration",
                    "1.0",
                    "--workload",
                    "counter",
                    name=f"c{i}",
                )
            )
        )
        for i in range(n)
    ]
    threads = [threading.Thread(target=c.run) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in clients:
        c.close()


def test_counter_clients_keep_every_acknowledged_increment(tmp_path: Path) -> None:
    with running_servers() as servers:
        run_counter_clients(tmp_path, servers.lease_address, servers.guard_address)
        assert record_final_reads(servers.guard_address, ["r0", "r1"], tmp_path / "history") == 4
    events = read_history(tmp_path / "history")
    result = check(events, mode="monotonic")
    assert result.valid, result.summary()
    ops = pair_operations(events)
    incs = [o for o in ops if o.op == "write" and "increment" in o.extra]
    assert incs and all(o.key == COUNTER_KEY for o in incs)
    assert not [o for o in ops if o.op == "write" and o.key == EFFECT_KEY]
    finals = {
        o.resource: o.value for o in ops if o.extra.get("final") == 1 and o.key == COUNTER_KEY
    }
    listed = {x for v in finals.values() if v for x in v.split("#", 1)[1].split(",")}
    assert {o.extra["increment"] for o in incs if o.ok} <= listed
    for value in finals.values():
        if value:
            count, ids = value.split("#", 1)
            assert int(count) == len(ids.split(","))


@pytest.mark.parametrize("mode", [FenceMode.MONOTONIC, FenceMode.OFF])
def test_a_late_increment_loses_the_newer_holders_unless_fenced(
    tmp_path: Path, mode: FenceMode
) -> None:
    # c0's dead incarnation read "0#", prepared increment c0/i1 under token 1 and
    # never sent it; a newer holder then incremented. Restarted, c0 re-sends it.
    history = tmp_path / "history"
    history.mkdir()
    with (
        running_servers(mode=mode) as servers,
        GuardClient(servers.guard_address) as guard,
        LeaseClient(servers.lease_address, holder="other") as leases,
        HistoryWriter(history / "other.jsonl") as writer,
    ):
        rec = Recorder(writer.write, "other")
        leases.acquire("r0", ttl=0.5).release()
        newer = leases.acquire("r0", ttl=5)
        op = rec.invoke(
            "write", "r0", token=newer.token, key=COUNTER_KEY, value="1#o/i1", increment="o/i1"
        )
        guard.write(newer, Put(COUNTER_KEY, b"1#o/i1"))
        rec.complete(op, "ok")
        Journal(tmp_path / "j", "c0").note(
            Intent("r0", 1, COUNTER_KEY, "1#c0/i1", "c0/i1", increment="c0/i1")
        )
        args = client_args(
            tmp_path,
            servers.lease_address,
            servers.guard_address,
            *("--duration", "0", "--incarnation", "1", "--workload", "counter"),
        )
        client = Client(parser().parse_args(args))
        client.run()
        client.close()
        newer.release()
        record_final_reads(servers.guard_address, ["r0"], history, keys=[COUNTER_KEY])
    result = check(read_history(history), mode="monotonic")
    if mode is FenceMode.MONOTONIC:
        assert result.valid, result.summary()
    else:
        assert ViolationKind.LOST_UPDATE in result.kinds(), result.summary()
        lost = next(v for v in result.violations if v.kind == ViolationKind.LOST_UPDATE)
        assert "o/i1" in lost.detail or lost.op_ids[0] == op


def test_job_clients_fence_each_job_by_its_claim(tmp_path: Path) -> None:
    with running_servers() as servers:
        clients = [
            Client(
                parser().parse_args(
                    client_args(
                        tmp_path,
                        servers.lease_address,
                        servers.guard_address,
                        *("--duration", "1.0", "--workload", "jobs"),
                        name=f"c{i}",
                    )
                )
            )
            for i in range(2)
        ]
        threads = [threading.Thread(target=c.run) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for c in clients:
            c.close()
        ops = pair_operations(read_history(tmp_path / "history"))
        claimed = sorted({o.resource for o in ops if o.op == "acquire" and o.ok})
        record_final_reads(servers.guard_address, claimed, tmp_path / "history")
    events = read_history(tmp_path / "history")
    result = check(events, mode="monotonic")
    assert result.valid, result.summary()
    ops = pair_operations(events)
    assert claimed and all(r.startswith("job/chaos/") for r in claimed)
    incs = [o for o in ops if o.op == "write" and o.ok and "increment" in o.extra]
    assert incs and {o.resource for o in incs} <= set(claimed)
    done = [o for o in ops if o.op == "release" and o.ok]
    assert done, "no job was completed"
    # Each increment carries the token of its own process's claim of that job.
    claims = {(o.process, o.resource, o.token) for o in ops if o.op == "acquire" and o.ok}
    assert all((o.process, o.resource, o.token) in claims for o in incs)
