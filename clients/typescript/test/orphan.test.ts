/**
 * A retried acquire keeps the lease its abandoned attempts were granted. The lease server
 * is paused (SIGSTOP) past the client's deadline: the first attempt gives up, the retry
 * carries the same request id; on SIGCONT the server grants the first attempt and answers
 * the retry with the same lease. The grant nobody waited for is that very lease: releasing
 * it (the control, the rule before) frees the lease the caller now holds, and a second
 * client is granted the next token while the first still believes it holds its own.
 */
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { LeaseClient, LeaseHeldError } from "../src/index.js";
import { Acquires, StreamCalls } from "../src/transport.js";
import { type Stack, startStack, unique } from "./servers.js";

let stack: Stack;
before(async () => {
	stack = await startStack();
});
after(async () => {
	await stack.stop();
});

const keeps = Acquires.prototype.keeps;
afterEach(() => {
	Acquires.prototype.keeps = keeps;
});

/** The first client's acquire across the pause, then a second client's try. */
async function retriedAcquire(): Promise<{
	token: number;
	outcome: unknown;
	remembered: number;
}> {
	const first = new LeaseClient(stack.lease.address, {
		holder: "first",
		rpcTimeout: 0.5,
		transport: "stream",
	});
	const second = new LeaseClient(stack.lease.address, {
		holder: "second",
		transport: "stream",
	});
	const resource = unique("orphan");
	const proc = stack.lease.proc;
	try {
		// The stream is open before the pause, so every attempt is sent on it.
		await (await first.acquireNowait(unique("warm"), { ttl: 60 })).release();
		proc.kill("SIGSTOP");
		// The first attempt's wait ends at 1.5 s and its retry is sent; the server wakes
		// while the retry still waits.
		const resume = delay(2500).then(() => proc.kill("SIGCONT"));
		let lease: Awaited<ReturnType<LeaseClient["acquireNowait"]>>;
		try {
			lease = await first.acquireNowait(resource, { ttl: 60 });
		} finally {
			await resume;
		}
		await delay(500); // the releases the client decided on are sent and answered
		let outcome: unknown;
		try {
			outcome = await second.acquireNowait(resource, { ttl: 60 });
		} catch (err) {
			outcome = err;
		}
		lease.check(); // the first holder's own view: still held
		const calls = first.calls;
		assert.ok(calls instanceof StreamCalls);
		return { token: lease.token, outcome, remembered: calls.acquires.size };
	} finally {
		proc.kill("SIGCONT");
		first.close();
		second.close();
	}
}

test("a retried acquire keeps the lease its abandoned attempt was granted", async () => {
	const { outcome, remembered } = await retriedAcquire();
	assert.ok(
		outcome instanceof LeaseHeldError,
		`a second holder: ${JSON.stringify(outcome)}`,
	);
	assert.equal(outcome.holder, "first");
	assert.equal(remembered, 0); // nothing left in the book once the calls came back
});

test("control: releasing every abandoned grant makes two holders", async () => {
	Acquires.prototype.keeps = () => false;
	const { token, outcome } = await retriedAcquire();
	assert.ok(!(outcome instanceof Error), `refused: ${String(outcome)}`);
	assert.ok((outcome as { token: number }).token > token);
});

test("the book: a grant handed to a caller is kept, others are released when the acquire ends", () => {
	const book = new Acquires();
	const grant = { resource: "r", token: 7, holder: "h" } as Parameters<
		Acquires["handed"]
	>[1];
	const other = { ...grant, token: 8 };
	book.begin("id");
	book.sent("id");
	book.sent("id");
	assert.deepEqual(book.orphaned("id", grant), []); // parked: the acquire goes on
	book.gone("id");
	book.handed("id", grant);
	book.gone("id");
	assert.deepEqual(book.end("id"), []); // the caller holds it
	assert.equal(book.size, 0);
	book.begin("id2");
	book.sent("id2");
	assert.deepEqual(book.orphaned("id2", other), []);
	book.gone("id2");
	assert.deepEqual(book.end("id2"), [other]); // nobody took it
	assert.deepEqual(book.orphaned("", grant), [grant]); // no request id: nobody can
});
