"""The conformance driver of the asyncio Python SDK (``AsyncLeaseClient``, ``AsyncGuardClient``).

python -m conformance.drivers.python_async SCENARIO.json [KNOB]
"""

from __future__ import annotations

import asyncio
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
from fencing import AcquireTimeoutError, AsyncGuardClient, AsyncLeaseClient, AsyncQueueClient


class Driver:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.clients: dict[str, AsyncLeaseClient] = {}
        self.guard = AsyncGuardClient(ctx.guard_addr)
        self.queues: dict[str, AsyncQueueClient] = {}
        #: Background steps (``start``): the task and the step it runs.
        self.tasks: dict[str, tuple[asyncio.Task[Any], Step]] = {}

    def queue(self, name: str) -> AsyncQueueClient:
        if name not in self.queues:
            self.queues[name] = AsyncQueueClient(self.ctx.lease_addr, worker=name)
        return self.queues[name]

    def client(self, name: str) -> AsyncLeaseClient:
        if name not in self.clients:
            self.clients[name] = AsyncLeaseClient(self.ctx.lease_addr, holder=name)
        return self.clients[name]

    async def close(self) -> None:
        for c in self.clients.values():
            await c.aclose()
        for q in self.queues.values():
            await q.aclose()
        await self.guard.aclose()

    async def run(self, steps: list[Step]) -> None:
        for step in steps:
            await self.step(step)

    async def step(self, step: Step) -> None:
        if step["op"] == "raise":  # the body's own failure: it ends the body
            raise BodyError("the body failed")
        try:
            result = await self.act(step)
        except Mismatch:
            raise
        except Exception as exc:
            check_error(self.ctx, step, exc)
            return
        check_error(self.ctx, step, None)
        check_result(self.ctx, step, result or {})

    async def act(self, step: Step) -> dict[str, Any] | None:
        ctx, op = self.ctx, step["op"]
        if op in ("acquire", "acquire_nowait"):
            leases = self.client(step["client"])
            resource = ctx.resource(step["resource"])
            fence = [self.guard] if step.get("fence") and ctx.knob != "no_fence" else []
            ctx.requested_at[step["as"]] = (time.monotonic(), float(step["ttl"]))
            if op == "acquire" and step.get("requeue") and ctx.knob == "requeue":
                lease = await self.requeued(leases, resource, step)
            elif op == "acquire":
                lease = await leases.acquire(
                    resource, step["ttl"], step.get("timeout"), fence=fence
                )
            else:
                lease = await leases.acquire_nowait(resource, step["ttl"], fence=fence)
            ctx.leases[step["as"]] = lease
        elif op == "hold":
            await self.hold(step)
        elif op == "release":
            await ctx.leases[step["lease"]].release()
        elif op == "sleep":
            await asyncio.sleep(step["seconds"])
        elif op == "write":
            res = await self.guard.write(
                ctx.leases[step["lease"]],
                _put(step),
                idempotency_key=step.get("idem", ""),
            )
            return {"replayed": res.replayed, "replayed_by_token": res.replayed_by_token}
        elif op == "delete":
            await self.guard.delete(ctx.leases[step["lease"]], step["key"])
        elif op == "write_many":
            await self.guard.write_many([(ctx.leases[v], _put(step)) for v in step["leases"]])
        elif op == "read":
            rec = await self.guard.read(ctx.resource(step["resource"]), step["key"])
            return {"value": None if rec is None else rec.value.decode()}
        elif op == "enqueue":
            await self.queue("enqueuer").enqueue(
                ctx.queue(step["queue"]), step["payload"], resource=ctx.resource(step["resource"])
            )
        elif op == "claim":
            queue = self.queue(step["client"])
            jobs = await queue.claim(ctx.queue(step["queue"]), ttl=step["ttl"])
            if len(jobs) != 1:
                raise Mismatch(f"claimed {len(jobs)} jobs, not 1")
            ctx.leases[step["as"]] = jobs[0]
        elif op == "complete":
            await self.queue(step["client"]).complete(ctx.leases[step["job"]])
        elif op == "check":
            ctx.leases[step["lease"]].check()
            check_deadline_from_request(ctx, step["lease"])
        elif op == "start":
            inner = step["step"]
            self.tasks[step["task"]] = (asyncio.create_task(self.act(inner)), inner)
        elif op == "join":
            task, inner = self.tasks[step["task"]]
            try:
                result = await task
            except Exception as exc:
                judge(ctx, inner, exc, None)
            else:
                judge(ctx, inner, None, result)
        elif op == "pending":
            task, _ = self.tasks[step["task"]]
            if task.done():
                raise Mismatch(f"{step['task']} finished: it should still be waiting")
        elif op == "steal":
            lease = ctx.leases[step["lease"]]
            thief = self.client(step["client"])
            await thief.release(lease.resource, lease.token)
            await thief.acquire(lease.resource, 5)
        elif op == "raise":
            raise BodyError("the body failed")
        elif op == "fault":
            await asyncio.to_thread(send_fault, step["action"])
        elif op == "pause_process":
            pause_process(step["seconds"])
        else:
            raise ValueError(f"unknown op {op!r}")
        return None

    async def requeued(self, leases: AsyncLeaseClient, resource: str, step: Step) -> Any:
        deadline = time.monotonic() + step["timeout"]
        while True:
            try:
                return await leases.acquire(resource, step["ttl"], REQUEUE_WAIT_S)
            except AcquireTimeoutError:
                if time.monotonic() >= deadline:
                    raise

    async def hold(self, step: Step) -> None:
        leases = self.client(step["client"])
        resource = self.ctx.resource(step["resource"])
        if self.ctx.knob in ("no_renew", "no_release"):
            # The control: the rule broken (no session renewing it / no release on exit).
            lease = await leases.acquire(resource, step["ttl"], step.get("timeout"))
            self.ctx.leases[step["as"]] = lease
            await self.run(step["body"])
            if self.ctx.knob == "no_renew":
                await lease.release()
            return
        async with leases.hold(resource, step["ttl"], timeout=step.get("timeout")) as lease:
            self.ctx.leases[step["as"]] = lease
            await self.run(step["body"])


def _put(step: Step) -> Any:
    from fencing import Put

    return Put(step["key"], step["value"].encode())


async def amain() -> None:
    steps, ctx = load()
    driver = Driver(ctx)
    try:
        await driver.run(steps)
    except Exception as exc:  # a mismatch, or an error no step expected
        report(exc)
    else:
        report(None)
    finally:
        await driver.close()


if __name__ == "__main__":
    asyncio.run(amain())
