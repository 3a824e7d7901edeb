"""The end of a soak does the jobs its workers left, and checker rule 9 sees every job.

Against a real lease server with its queue on SQLite: jobs a worker left (one ready,
one claimed by a worker that died, one done and acknowledged) are done by the drain and
listed ``succeeded``; the control skips the drain and rule 9 flags the two left undone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import ViolationKind, check
from chaos.history import HistoryWriter, Recorder, read_history
from chaos.workload import JOB_QUEUE, drain_and_record_jobs
from fencing import QueueClient
from fencing.testing import running_servers


@pytest.mark.parametrize("drain", [True, False], ids=["drained", "control-not-drained"])
def test_every_job_left_is_done_at_the_end_and_rule_9_judges_it(
    tmp_path: Path, drain: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    history = tmp_path / "history"
    history.mkdir()
    with (
        running_servers(url, url) as servers,
        QueueClient(servers.queue_address, worker="w0") as worker,
        HistoryWriter(history / "w0.jsonl") as writer,
    ):
        rec = Recorder(writer.write, "w0")
        for i in range(3):
            worker.enqueue(JOB_QUEUE, b"", idempotency_key=f"w0/j{i}")
        # One done and acknowledged, recorded as the soak's workers record it ...
        (done,) = worker.claim(JOB_QUEUE, ttl=30.0)
        op = rec.invoke("acquire", done.resource, ttl_ms=done.ttl_ms, job=done.id)
        rec.complete(op, "ok", token=done.token, ttl_ms=done.ttl_ms)
        op = rec.invoke("release", done.resource, token=done.token, job=done.id)
        worker.complete(done)
        rec.complete(op, "ok")
        # ... one claimed by a worker that then died (its claim expires), one never claimed.
        (dead,) = worker.claim(JOB_QUEUE, ttl=0.5)
        op = rec.invoke("acquire", dead.resource, ttl_ms=dead.ttl_ms, job=dead.id)
        rec.complete(op, "ok", token=dead.token, ttl_ms=dead.ttl_ms)

        drained, listed = drain_and_record_jobs(
            servers.queue_address, history, drain=drain, drain_s=20.0
        )
        states = {j.id: j.state for j in worker.list_jobs(JOB_QUEUE)}

    result = check(read_history(history), mode="strict")
    assert listed == 3
    if drain:
        assert drained == 2
        assert set(states.values()) == {"succeeded"}
        assert result.valid, result.summary()
    else:
        assert drained == 0
        assert sorted(states.values()) == ["ready", "running", "succeeded"]
        assert result.kinds() == {ViolationKind.JOB_NOT_DONE}
        assert len(result.violations) == 2
