import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import {
	AcquireTimeoutError,
	GuardClient,
	InvalidArgumentError,
	type Lease,
	LeaseClient,
	LeaseHeldError,
	LeaseLostError,
	type Transport,
} from "../src/index.js";
import { RenewalSchedule } from "../src/renewal.js";
import { type Stack, startStack, unique } from "./servers.js";

let stack: Stack;
before(async () => {
	stack = await startStack();
});
after(async () => {
	await stack.stop();
});

for (const transport of ["stream", "unary"] as Transport[]) {
	describe(`lease client over ${transport}`, () => {
		const client = (holder?: string): LeaseClient =>
			new LeaseClient(stack.lease.address, {
				transport,
				...(holder ? { holder } : {}),
			});

		test("acquire, check, release; the next grant carries a larger token", async () => {
			const leases = client();
			try {
				const resource = unique("basic");
				const first = await leases.acquire(resource, { ttl: 5 });
				first.check();
				assert.ok(first.remaining() > 4);
				assert.equal((await leases.describe(resource)).token, first.token);
				await first.release();
				assert.throws(() => first.check(), LeaseLostError);
				assert.equal(first.lost, false, "a released lease is not lost");
				const second = await leases.acquire(resource, { ttl: 5 });
				assert.ok(second.token > first.token);
				await second.release();
				assert.equal((await leases.describe(resource)).held, false);
			} finally {
				leases.close();
			}
		});

		test("a held resource: LeaseHeldError at once without wait, AcquireTimeoutError after a timeout", async () => {
			const a = client("A");
			const b = client("B");
			try {
				const resource = unique("held");
				await a.acquire(resource, { ttl: 10 });
				await assert.rejects(
					b.acquireNowait(resource, { ttl: 10 }),
					(err: unknown) => {
						assert.ok(err instanceof LeaseHeldError);
						assert.equal(err.holder, "A");
						return true;
					},
				);
				await assert.rejects(
					b.acquire(resource, { ttl: 10, timeout: 0.3 }),
					AcquireTimeoutError,
				);
			} finally {
				a.close();
				b.close();
			}
		});

		test("a grant after a wait longer than the ttl lives its ttl from the grant", async () => {
			const a = client("A");
			const b = client("B");
			try {
				const resource = unique("waited");
				const ttl = 1.0;
				let waiting: Promise<Lease> | undefined;
				await a.hold(resource, { ttl }, async () => {
					waiting = b.acquire(resource, { ttl, timeout: 10 });
					await delay(1500); // longer than the ttl (A renews): the waiter is in line all along
				});
				assert.ok(waiting !== undefined);
				const granted = await waiting;
				// Counted from the send, this lease would be past its deadline already.
				assert.ok(
					granted.remaining() > ttl / 2,
					`remaining ${granted.remaining()}`,
				);
				granted.check();
				// The control: the same grant timed from the request (the wait ignored) is dead on arrival.
				const fromSend = new RenewalSchedule(
					granted.ttlMs,
					0,
					granted.schedule.policy,
					0,
					0,
				);
				assert.equal(fromSend.expired(1.5), true);
				await granted.release();
			} finally {
				a.close();
				b.close();
			}
		});

		test("hold renews past the ttl and releases on exit, also when the body throws", async () => {
			const leases = client();
			try {
				const resource = unique("hold");
				const token = await leases.hold(
					resource,
					{ ttl: 0.6 },
					async (lease, signal) => {
						await delay(1500, undefined, { signal }); // 2.5 ttls: renewed meanwhile
						lease.check();
						return lease.token;
					},
				);
				assert.equal(
					(await leases.describe(resource)).held,
					false,
					"released on exit",
				);
				await assert.rejects(
					leases.hold(resource, { ttl: 5 }, async () => {
						throw new Error("boom");
					}),
					/boom/,
				);
				const state = await leases.describe(resource);
				assert.equal(state.held, false, "released after a throw");
				assert.ok(state.lastToken > token);
			} finally {
				leases.close();
			}
		});

		test("a lost lease aborts the body's signal and hold rejects with LeaseLostError", async () => {
			const leases = client();
			const other = client();
			try {
				const resource = unique("lost");
				let lostCalled = false;
				let abortedWith: unknown;
				const held = leases.hold(
					resource,
					{
						ttl: 0.9,
						onLost: () => {
							lostCalled = true;
						},
					},
					async (lease, signal) => {
						// Someone takes the lease from under us (an operator's release by token).
						await other.release(resource, lease.token);
						await other.acquire(resource, { ttl: 10 });
						try {
							await delay(10_000, undefined, { signal });
						} catch (err) {
							abortedWith = signal.reason;
							throw err;
						}
					},
				);
				await assert.rejects(held, LeaseLostError);
				assert.ok(abortedWith instanceof LeaseLostError);
				assert.ok(lostCalled);
			} finally {
				leases.close();
				other.close();
			}
		});

		test("the control: with its renewals stopped (client closed), a holder's lease expires", async () => {
			const leases = client();
			try {
				const resource = unique("expire");
				const lease = await leases.acquire(resource, { ttl: 0.5 });
				await delay(800);
				assert.throws(() => lease.check(), LeaseLostError);
				assert.equal(lease.signal.aborted, true);
				assert.equal((await leases.describe(resource)).held, false);
			} finally {
				leases.close();
			}
		});

		test("watch yields the resource's events", async () => {
			const leases = client();
			const ac = new AbortController();
			try {
				const resource = unique("watch");
				const seen: string[] = [];
				const events = leases.watch(resource, { signal: ac.signal });
				const reading = (async () => {
					for await (const ev of events) {
						seen.push(`${ev.kind}:${ev.token}`);
						if (ev.kind === "released") break;
					}
				})();
				await delay(300); // the stream is open before the lease moves
				const lease = await leases.acquire(resource, { ttl: 5 });
				await lease.release();
				await reading;
				assert.deepEqual(seen, [
					`acquired:${lease.token}`,
					`released:${lease.token}`,
				]);
			} finally {
				ac.abort();
				leases.close();
			}
		});

		test("fence on acquire promises the token to the guard before returning", async () => {
			const leases = client();
			const guard = new GuardClient(stack.guard.address);
			try {
				const resource = unique("promise");
				const lease = await leases.acquire(resource, {
					ttl: 5,
					fence: [guard],
				});
				assert.equal(await guard.describeFence(resource), lease.token);
				await lease.release();
			} finally {
				leases.close();
				guard.close();
			}
		});
	});
}

test("watch from afterRevision 0 replays the log from its first revision", async () => {
	const leases = new LeaseClient(stack.lease.address);
	const ac = new AbortController();
	try {
		const resource = unique("replay");
		const lease = await leases.acquire(resource, { ttl: 5 });
		await lease.release();
		// Both events happened before the stream opened: only a replay shows them.
		const seen: string[] = [];
		for await (const ev of leases.watch(resource, {
			afterRevision: 0,
			signal: ac.signal,
		})) {
			seen.push(`${ev.kind}:${ev.token}`);
			if (ev.kind === "released") break;
		}
		assert.deepEqual(seen, [
			`acquired:${lease.token}`,
			`released:${lease.token}`,
		]);
	} finally {
		ac.abort();
		leases.close();
	}
});

test("renew without a ttl keeps the lease's own", async () => {
	const leases = new LeaseClient(stack.lease.address);
	try {
		const resource = unique("own-ttl");
		const lease = await leases.acquire(resource, { ttl: 40 });
		assert.equal(await leases.renew(resource, lease.token), 40_000);
		assert.equal(await leases.renew(resource, lease.token, 20), 20_000);
		assert.equal(await leases.renew(resource, lease.token), 20_000);
		assert.equal((await leases.describe(resource)).ttlMs, 20_000);
		await lease.release();
	} finally {
		leases.close();
	}
});

test("bad input names the field", async () => {
	assert.throws(
		() =>
			new LeaseClient("127.0.0.1:1", {
				transport: "carrier-pigeon" as Transport,
			}),
		(err: unknown) => {
			assert.ok(err instanceof InvalidArgumentError);
			assert.equal(err.field, "transport");
			return true;
		},
	);
	assert.throws(
		() => new LeaseClient("10.0.0.1:1", { token: "secret" }),
		(err: unknown) => {
			assert.ok(err instanceof InvalidArgumentError);
			assert.equal(err.field, "token");
			return true;
		},
	);
	const leases = new LeaseClient(stack.lease.address);
	try {
		await assert.rejects(leases.acquire("x", { ttl: -1 }), (err: unknown) => {
			assert.ok(err instanceof InvalidArgumentError);
			assert.equal(err.field, "ttl");
			return true;
		});
	} finally {
		leases.close();
	}
});
