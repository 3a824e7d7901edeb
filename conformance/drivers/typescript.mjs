// The conformance driver of the TypeScript SDK (clients/typescript, built), through its
// public API only (the package's index).
//
//   node conformance/drivers/typescript.mjs SCENARIO.json [KNOB]
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import {
  AcquireTimeoutError,
  GuardClient,
  LeaseClient,
  LeaseHeldError,
  LeaseLostError,
  QueueClient,
  StaleTokenError,
} from "../../clients/typescript/dist/src/index.js";

class Mismatch extends Error {
  name = "Mismatch";
}
class BodyError extends Error {}

const [scenarioPath, knob = ""] = process.argv.slice(2);
const scenario = JSON.parse(readFileSync(scenarioPath, "utf8"));
const env = process.env;
const ctx = {
  leaseAddr: env.CONFORMANCE_LEASE,
  guardAddr: knob === "unfenced" ? env.CONFORMANCE_UNFENCED : env.CONFORMANCE_GUARD,
  prefix: env.CONFORMANCE_PREFIX,
  leases: new Map(),
  // When each lease's acquire was sent and its ttl (the request_deadline control).
  requestedAt: new Map(),
};
// Background steps (start): the promise of its outcome and the step it runs.
const tasks = new Map();
// The requeue control: an acquire that gives up its place in line and asks again.
const REQUEUE_WAIT_S = 0.2;
const clients = new Map();
const guard = new GuardClient(ctx.guardAddr);
const client = (name) => {
  if (!clients.has(name)) {
    const leases = new LeaseClient(ctx.leaseAddr, { holder: name });
    if (knob === "fresh_request_id") {
      // The control: every attempt of an acquire a new request id, as an SDK whose retry
      // is a new request would, so the server cannot tell a retry from another acquire.
      const send = leases.calls.acquire.bind(leases.calls);
      leases.calls.acquire = (req, timeout) =>
        send({ ...req, requestId: randomBytes(16).toString("hex") }, timeout);
    }
    clients.set(name, leases);
  }
  return clients.get(name);
};

// Act on the link to the lease server (a fault step): one line to the runner's fault
// proxy, which answers once the fault is in force.
function sendFault(action) {
  const [host, port] = (env.CONFORMANCE_FAULTS ?? "").split(/:(?=[^:]*$)/);
  if (!port) throw new Error('a fault step needs "lease_via_fault_proxy": true in its scenario');
  return new Promise((resolve, reject) => {
    const conn = connect(Number(port), host, () => conn.write(`${action}\n`));
    let answer = "";
    conn.on("data", (chunk) => {
      answer += chunk.toString();
      if (!answer.includes("\n")) return;
      conn.end();
      answer.trim() === "ok" ? resolve() : reject(new Error(`fault ${action}: ${answer.trim()}`));
    });
    conn.on("error", reject);
  });
}
const resource = (name) => `${ctx.prefix}/${name}`;
const queueName = (name) => `${ctx.prefix}-${name}`;
const queues = new Map();
const queue = () => {
  if (!queues.has("q")) queues.set("q", new QueueClient(ctx.leaseAddr));
  return queues.get("q");
};
const tokenOf = (v) => ctx.leases.get(v).token;

function errorName(err) {
  if (err instanceof StaleTokenError) return "StaleToken";
  if (err instanceof LeaseHeldError) return "LeaseHeld";
  if (err instanceof LeaseLostError) return "LeaseLost";
  if (err instanceof BodyError) return "Body";
  return err?.name ?? String(err);
}

function checkError(step, err) {
  const expect = step.expect ?? {};
  const want = expect.error;
  if (err === null) {
    if (want !== undefined) throw new Mismatch(`expected ${want}, got success`);
    return;
  }
  if (want === undefined || errorName(err) !== want) {
    throw new Mismatch(`expected ${want ?? "success"}, got ${errorName(err)}: ${err.message}`);
  }
  if ("current_token_of" in expect && err.currentToken !== tokenOf(expect.current_token_of)) {
    throw new Mismatch(`currentToken ${err.currentToken}`);
  }
  if ("key_applied" in expect && err.keyApplied !== expect.key_applied) {
    throw new Mismatch(`keyApplied ${err.keyApplied}`);
  }
  if ("applied_by_of" in expect && err.appliedByToken !== tokenOf(expect.applied_by_of)) {
    throw new Mismatch(`appliedByToken ${err.appliedByToken}`);
  }
}

function checkResult(step, result) {
  const expect = step.expect ?? {};
  if ("replayed" in expect && result.replayed !== expect.replayed) throw new Mismatch(`replayed ${result.replayed}`);
  if ("replayed_by_of" in expect && result.replayedByToken !== tokenOf(expect.replayed_by_of)) {
    throw new Mismatch(`replayedByToken ${result.replayedByToken}`);
  }
  if ("value" in expect && result.value !== expect.value) throw new Mismatch(`value ${result.value}`);
}

function judge(step, err, result) {
  if (err instanceof Mismatch) throw err;
  checkError(step, err);
  if (err === null) checkResult(step, result ?? {});
}

async function run(steps) {
  for (const step of steps) {
    if (step.op === "raise") throw new BodyError("the body failed"); // ends the body
    let result;
    try {
      result = await act(step);
    } catch (err) {
      judge(step, err, null);
      continue;
    }
    judge(step, null, result);
  }
}

async function requeued(leases, name, opts, timeout) {
  const deadline = performance.now() + timeout * 1000;
  for (;;) {
    try {
      return await leases.acquire(name, { ...opts, timeout: REQUEUE_WAIT_S });
    } catch (err) {
      if (!(err instanceof AcquireTimeoutError) || performance.now() >= deadline) throw err;
    }
  }
}

async function act(step) {
  switch (step.op) {
    case "acquire":
    case "acquire_nowait": {
      const leases = client(step.client);
      const opts = { ttl: step.ttl, fence: step.fence && knob !== "no_fence" ? [guard] : [] };
      if (step.timeout !== undefined) opts.timeout = step.timeout;
      ctx.requestedAt.set(step.as, [performance.now(), step.ttl]);
      let lease;
      if (step.op === "acquire" && step.requeue && knob === "requeue") {
        lease = await requeued(leases, resource(step.resource), { ttl: step.ttl }, step.timeout);
      } else if (step.op === "acquire") {
        lease = await leases.acquire(resource(step.resource), opts);
      } else {
        lease = await leases.acquireNowait(resource(step.resource), opts);
      }
      ctx.leases.set(step.as, lease);
      return;
    }
    case "hold":
      return hold(step);
    case "release":
      return ctx.leases.get(step.lease).release();
    case "sleep":
      return sleep(step.seconds * 1000);
    case "write": {
      const res = await guard.write(
        ctx.leases.get(step.lease),
        { type: "put", key: step.key, value: step.value },
        { idempotencyKey: step.idem ?? "" },
      );
      return res;
    }
    case "delete":
      await guard.delete(ctx.leases.get(step.lease), step.key);
      return;
    case "write_many":
      await guard.writeMany(
        step.leases.map((v) => [ctx.leases.get(v), { type: "put", key: step.key, value: step.value }]),
      );
      return;
    case "read": {
      const rec = await guard.read(resource(step.resource), step.key);
      return { value: rec === null ? null : rec.value.toString() };
    }
    case "enqueue":
      await queue().enqueue(queueName(step.queue), [
        { payload: Buffer.from(step.payload), resource: resource(step.resource) },
      ]);
      return;
    case "claim": {
      const jobs = await queue().claim(queueName(step.queue), { ttl: step.ttl, worker: step.client });
      if (jobs.length !== 1) throw new Mismatch(`claimed ${jobs.length} jobs, not 1`);
      ctx.leases.set(step.as, jobs[0]);
      return;
    }
    case "complete":
      await queue().complete([ctx.leases.get(step.job)]);
      return;
    case "check": {
      const lease = ctx.leases.get(step.lease);
      lease.check();
      const sent = ctx.requestedAt.get(step.lease);
      // The request_deadline control: the lease's life counted from its request.
      if (knob === "request_deadline" && sent && performance.now() - sent[0] > sent[1] * 1000) {
        throw new LeaseLostError("the deadline counted from the request passed", {
          resource: lease.resource,
          token: lease.token,
        });
      }
      return;
    }
    case "start": {
      const inner = step.step;
      const outcome = act(inner).then(
        (result) => ({ err: null, result, done: true }),
        (err) => ({ err, result: null, done: true }),
      );
      const task = { inner, outcome, done: false };
      outcome.then(() => {
        task.done = true;
      });
      tasks.set(step.task, task);
      return;
    }
    case "join": {
      const task = tasks.get(step.task);
      const { err, result } = await task.outcome;
      judge(task.inner, err, result);
      return;
    }
    case "pending":
      if (tasks.get(step.task).done) throw new Mismatch(`${step.task} finished: it should still be waiting`);
      return;
    case "steal": {
      const lease = ctx.leases.get(step.lease);
      const thief = client(step.client);
      await thief.release(lease.resource, lease.token);
      await thief.acquire(lease.resource, { ttl: 5 });
      return;
    }
    case "raise":
      throw new BodyError("the body failed");
    case "fault":
      return sendFault(step.action);
    case "pause_process":
      // Freeze this whole process (its event loop: renewals and timers too); a helper resumes it.
      spawn("sh", ["-c", `sleep ${step.seconds}; kill -CONT ${process.pid}`], { stdio: "ignore" });
      process.kill(process.pid, "SIGSTOP");
      return;
    default:
      throw new Error(`unknown op ${step.op}`);
  }
}

async function hold(step) {
  const leases = client(step.client);
  const opts = { ttl: step.ttl };
  if (step.timeout !== undefined) opts.timeout = step.timeout;
  if (knob === "no_renew" || knob === "no_release") {
    // The control: the rule broken (no session renewing it / no release on exit).
    const lease = await leases.acquire(resource(step.resource), opts);
    ctx.leases.set(step.as, lease);
    await run(step.body);
    if (knob === "no_renew") await lease.release();
    return;
  }
  await leases.hold(resource(step.resource), opts, async (lease) => {
    ctx.leases.set(step.as, lease);
    await run(step.body);
  });
}

try {
  await run(scenario.steps);
  console.log(JSON.stringify({ ok: true }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, step: "", why: `${errorName(err)}: ${err.message}` }));
} finally {
  for (const c of clients.values()) c.close();
  for (const q of queues.values()) q.close();
  guard.close();
}
