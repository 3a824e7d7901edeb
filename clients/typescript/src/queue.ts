/**
 * `QueueClient` and `Worker`: a fenced job queue (the lease server's `QueueService`). A claim
 * is a lease: its token fences the job's guard resource (`job.resource`), so a worker whose
 * claim ran out (rescued by another) is refused on its late `complete` and its late writes.
 * The `Worker` claims up to `concurrency` jobs, heartbeats each every ttl/3 from its grant
 * (the claim's send time plus the wait the server reports), aborts the handler's
 * `AbortSignal` when a claim is lost or its local deadline passes, completes on success,
 * fails on a throw (retried with the server's backoff), and on `stop()` (SIGTERM with
 * `handleSignals`) stops claiming, lets running handlers finish within `grace`, then
 * aborts and releases what it still holds.
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { channelFor, type ConnectOptions, seconds } from "./channel.js";
import { isTransient, LeaseLostError } from "./errors.js";
import {
	type Job as JobMsg,
	QueueServiceClient,
} from "./gen/fencing/v1/queue.js";
import type { Fenced } from "./guard.js";
import { backoff, newRequestId, sleep } from "./lease.js";
import {
	type Clock,
	DEFAULT_POLICY,
	monotonic,
	RenewalSchedule,
} from "./renewal.js";
import { unary } from "./transport.js";

export interface NewJob {
	payload: Uint8Array | string;
	idempotencyKey?: string;
	maxAttempts?: number;
	delayMs?: number;
	orderingKey?: string;
	priority?: number;
	resource?: string;
}

/** A claimed job: its `token` fences `resource` (pass the job to `GuardClient` writes). */
export class Job implements Fenced {
	readonly id: number;
	readonly queue: string;
	readonly payload: Buffer;
	readonly token: number;
	readonly attempt: number;
	readonly maxAttempts: number;
	readonly resource: string;
	readonly lastError: string;
	readonly schedule: RenewalSchedule;
	private readonly controller = new AbortController();

	constructor(
		msg: JobMsg,
		sentAt: number,
		waitedMs: number,
		receivedAt: number,
	) {
		this.id = msg.id;
		this.queue = msg.queue;
		this.payload = Buffer.from(msg.payload);
		this.token = msg.token;
		this.attempt = msg.attempt;
		this.maxAttempts = msg.maxAttempts;
		this.resource = msg.resource;
		this.lastError = msg.lastError;
		this.schedule = new RenewalSchedule(
			msg.ttlMs,
			sentAt,
			DEFAULT_POLICY,
			waitedMs,
			receivedAt,
		);
	}

	/** Aborted (reason: a `LeaseLostError`) once the claim can no longer be trusted. */
	get signal(): AbortSignal {
		return this.controller.signal;
	}

	/** @internal */
	markLost(why: string): void {
		if (this.signal.aborted) return;
		this.controller.abort(
			new LeaseLostError(
				`claim of job ${this.id} with token ${this.token} is lost: ${why}`,
				{
					resource: this.resource,
					token: this.token,
				},
			),
		);
	}
}

export interface FailResult {
	/** "ready" (retried after `retryInMs`) or "dead". */
	state: string;
	retryInMs: number;
}

export class QueueClient {
	readonly target: string;
	readonly rpcTimeout: number;
	readonly clock: Clock;
	private readonly stub: QueueServiceClient;

	constructor(
		target: string,
		options: ConnectOptions & { clock?: Clock } = {},
	) {
		this.target = target;
		this.rpcTimeout = seconds(options.rpcTimeout ?? 5, "rpcTimeout");
		this.clock = options.clock ?? monotonic;
		const ch = channelFor(target, options);
		this.stub = new QueueServiceClient(target, ch.credentials, ch.options);
	}

	close(): void {
		this.stub.close();
	}

	/** Add jobs to `queue`; returns their ids (an idempotency key already known returns its job). */
	async enqueue(queue: string, jobs: readonly NewJob[]): Promise<number[]> {
		const res = await unary(
			this.stub.enqueue.bind(this.stub),
			{
				queue,
				jobs: jobs.map((j) => ({
					payload: Buffer.from(j.payload),
					idempotencyKey: j.idempotencyKey ?? "",
					maxAttempts: j.maxAttempts ?? 0,
					delayMs: j.delayMs ?? 0,
					runAtMs: 0,
					orderingKey: j.orderingKey ?? "",
					priority: j.priority ?? 0,
					resource: j.resource ?? "",
				})),
			},
			this.rpcTimeout,
		);
		return res.jobs.map((j) => j.id);
	}

	/**
	 * Claim up to `batchSize` jobs for `ttl` seconds, waiting up to `wait` seconds for work.
	 * Transient failures (a deadline, the server unreachable) are retried with the same request
	 * id: a try whose reply was lost had its jobs claimed, and the retry gets those jobs back
	 * with the same tokens and attempts (no attempt is burnt by a lost reply).
	 */
	async claim(
		queue: string,
		options: {
			ttl: number;
			batchSize?: number;
			wait?: number;
			worker?: string;
		},
	): Promise<Job[]> {
		const ttlMs = Math.round(seconds(options.ttl, "ttl") * 1000);
		const end = this.clock() + Math.max(0, options.wait ?? 0);
		const requestId = newRequestId();
		for (let attempt = 1; ; attempt++) {
			const waitMs = Math.max(0, Math.round((end - this.clock()) * 1000));
			const sentAt = this.clock();
			try {
				const res = await unary(
					this.stub.claim.bind(this.stub),
					{
						queue,
						worker: options.worker ?? `${hostname()}-${process.pid}`,
						batchSize: options.batchSize ?? 1,
						ttlMs,
						waitMs,
						complete: [],
						requestId,
					},
					waitMs / 1000 + this.rpcTimeout,
				);
				const receivedAt = this.clock();
				return res.jobs.map(
					(j) => new Job(j, sentAt, res.waitedMs, receivedAt),
				);
			} catch (err) {
				const pause = isTransient(err) ? backoff(attempt) : null;
				if (pause === null) throw err;
				await sleep(pause);
			}
		}
	}

	/** Extend the claims by `ttl` seconds; `LeaseLostError` if one is no longer ours. */
	async heartbeat(jobs: readonly Job[], ttl: number): Promise<number> {
		const ttlMs = Math.round(seconds(ttl, "ttl") * 1000);
		const res = await unary(
			this.stub.heartbeat.bind(this.stub),
			{
				jobs: jobs.map((j) => ({ id: j.id, token: j.token })),
				ttlMs,
				queue: jobs[0]?.queue ?? "",
			},
			this.rpcTimeout,
		);
		return res.ttlMs;
	}

	/** Mark the jobs succeeded; `LeaseLostError` for a claim that is no longer ours (a late complete). */
	async complete(jobs: readonly Job[]): Promise<void> {
		await unary(
			this.stub.complete.bind(this.stub),
			{
				jobs: jobs.map((j) => ({ id: j.id, token: j.token })),
				queue: jobs[0]?.queue ?? "",
			},
			this.rpcTimeout,
		);
	}

	/** Record a failure: retried after the server's backoff (or `retryIn` seconds), or dead if `final`. */
	async fail(
		job: Job,
		error: string,
		options: { retryIn?: number; final?: boolean } = {},
	): Promise<FailResult> {
		const res = await unary(
			this.stub.fail.bind(this.stub),
			{
				job: { id: job.id, token: job.token },
				error,
				retryInMs: Math.round((options.retryIn ?? 0) * 1000),
				final: options.final ?? false,
				queue: job.queue,
			},
			this.rpcTimeout,
		);
		return { state: res.state, retryInMs: res.retryInMs };
	}

	/** Give claims back unfinished (not an attempt): the jobs are ready again at once. */
	async release(jobs: readonly Job[]): Promise<void> {
		await unary(
			this.stub.release.bind(this.stub),
			{
				jobs: jobs.map((j) => ({ id: j.id, token: j.token })),
				queue: jobs[0]?.queue ?? "",
			},
			this.rpcTimeout,
		);
	}
}

export interface WorkerOptions {
	/** Jobs run at once (default 1). */
	concurrency?: number;
	/** Seconds each claim lives from its grant, renewed every ttl/3 (default 30). */
	ttl?: number;
	/** Seconds `stop()` lets running handlers finish before aborting and releasing them (default 10). */
	grace?: number;
	/** Stop gracefully on SIGTERM and SIGINT. */
	handleSignals?: boolean;
	worker?: string;
}

export type Handler = (job: Job, signal: AbortSignal) => Promise<void>;

export class Worker {
	readonly concurrency: number;
	readonly ttl: number;
	readonly grace: number;
	readonly name: string;
	private stopping = false;
	private readonly running = new Map<Job, Promise<void>>();
	private readonly stopController = new AbortController();

	constructor(
		private readonly client: QueueClient,
		readonly queue: string,
		private readonly handler: Handler,
		options: WorkerOptions = {},
	) {
		this.concurrency = Math.max(1, options.concurrency ?? 1);
		this.ttl = seconds(options.ttl ?? 30, "ttl");
		this.grace = options.grace ?? 10;
		this.name =
			options.worker ??
			`${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
		if (options.handleSignals) {
			const stop = (): void => {
				void this.stop();
			};
			process.once("SIGTERM", stop);
			process.once("SIGINT", stop);
		}
	}

	/** Claim and run jobs until `stop()`; resolves once stopped and everything held was settled. */
	async run(): Promise<void> {
		let attempt = 0;
		while (!this.stopping) {
			const free = this.concurrency - this.running.size;
			if (free <= 0) {
				await Promise.race([...this.running.values(), this.stopped()]);
				continue;
			}
			let jobs: Job[];
			try {
				jobs = await this.client.claim(this.queue, {
					ttl: this.ttl,
					batchSize: free,
					wait: 1,
					worker: this.name,
				});
				attempt = 0;
			} catch (err) {
				if (!isTransient(err)) throw err;
				attempt += 1;
				await sleep(Math.min(1, 0.05 * 2 ** attempt));
				continue;
			}
			for (const job of jobs) {
				const done = this.runJob(job).finally(() => this.running.delete(job));
				this.running.set(job, done);
			}
		}
		await Promise.allSettled(this.running.values());
	}

	/** Stop claiming; running handlers get `grace` seconds, then are aborted and their claims released. */
	async stop(): Promise<void> {
		if (this.stopping) return;
		this.stopping = true;
		this.stopController.abort();
		const all = Promise.allSettled(this.running.values());
		const timedOut = await Promise.race([
			all.then(() => false),
			sleep(this.grace).then(() => true),
		]);
		if (timedOut) {
			const held = [...this.running.keys()];
			for (const job of held) job.markLost("the worker is stopping");
			if (held.length > 0) await this.client.release(held).catch(() => {});
		}
	}

	private stopped(): Promise<void> {
		return new Promise((r) =>
			this.stopController.signal.addEventListener("abort", () => r(), {
				once: true,
			}),
		);
	}

	private async runJob(job: Job): Promise<void> {
		let beat: NodeJS.Timeout | null = null;
		const keepalive = (): void => {
			const now = this.client.clock();
			if (job.schedule.expired(now)) {
				job.markLost("local deadline passed before a heartbeat succeeded");
				return;
			}
			beat = setTimeout(() => {
				const sentAt = this.client.clock();
				this.client.heartbeat([job], this.ttl).then(
					(ttlMs) => {
						job.schedule.renewed(sentAt, ttlMs);
						if (!job.signal.aborted) keepalive();
					},
					(err: unknown) => {
						if (isTransient(err)) {
							job.schedule.failed(this.client.clock());
							if (!job.signal.aborted) keepalive();
						} else {
							job.markLost(err instanceof Error ? err.message : String(err));
						}
					},
				);
			}, job.schedule.sleepFor(now) * 1000);
		};
		keepalive();
		try {
			await this.handler(job, job.signal);
			if (!job.signal.aborted) await this.client.complete([job]);
		} catch (err) {
			if (!job.signal.aborted) {
				await this.client
					.fail(job, err instanceof Error ? err.message : String(err))
					.catch(() => {});
			}
		} finally {
			if (beat !== null) clearTimeout(beat);
			job.markLost("finished");
		}
	}
}
