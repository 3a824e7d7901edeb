"""The conformance driver of the blocking Python SDK (``LeaseClient``, ``GuardClient``).

python -m conformance.drivers.python_sync SCENARIO.json [KNOB]
"""

from __future__ import annotations

import threading
import time
from typing import Any

from conformance.drivers._common import (
    REQUEUE_WAIT_S,
    BodyError,
    Context,
    Mismatch,
    Step,
    check_deadline_from_request,
    check_error,
    check_result,
    judge,
    load,
    pause_process,
    report,
    send_fault,
)
from fencing import AcquireTimeoutError, GuardClient, LeaseClient, QueueClient


class Driver:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.clients: dict[str, LeaseClient] = {}
        self.guard = GuardClient(ctx.guard_addr)
        self.queues: dict[str, QueueClient] = {}
        #: Background steps (``start``): the thread and, once it ended, (error, result).
        self.tasks: dict[str, tuple[threading.Thread, Step, list[Any]]] = {}

    def queue(self, name: str) -> QueueClient:
        if name not in self.queues:
            self.queues[name] = QueueClient(self.ctx.lease_addr, worker=name)
        return self.queues[name]

    def client(self, name: str) -> LeaseClient:
        if name not in self.clients:
            self.clients[name] = LeaseClient(self.ctx.lease_addr, holder=name)
        return self.clients[name]

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        for q in self.queues.values():
            q.close()
        self.guard.close()

    def run(self, steps: list[Step]) -> None:
        for step in steps:
            self.step(step)

    def step(self, step: Step) -> None:
        if step["op"] == "raise":  # the body's own failure: it ends the body
            raise BodyError("the body failed")
        try:
            result = self.act(step)
        except Mismatch:
            raise
        except Exception as exc:
            check_error(self.ctx, step, exc)
            return
        check_error(self.ctx, step, None)
        check_result(self.ctx, step, result or {})

    def act(self, step: Step) -> dict[str, Any] | None:
        ctx, op = self.ctx, step["op"]
        if op in ("acquire", "acquire_nowait"):
            leases = self.client(step["client"])
            resource = ctx.resource(step["resource"])
            fence = [self.guard] if step.get("fence") and ctx.knob != "no_fence" else []
            ctx.requested_at[step["as"]] = (time.monotonic(), float(step["ttl"]))
            if op == "acquire" and step.get("requeue") and ctx.knob == "requeue":
                lease = self.requeued(leases, resource, step)
            elif op == "acquire":
                lease = leases.acquire(resource, step["ttl"], step.get("timeout"), fence=fence)
            else:
                lease = leases.acquire_nowait(resource, step["ttl"], fence=fence)
            ctx.leases[step["as"]] = lease
        elif op == "hold":
            self.hold(step)
        elif op == "release":
            ctx.leases[step["lease"]].release()
        elif op == "sleep":
            time.sleep(step["seconds"])
        elif op == "write":
            res = self.guard.write(
                ctx.leases[step["lease"]],
                _put(step),
                idempotency_key=step.get("idem", ""),
            )
            return {"replayed": res.replayed, "replayed_by_token": res.replayed_by_token}
        elif op == "delete":
            self.guard.delete(ctx.leases[step["lease"]], step["key"])
        elif op == "write_many":
            self.guard.write_many([(ctx.leases[v], _put(step)) for v in step["leases"]])
        elif op == "read":
            rec = self.guard.read(ctx.resource(step["resource"]), step["key"])
            return {"value": None if rec is None else rec.value.decode()}
        elif op == "enqueue":
            self.queue("enqueuer").enqueue(
                ctx.queue(step["queue"]), step["payload"], resource=ctx.resource(step["resource"])
            )
        elif op == "claim":
            jobs = self.queue(step["client"]).claim(ctx.queue(step["queue"]), ttl=step["ttl"])
            if len(jobs) != 1:
                raise Mismatch(f"claimed {len(jobs)} jobs, not 1")
            ctx.leases[step["as"]] = jobs[0]
        elif op == "complete":
            self.queue(step["client"]).complete(ctx.leases[step["job"]])
        elif op == "check":
            ctx.leases[step["lease"]].check()
            check_deadline_from_request(ctx, step["lease"])
        elif op == "start":
            outcome: list[Any] = []
            inner = step["step"]

            def background() -> None:
                try:
                    outcome.extend([None, self.act(inner)])
                except Exception as exc:
                    outcome.extend([exc, None])

            thread = threading.Thread(target=background, daemon=True)
            self.tasks[step["task"]] = (thread, inner, outcome)
            thread.start()
        elif op == "join":
            thread, inner, outcome = self.tasks[step["task"]]
            thread.join()
            judge(ctx, inner, outcome[0], outcome[1])
        elif op == "pending":
            thread, _, _ = self.tasks[step["task"]]
            if not thread.is_alive():
                raise Mismatch(f"{step['task']} finished: it should still be waiting")
        elif op == "steal":
            lease = ctx.leases[step["lease"]]
            thief = self.client(step["client"])
            thief.release(lease.resource, lease.token)
            thief.acquire(lease.resource, 5)
        elif op == "raise":
            raise BodyError("the body failed")
        elif op == "fault":
            send_fault(step["action"])
        elif op == "pause_process":
            pause_process(step["seconds"])
        else:
            raise ValueError(f"unknown op {op!r}")
        return None

    def requeued(self, leases: LeaseClient, resource: str, step: Step) -> Any:
        deadline = time.monotonic() + step["timeout"]
        while True:
            try:
                return leases.acquire(resource, step["ttl"], REQUEUE_WAIT_S)
            except AcquireTimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def hold(self, step: Step) -> None:
        leases = self.client(step["client"])
        resource = self.ctx.resource(step["resource"])
        if self.ctx.knob in ("no_renew", "no_release"):
            # The control: the rule broken (no session renewing it / no release on exit).
            lease = leases.acquire(resource, step["ttl"], step.get("timeout"))
            self.ctx.leases[step["as"]] = lease
            self.run(step["body"])
            if self.ctx.knob == "no_renew":
                lease.release()
            return
        with leases.hold(resource, step["ttl"], timeout=step.get("timeout")) as lease:
            self.ctx.leases[step["as"]] = lease
            self.run(step["body"])


def _put(step: Step) -> Any:
    from fencing import Put

    return Put(step["key"], step["value"].encode())


def main() -> None:
    steps, ctx = load()
    driver = Driver(ctx)
    try:
        driver.run(steps)
    except Exception as exc:  # a mismatch, or an error no step expected
        report(exc)
    else:
        report(None)
    finally:
        driver.close()


if __name__ == "__main__":
    main()
