"""The CPU-per-operation benchmark runs its rows, with ``--old`` too, and divides each
operation by the floor of the messages it carries (no timing is asserted)."""

from __future__ import annotations

from bench import cpu


async def test_cpu_rows_beside_an_old_ref() -> None:
    rows = await cpu.run([2], 0.3, old="HEAD", rounds=1, uvloop=True)
    ours = [cpu.LEASE_EMPTY, cpu.LEASE_PING, cpu.GUARD_EMPTY, cpu.STREAMED, cpu.UNARY, cpu.WRITE]
    assert [(r.name, r.side) for r in rows] == [
        (cpu.ECHO_UNARY, ""),
        (cpu.ECHO_STREAM, ""),
        *((name, "new") for name in ours),
        *((name, cpu.UVLOOP_SIDE) for name in ours),
        *((name, "old HEAD") for name in ours),
    ]
    assert all(r.rate > 0 and r.server_us > 0 and r.client_us > 0 for r in rows)
    for row in rows[2:]:
        assert cpu.ratios(row, rows) is not None, row.name
    assert {t for t, _, _ in cpu.targets(rows)} == {
        t for t, _, _ in cpu.targets([r for r in rows if r.side == "new" or not r.side])
    }
    assert len(cpu.targets(rows)) == 3
    table = cpu.markdown(rows, 2)
    assert table.count("\n| ") == len(rows) + 2  # the header, its rule and the rows
    # The loops side by side: one line per operation of the uvloop side.
    assert cpu.loops(rows).count("\n| ") == len(ours) + 1
