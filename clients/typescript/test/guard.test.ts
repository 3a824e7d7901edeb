import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { GuardClient, LeaseClient, StaleTokenError } from "../src/index.js";
import { type Stack, startStack, unique } from "./servers.js";

let stack: Stack;
let leases: LeaseClient;
let guard: GuardClient;
let unfenced: GuardClient;
before(async () => {
	stack = await startStack(true);
	leases = new LeaseClient(stack.lease.address);
	guard = new GuardClient(stack.guard.address);
	unfenced = new GuardClient(stack.unfenced?.address ?? "");
});
after(async () => {
	leases.close();
	guard.close();
	unfenced.close();
	await stack.stop();
});

/** Two successive leases of one resource: the old one released, its token now stale. */
async function oldAndNew(resource: string) {
	const old = await leases.acquire(resource, { ttl: 5 });
	await old.release();
	const current = await leases.acquire(resource, { ttl: 5 });
	return { old, current };
}

test("put, read, delete under the lease's token", async () => {
	const resource = unique("rw");
	const lease = await leases.acquire(resource, { ttl: 5 });
	assert.equal(await guard.put(lease, "k", "v1"), lease.token);
	const rec = await guard.read(resource, "k");
	assert.equal(rec?.value.toString(), "v1");
	assert.equal(rec?.writtenByToken, lease.token);
	await guard.delete(lease, "k");
	assert.equal(await guard.read(resource, "k"), null);
	const res = await guard.write(lease, [
		{ type: "put", key: "a", value: "1" },
		{ type: "put", key: "b", value: new Uint8Array([50]) },
	]);
	assert.equal(res.fence, lease.token);
	assert.equal((await guard.read(resource, "b"))?.value.toString(), "2");
	await lease.release();
});

test("a stale write is refused with the current token; the unfenced control accepts it", async () => {
	const resource = unique("stale");
	const { old, current } = await oldAndNew(resource);
	for (const g of [guard, unfenced]) await g.put(current, "owner", "new");
	await assert.rejects(guard.put(old, "owner", "old"), (err: unknown) => {
		assert.ok(err instanceof StaleTokenError);
		assert.equal(err.currentToken, current.token);
		assert.equal(err.token, old.token);
		assert.equal(err.keyApplied, null);
		return true;
	});
	assert.equal(
		(await guard.read(resource, "owner"))?.value.toString(),
		"new",
		"nothing applied",
	);
	// The control: a guard with fencing off lets the stale holder overwrite the new one's data.
	await unfenced.put(old, "owner", "old");
	assert.equal(
		(await unfenced.read(resource, "owner"))?.value.toString(),
		"old",
	);
	await current.release();
});

test("an idempotent retry is a replay only for the current token", async () => {
	const resource = unique("idem");
	const old = await leases.acquire(resource, { ttl: 5 });
	const first = await guard.write(
		old,
		{ type: "put", key: "k", value: "1" },
		{ idempotencyKey: "op-1" },
	);
	assert.equal(first.replayed, false);
	const again = await guard.write(
		old,
		{ type: "put", key: "k", value: "1" },
		{ idempotencyKey: "op-1" },
	);
	assert.equal(again.replayed, true);
	assert.equal(again.replayedByToken, old.token);
	await old.release();
	const current = await leases.acquire(resource, { ttl: 5, fence: [guard] });
	await assert.rejects(
		guard.write(
			old,
			{ type: "put", key: "k", value: "1" },
			{ idempotencyKey: "op-1" },
		),
		(err: unknown) => {
			assert.ok(err instanceof StaleTokenError);
			assert.equal(err.currentToken, current.token);
			assert.equal(err.keyApplied, true);
			assert.equal(err.appliedByToken, old.token);
			return true;
		},
	);
	await current.release();
});

test("writeMany is all or nothing across resources", async () => {
	const r1 = unique("many-a");
	const r2 = unique("many-b");
	const a = await leases.acquire(r1, { ttl: 5 });
	const { old } = await oldAndNew(r2);
	const fresh = await leases.describe(r2);
	await guard.fence({ resource: r2, token: fresh.token });
	await assert.rejects(
		guard.writeMany([
			[a, { type: "put", key: "x", value: "1" }],
			[old, { type: "put", key: "x", value: "1" }],
		]),
		StaleTokenError,
	);
	assert.equal(await guard.read(r1, "x"), null, "nothing applied anywhere");
	const ok = await guard.writeMany([
		[a, { type: "put", key: "x", value: "1" }],
	]);
	assert.equal(ok.fences.get(r1), a.token);
	await a.release();
});
