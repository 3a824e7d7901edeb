/**
 * Real servers for the tests: `python -m lease_server` and `python -m guard` as child
 * processes on free ports (port 0, read back from their "listening on" line), SQLite in a
 * temporary directory. The repository root is on PYTHONPATH, so the servers run this
 * checkout's code.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** clients/typescript/dist/test -> the repository root. */
export const ROOT = resolve(
	dirname(fileURLToPath(import.meta.url)),
	"..",
	"..",
	"..",
	"..",
);
const PYTHON = process.env.PYTHON ?? "python";
/** Seconds a server may take to say it listens (a loaded CI machine). */
const START_TIMEOUT = 60;

export interface Server {
	address: string;
	proc: ChildProcess;
	stop(): Promise<void>;
}

/** `python -m <module>` on a free loopback port with `args`; resolves once it listens. */
export function start(module: string, args: string[]): Promise<Server> {
	const proc = spawn(
		PYTHON,
		["-m", module, "--listen", "127.0.0.1:0", ...args],
		{
			cwd: ROOT,
			env: { ...process.env, PYTHONPATH: ROOT },
			stdio: ["ignore", "pipe", "pipe"],
		},
	);
	let stderr = "";
	proc.stderr?.on("data", (chunk: Buffer) => {
		stderr += chunk.toString();
	});
	return new Promise((resolvePromise, reject) => {
		const timer = setTimeout(() => {
			proc.kill("SIGKILL");
			reject(
				new Error(`${module} did not start in ${START_TIMEOUT} s: ${stderr}`),
			);
		}, START_TIMEOUT * 1000);
		const lines = createInterface({
			input: proc.stdout as NodeJS.ReadableStream,
		});
		lines.once("line", (line) => {
			clearTimeout(timer);
			const match = /listening on (\S+)/.exec(line);
			if (match?.[1] === undefined) {
				proc.kill("SIGKILL");
				reject(new Error(`${module} said ${line}: ${stderr}`));
				return;
			}
			lines.on("line", () => {});
			resolvePromise({
				address: match[1],
				proc,
				stop: () =>
					new Promise<void>((done) => {
						if (proc.exitCode !== null || proc.signalCode !== null)
							return done();
						proc.once("exit", () => done());
						proc.kill("SIGKILL");
					}),
			});
		});
		proc.once("exit", (code) => {
			clearTimeout(timer);
			reject(new Error(`${module} exited ${code}: ${stderr}`));
		});
	});
}

export interface Stack {
	lease: Server;
	guard: Server;
	/** A guard that accepts stale tokens (`--fence-mode off`): the control. */
	unfenced?: Server;
	dir: string;
	stop(): Promise<void>;
}

/** Extra command-line arguments of the stack's servers (TLS, an auth policy...). */
export interface StackArgs {
	lease?: string[];
	guard?: string[];
}

/**
 * A lease server and a guard (and, with `control`, an unfenced guard), each on SQLite,
 * the lease server and the guard given their extra `args`.
 */
export async function startStack(
	control = false,
	args: StackArgs = {},
): Promise<Stack> {
	const dir = mkdtempSync(join(tmpdir(), "fencing-ts-"));
	const servers = await Promise.all([
		start("lease_server", [
			"--backend",
			`sqlite:${join(dir, "leases.db")}`,
			...(args.lease ?? []),
		]),
		start("guard", [
			"--store",
			`sqlite:${join(dir, "guard.db")}`,
			...(args.guard ?? []),
		]),
		...(control
			? [
					start("guard", [
						"--store",
						`sqlite:${join(dir, "unfenced.db")}`,
						"--fence-mode",
						"off",
					]),
				]
			: []),
	]);
	const [lease, guard, unfenced] = servers as [
		Server,
		Server,
		Server | undefined,
	];
	return {
		lease,
		guard,
		...(unfenced === undefined ? {} : { unfenced }),
		dir,
		async stop() {
			await Promise.all(servers.map((s) => s.stop()));
			rmSync(dir, { recursive: true, force: true });
		},
	};
}

let counter = 0;
/** A resource name unique to this test run. */
export function unique(prefix: string): string {
	counter += 1;
	return `${prefix}-${process.pid}-${counter}`;
}
