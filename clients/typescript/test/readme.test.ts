/**
 * The repository README's TypeScript examples, run as a user would: each ```ts block of
 * its "Use it from TypeScript" section, with the package import pointed at this build and
 * the README's addresses at servers started here, runs in a fresh `node` and must exit 0.
 * The blocks are written as plain JavaScript-compatible TypeScript so node runs them as is.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { pathToFileURL } from "node:url";
import { ROOT, type Stack, startStack } from "./servers.js";

let stack: Stack;
before(async () => {
	stack = await startStack();
});
after(async () => {
	await stack.stop();
});

function examples(): string[] {
	const text = readFileSync(join(ROOT, "README.md"), "utf8");
	const start = text.indexOf("## Use it from TypeScript");
	assert.ok(start >= 0, "README.md has a TypeScript section");
	const end = text.indexOf("\n## ", start + 1);
	const section = text.slice(start, end < 0 ? undefined : end);
	return [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
}

test("README's TypeScript examples run against real servers", () => {
	const blocks = examples();
	assert.ok(blocks.length > 0);
	const sdk = pathToFileURL(
		join(ROOT, "clients", "typescript", "dist", "src", "index.js"),
	).href;
	blocks.forEach((code, i) => {
		const file = join(stack.dir, `readme-${i}.mjs`);
		writeFileSync(
			file,
			code
				.replaceAll('"@fencing-guard/client"', JSON.stringify(sdk))
				.replaceAll("127.0.0.1:50051", stack.lease.address)
				.replaceAll("127.0.0.1:50052", stack.guard.address),
		);
		execFileSync(process.execPath, [file], {
			stdio: "inherit",
			timeout: 60_000,
		});
	});
});
