import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import {
	GuardClient,
	LeaseLostError,
	QueueClient,
	StaleTokenError,
	Worker,
} from "../src/index.js";
import { type Stack, startStack, unique } from "./servers.js";

let stack: Stack;
let queue: QueueClient;
before(async () => {
	stack = await startStack(true);
	queue = new QueueClient(stack.lease.address);
});
after(async () => {
	queue.close();
	await stack.stop();
});

test("a worker runs jobs with concurrency, each handler writing under its claim's token", async () => {
	const name = unique("q-run");
	const guard = new GuardClient(stack.guard.address);
	try {
		await queue.enqueue(
			name,
			[1, 2, 3, 4].map((i) => ({ payload: `job-${i}` })),
		);
		const seen: string[] = [];
		let active = 0;
		let peak = 0;
		const worker = new Worker(
			queue,
			name,
			async (job) => {
				active += 1;
				peak = Math.max(peak, active);
				await guard.put(job, "done", job.payload);
				await delay(200);
				seen.push(job.payload.toString());
				active -= 1;
				if (seen.length === 4) void worker.stop();
			},
			{ concurrency: 2, ttl: 5 },
		);
		await worker.run();
		assert.deepEqual(seen.sort(), ["job-1", "job-2", "job-3", "job-4"]);
		assert.equal(peak, 2);
		assert.deepEqual(
			await queue.claim(name, { ttl: 5 }),
			[],
			"every job completed",
		);
	} finally {
		guard.close();
	}
});

test("heartbeats keep a claim past its ttl: nobody else gets the job meanwhile", async () => {
	const name = unique("q-beat");
	await queue.enqueue(name, [{ payload: "long" }]);
	let stolen: number | undefined;
	const worker = new Worker(
		queue,
		name,
		async (_job, signal) => {
			await delay(1800, undefined, { signal }); // 3 ttls
			stolen = (await queue.claim(name, { ttl: 5 })).length;
			void worker.stop();
		},
		{ ttl: 0.6 },
	);
	await worker.run();
	assert.equal(stolen, 0);
});

test("a rescued job's late complete and late write are refused; the unfenced control takes the write", async () => {
	const name = unique("q-rescue");
	const guard = new GuardClient(stack.guard.address);
	const unfenced = new GuardClient(stack.unfenced?.address ?? "");
	try {
		await queue.enqueue(name, [{ payload: "x" }]);
		const [first] = await queue.claim(name, { ttl: 0.5 });
		assert.ok(first);
		await delay(1000); // no heartbeat: the claim runs out
		const [second] = await queue.claim(name, { ttl: 5, wait: 5 });
		assert.ok(second);
		assert.equal(second.id, first.id);
		assert.ok(second.token > first.token);
		for (const g of [guard, unfenced]) await g.put(second, "result", "second");
		await assert.rejects(queue.complete([first]), LeaseLostError);
		await assert.rejects(
			guard.put(first, "result", "first"),
			(err: unknown) => {
				assert.ok(err instanceof StaleTokenError);
				assert.equal(err.currentToken, second.token);
				return true;
			},
		);
		await unfenced.put(first, "result", "first"); // the control: fencing off, the late write lands
		assert.equal(
			(await unfenced.read(second.resource, "result"))?.value.toString(),
			"first",
		);
		await queue.complete([second]);
	} finally {
		guard.close();
		unfenced.close();
	}
});

test("stop() aborts a handler that outlives the grace and releases its claim", async () => {
	const name = unique("q-stop");
	await queue.enqueue(name, [{ payload: "stuck" }]);
	let reason: unknown;
	let started!: () => void;
	const running = new Promise<void>((r) => {
		started = r;
	});
	const worker = new Worker(
		queue,
		name,
		async (_job, signal) => {
			started();
			await new Promise<void>((r) =>
				signal.addEventListener("abort", () => {
					reason = signal.reason;
					r();
				}),
			);
		},
		{ ttl: 30, grace: 0.2 },
	);
	const run = worker.run();
	await running;
	await worker.stop();
	await run;
	assert.ok(reason instanceof LeaseLostError);
	const again = await queue.claim(name, { ttl: 5 });
	assert.equal(
		again.length,
		1,
		"released: claimable at once, not after the 30 s ttl",
	);
});
