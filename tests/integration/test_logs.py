"""Structured logs: RFC 3339 UTC timestamps with milliseconds, what a line is about as
JSON keys, the start banner as JSON under --log-format json, a SIGTERM drain at INFO,
and a handler's exception logged once at ERROR with its traceback."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
from typing import Any

import grpc
import pytest

from fencing.client.async_lease import AsyncLeaseClient
from fencing.client.async_queue import AsyncQueueClient
from fencing.worker import AsyncWorker
from lease_server.backends.memory import MemoryBackend
from lease_server.server import start_lease_server
from serving.logs import ConsoleFormatter, JsonFormatter, rfc3339

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_timestamps_are_rfc3339_utc_with_milliseconds() -> None:
    assert rfc3339(0.25) == "1970-01-01T00:00:00.250Z"
    record = logging.makeLogRecord({"msg": "granted", "levelname": "INFO", "name": "x"})
    record.resource, record.token = "orders", 7
    line = json.loads(JsonFormatter().format(record))
    assert RFC3339_MS.match(line["ts"]) and line["resource"] == "orders" and line["token"] == 7
    text = ConsoleFormatter().format(record)
    assert RFC3339_MS.match(text.split(" ")[0]) and text.endswith("resource=orders token=7")


class Boom(MemoryBackend):
    async def describe(self, resource: str) -> Any:
        raise RuntimeError("boom: an internal detail")


async def test_a_handlers_exception_is_logged_once_at_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    server = await start_lease_server(Boom(), "127.0.0.1:0")
    try:
        async with AsyncLeaseClient(server.address, rpc_timeout=5) as client:
            with pytest.raises(grpc.RpcError) as err:
                await client.describe("r")
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "internal detail" not in str(err.value.details())
    finally:
        await server.stop(0)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is not None and "Describe" in errors[0].getMessage()


async def test_worker_lines_carry_queue_job_id_attempt_and_token_as_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fencing.worker")
    server = await start_lease_server(MemoryBackend(), "127.0.0.1:0", queue="memory://")
    try:
        async with AsyncQueueClient(server.address) as queue:
            job = await queue.enqueue("mail", b"x")
            done: list[int] = []

            async def handle(claimed: Any) -> None:
                done.append(claimed.id)
                worker.stop()

            worker = AsyncWorker(queue, "mail", handle, handle_signals=False)
            await worker.run()
    finally:
        await server.stop(0)
    assert done == [job.id]
    completed = [r for r in caplog.records if r.getMessage().startswith("job completed")]
    assert len(completed) == 1
    fields = vars(completed[0])
    assert (fields["queue"], fields["job_id"], fields["attempt"]) == ("mail", job.id, 1)
    assert fields["token"] > 0
    # Under plain logging (no formatter of ours) the message itself says which job;
    # the console format does not repeat what the message says.
    about = f"queue=mail job_id={job.id} attempt=1 token={fields['token']}"
    assert completed[0].getMessage() == f"job completed {about}"
    console = ConsoleFormatter().format(completed[0])
    assert console.count(f"job_id={job.id}") == 1 and console.endswith(about)
    # the handler's time is on the line that says it finished (its complete is sent
    # with the next claim, and "job completed" is logged when the verdict comes back)
    (finished,) = [r for r in caplog.records if r.getMessage().startswith("job finished")]
    assert vars(finished)["job_id"] == job.id and "took_s" in vars(finished)


def test_the_blocking_workers_lines_say_their_job_under_plain_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fencing.worker import sync

    caplog.set_level(logging.INFO, logger="fencing.worker")
    sync.log.warning("job lost: %s", "100% gone", extra={"queue": "q%s", "job_id": 3})
    (record,) = caplog.records
    assert record.getMessage() == "job lost: 100% gone queue=q%s job_id=3"
    assert vars(record)["job_id"] == 3


def test_a_json_server_prints_a_json_banner_and_drains_at_info() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lease_server", "--listen", "127.0.0.1:0", "--backend",
         "memory://", "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = json.loads(proc.stdout.readline())
        assert banner["msg"].startswith("lease server listening on ")
        assert banner["address"].startswith("127.0.0.1:") and RFC3339_MS.match(banner["ts"])
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert all(line.keys() >= {"ts", "level", "logger", "msg"} for line in lines)
    drain = [line for line in lines if "draining" in line["msg"]]
    assert drain and drain[0]["level"] == "INFO" and drain[0]["signal"] == "SIGTERM"
    assert not [line for line in lines if line["level"] in ("WARNING", "ERROR") and
                "durable" not in line["msg"]]  # fmt: skip
    for line in out.splitlines():
        json.loads(line)


def test_a_console_line_does_not_repeat_a_field_its_message_says() -> None:
    """A field whose text value the message already names (``SIGTERM: draining``,
    ``signal=SIGTERM``) is not written again; numbers are kept (a ``5`` in a message
    need not be the token), and the JSON line keeps every field."""
    record = logging.makeLogRecord(
        {"msg": "%s: draining", "args": ("SIGTERM",), "levelname": "INFO", "name": "x"}
    )
    record.signal, record.grace_s, record.token = "SIGTERM", 5.0, 5
    text = ConsoleFormatter().format(record)
    assert text.endswith("x: SIGTERM: draining grace_s=5.0 token=5"), text
    assert json.loads(JsonFormatter().format(record))["signal"] == "SIGTERM"
