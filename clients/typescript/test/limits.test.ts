/**
 * The lease stream's in-flight limits, told by the server in the stream's initial
 * metadata: acquires waiting in line past the limit wait in the client (unsent), not
 * fail, and a held lease's renewals, counted apart, are never held up behind them. The
 * control counts every call in one limit, as a client ignoring the server's second limit
 * would: the renewal waits behind the acquires and the lease is lost.
 */
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { type Lease, LeaseClient } from "../src/index.js";
import { Stream } from "../src/transport.js";
import { type Stack, startStack, unique } from "./servers.js";

const LIMIT = 4;
const WAITERS = 2 * LIMIT;

let stack: Stack;
before(async () => {
	stack = await startStack(false, {
		lease: ["--session-max-in-flight", String(LIMIT)],
	});
});
after(async () => {
	await stack.stop();
});

type Room = (this: Stream, kind: string) => boolean;
const proto = Stream.prototype as unknown as { hasRoom: Room };
const hasRoom = proto.hasRoom;
afterEach(() => {
	proto.hasRoom = hasRoom;
});

/** `WAITERS` acquires wait on resources another client holds while this client holds a
 * lease of ttl 1.5 s for 3 s; then the other client lets go. */
async function waitersBesideAHeldLease(): Promise<{
	kept: boolean;
	granted: number;
	failed: string[];
}> {
	const other = new LeaseClient(stack.lease.address, { holder: "other" });
	const leases = new LeaseClient(stack.lease.address, {
		holder: "mine",
		transport: "stream",
	});
	const names = Array.from({ length: WAITERS }, () => unique("busy"));
	const held: Lease[] = [];
	try {
		for (const name of names) held.push(await other.acquire(name, { ttl: 30 }));
		let kept = false;
		let outcomes: PromiseSettledResult<Lease>[] = [];
		try {
			await leases.hold(unique("mine"), { ttl: 1.5 }, async (lease) => {
				const waiting = names.map((name) =>
					leases.acquire(name, { ttl: 30, timeout: 20 }),
				);
				const settled = Promise.allSettled(waiting);
				await delay(3000); // twice the ttl: only renewals keep it
				lease.check();
				kept = true;
				await Promise.all(held.map((l) => l.release()));
				outcomes = await settled;
			});
		} catch {
			kept = false; // the hold ended with an error: say so by what was kept
		}
		const granted = outcomes.filter((o) => o.status === "fulfilled");
		await Promise.all(
			granted.map((o) => (o as PromiseFulfilledResult<Lease>).value.release()),
		);
		return {
			kept,
			granted: granted.length,
			failed: outcomes
				.filter((o) => o.status === "rejected")
				.map((o) => String((o as PromiseRejectedResult).reason)),
		};
	} finally {
		await Promise.all(held.map((l) => l.release().catch(() => {})));
		leases.close();
		other.close();
	}
}

test("acquires past the server's limit wait in line and a held lease is renewed meanwhile", async () => {
	const { kept, granted, failed } = await waitersBesideAHeldLease();
	assert.ok(kept, "the held lease was lost while acquires waited");
	assert.deepEqual(failed, []);
	assert.equal(granted, WAITERS);
});

test("control: renewals counted with the acquires wait behind them and the lease is lost", async () => {
	proto.hasRoom = function (this: Stream): boolean {
		const self = this as unknown as {
			pending: Map<number, unknown>;
			maxInFlight: number;
		};
		return self.pending.size < self.maxInFlight;
	};
	const { kept } = await waitersBesideAHeldLease();
	assert.ok(
		!kept,
		"the lease was kept: the control did not hold up its renewals",
	);
});
