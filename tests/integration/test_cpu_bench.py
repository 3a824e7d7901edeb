"""The CPU-per-operation benchmark runs its rows, with ``--old`` too, and divides each
operation by the floor of the messages it carries (no timing is asserted)."""

from __future__ import annotations

import os
import shutil

import pytest

from bench import cpu

OURS = [
    cpu.LEASE_EMPTY,
    cpu.LEASE_PING,
    cpu.GUARD_EMPTY,
    cpu.STREAMED,
    cpu.UNARY,
    cpu.SHARED,
    cpu.WRITE,
]


async def test_cpu_rows_beside_an_old_ref() -> None:
    rows = await cpu.run([2], 0.3, old="HEAD", rounds=1, uvloop=True, etcd=False)
    ours = OURS
    assert [(r.name, r.side) for r in rows] == [
        (cpu.ECHO_UNARY, ""),
        (cpu.ECHO_STREAM, ""),
        *((name, "new") for name in ours),
        *((name, cpu.MEMORY_SIDE) for name in ours),
        *((name, cpu.UVLOOP_SIDE) for name in ours),
        *((name, "old HEAD") for name in ours),
    ]
    assert all(r.rate > 0 and r.server_us > 0 and r.client_us > 0 for r in rows)
    for row in rows[2:]:
        # A shared stream's messages carry many calls: no floor to divide by.
        assert (cpu.ratios(row, rows) is None) == (row.name == cpu.SHARED), row.name
    assert {t for t, _, _ in cpu.targets(rows)} == {
        t for t, _, _ in cpu.targets([r for r in rows if r.side == "new" or not r.side])
    }
    assert len(cpu.targets(rows)) == 3
    table = cpu.markdown(rows, 2)
    assert table.count("\n| ") == len(rows) + 2  # the header, its rule and the rows
    # The loops side by side: one line per operation of the uvloop side.
    assert cpu.loops(rows).count("\n| ") == len(ours) + 1
    # Storage's share: the lease cycles and the write, on SQLite and on memory://.
    assert cpu.storage(rows).count("\n| ") == 4 + 1
    assert cpu.versus(rows) == []


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd is not installed")
async def test_cpu_rows_next_to_etcd_shared_and_pinned() -> None:
    rows = await cpu.run([2], 0.3, rounds=1, uvloop=False, etcd=True)
    pinned = [(r.name, r.side) for r in rows if r.side == cpu.PINNED_SIDE]
    assert pinned == [(cpu.ETCD, cpu.PINNED_SIDE), *((n, cpu.PINNED_SIDE) for n in cpu.VERSUS)]
    assert all(r.rate > 0 and r.server_us > 0 and r.client_us > 0 for r in rows)
    pairs = cpu.versus(rows)
    assert [(how, ours.name) for how, ours, _ in pairs] == [
        ("2 shared cores", cpu.STREAMED),
        ("2 shared cores", cpu.SHARED),
        ("pinned, a core each", cpu.STREAMED),
        ("pinned, a core each", cpu.SHARED),
    ]
    assert cpu.versus_markdown(rows).count("\n| ") == len(pairs) + 1
    # Three floor targets, three rate targets next to etcd and one CPU target.
    assert len(cpu.targets(rows)) == 7
    # The pinning is undone: this process runs on every CPU again.
    assert os.sched_getaffinity(0) == set(range(os.cpu_count() or 1))
