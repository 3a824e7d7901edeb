/**
 * A paused holder: the whole holder process frozen (SIGSTOP: renewals, timers, all)
 * past its ttl while another client takes the lease over, then resumed. Its late write
 * must be refused by the guard with the current token; against a guard with fencing
 * off (the control) the same late write lands and overwrites the new holder's data.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { createInterface, type Interface } from "node:readline";
import { after, before, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { GuardClient, LeaseClient } from "../src/index.js";
import { type Stack, startStack, unique } from "./servers.js";

const CHILD = join(dirname(fileURLToPath(import.meta.url)), "holder_child.js");

let stack: Stack;
before(async () => {
	stack = await startStack(true);
});
after(async () => {
	await stack.stop();
});

function piped<T>(stream: T | null): T {
	if (stream === null) throw new Error("the child's stdio is not piped");
	return stream;
}

class Holder {
	readonly proc: ChildProcess;
	private readonly lines: Interface;
	private readonly buffered: string[] = [];
	private waiter: ((line: string) => void) | null = null;
	constructor(guardAddr: string, resource: string, ttl: number) {
		this.proc = spawn(
			process.execPath,
			[CHILD, stack.lease.address, guardAddr, resource, String(ttl)],
			{
				stdio: ["pipe", "pipe", "inherit"],
			},
		);
		this.lines = createInterface({ input: piped(this.proc.stdout) });
		this.lines.on("line", (line) => {
			if (this.waiter !== null) {
				const w = this.waiter;
				this.waiter = null;
				w(line);
			} else {
				this.buffered.push(line);
			}
		});
	}
	/** The next line that starts with one of `prefixes` (others, like `lost`, are kept aside). */
	async next(...prefixes: string[]): Promise<string> {
		for (;;) {
			const line =
				this.buffered.shift() ??
				(await new Promise<string>((resolve, reject) => {
					this.waiter = resolve;
					this.proc.once("exit", () => reject(new Error("holder exited")));
				}));
			if (prefixes.some((p) => line.startsWith(p))) return line;
			this.seen.push(line);
		}
	}
	readonly seen: string[] = [];
	send(line: string): void {
		this.proc.stdin?.write(`${line}\n`);
	}
	async exit(): Promise<void> {
		if (this.proc.exitCode === null) {
			this.send("exit");
			await new Promise((r) => this.proc.once("exit", r));
		}
	}
}

async function pausedHolderWrite(
	guardAddr: string,
): Promise<{ late: string; newToken: number; owner: string; seen: string[] }> {
	const resource = unique("paused");
	const ttl = 1;
	const holder = new Holder(guardAddr, resource, ttl);
	const leases = new LeaseClient(stack.lease.address, { holder: "newcomer" });
	const guard = new GuardClient(guardAddr);
	try {
		const first = await holder.next("token ");
		holder.proc.kill("SIGSTOP");
		// Frozen past its ttl: the lease expires on the server and the newcomer takes it.
		const lease = await leases.acquire(resource, { ttl: 10, timeout: 10 });
		assert.ok(lease.token > Number(first.split(" ")[1]));
		await guard.put(lease, "owner", "newcomer");
		holder.proc.kill("SIGCONT");
		await delay(50);
		holder.send("write"); // the paused holder's late write, as if nothing had happened
		const late = await holder.next("ok", "stale", "error");
		const owner = (await guard.read(resource, "owner"))?.value.toString() ?? "";
		await lease.release();
		await holder.exit();
		return { late, newToken: lease.token, owner, seen: holder.seen };
	} finally {
		holder.proc.kill("SIGKILL");
		leases.close();
		guard.close();
	}
}

test("a paused holder's late write is refused with the current token", async () => {
	const { late, newToken, owner, seen } = await pausedHolderWrite(
		stack.guard.address,
	);
	assert.equal(late, `stale current=${newToken}`);
	assert.equal(owner, "newcomer");
	assert.ok(
		seen.includes("lost"),
		`the holder's signal fired on resume: ${seen.join(" | ")}`,
	);
});

test("control: with fencing off the paused holder's late write overwrites the new holder's", async () => {
	const { late, owner } = await pausedHolderWrite(
		stack.unfenced?.address ?? "",
	);
	assert.match(late, /^ok/);
	assert.equal(owner, "token 1");
});
