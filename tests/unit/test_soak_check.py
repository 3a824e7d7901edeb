"""The soak's continuous check holds the epochs still open, not the whole run."""

from __future__ import annotations

import time
from pathlib import Path

from chaos.history import HistoryWriter, Recorder
from chaos.soak import ContinuousCheck

EPOCH_S = 100.0


def test_an_ended_epoch_is_judged_then_let_go_and_its_verdict_kept(tmp_path: Path) -> None:
    now = [0]

    def clock() -> int:
        now[0] += 1_000
        return now[0]

    with (
        HistoryWriter(tmp_path / "a.jsonl") as wa,
        HistoryWriter(tmp_path / "b.jsonl") as wb,
    ):
        a, b = Recorder(wa.write, "a", clock=clock), Recorder(wb.write, "b", clock=clock)
        # Epoch 10: two holders handed one token (a violation); epoch 11: a clean claim.
        for rec in (a, b):
            op = rec.invoke("acquire", "r0.e10", ttl_ms=1000)
            rec.complete(op, "ok", token=7, ttl_ms=1000)
        late = a.invoke("release", "r0.e10", token=7)
        op = b.invoke("acquire", "r0.e11", ttl_ms=1000)
        b.complete(op, "ok", token=1, ttl_ms=1000)
        checker = ContinuousCheck(tmp_path, "strict", 1.0, time.monotonic(), EPOCH_S)

        first = checker.check_now(now=11.5 * EPOCH_S)  # epoch 10 ended half an epoch ago
        assert (first["events"], first["violations"]) == (7, 1)
        assert first["kinds"] == ["duplicate-token"]
        assert checker.held() == 7

        second = checker.check_now(now=12.0 * EPOCH_S)  # and now a whole epoch ago
        assert (second["events"], second["violations"]) == (7, 1)
        assert checker.held() == 2  # epoch 11's acquire only

        # A straggler completes an operation of the epoch let go: left to the final check.
        a.complete(late, "ok")
        op = b.invoke("renew", "r0.e11", token=1, ttl_ms=1000)
        b.complete(op, "ok", ttl_ms=1000)
        third = checker.check_now(now=12.5 * EPOCH_S)
        assert (third["events"], third["violations"]) == (9, 1)
        assert third["kinds"] == ["duplicate-token"]
        assert checker.held() == 4


def test_without_epochs_everything_stays_open(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "a.jsonl") as w:
        rec = Recorder(w.write, "a")
        op = rec.invoke("acquire", "r0", ttl_ms=1000)
        rec.complete(op, "ok", token=1, ttl_ms=1000)
    checker = ContinuousCheck(tmp_path, "strict", 1.0, time.monotonic())
    assert checker.check_now(now=1e12)["events"] == 2
    assert checker.held() == 2
