/**
 * `LeaseClient`: acquire, renew and release leases; `hold` keeps one alive while an
 * async body runs. The same rules as the Python SDK (`fencing.client.lease`):
 *
 * - a lease lives its ttl from the grant (the send time plus the wait the server
 *   reports), not from the request, however long the acquire waited in line;
 * - every lease held by `hold` is renewed by the client's one session: a keepalive
 *   timer that renews every due lease in one RenewMany call, every ttl/3;
 * - a local deadline (start + ttl - margin) stops trusting the lease even when no
 *   renewal failed yet: `lease.check()` throws and the body's `AbortSignal` fires;
 * - leaving `hold` always sends a token-checked Release, lost or not, bounded by
 *   `releaseTimeout`;
 * - an acquire is retried (transient failures, a held resource until the timeout)
 *   with one request id, so a retry never takes a second token.
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { channelFor, type ConnectOptions, seconds } from "./channel.js";
import {
	AcquireTimeoutError,
	InvalidArgumentError,
	isTransient,
	LeaseHeldError,
	LeaseLostError,
	translate,
} from "./errors.js";
import {
	LeaseEvent_Kind,
	type LeaseEvent as LeaseEventMsg,
	type Lease as LeaseMsg,
	LeaseServiceClient,
} from "./gen/fencing/v1/lease.js";
import type { Fenced } from "./guard.js";
import {
	type Clock,
	DEFAULT_POLICY,
	monotonic,
	type RenewalPolicy,
	RenewalSchedule,
} from "./renewal.js";
import {
	type LeaseCalls,
	StreamCalls,
	type Transport,
	transportOf,
	UnaryCalls,
	unary,
} from "./transport.js";

/** The longest an Acquire asks the server to wait in one call (fencing.limits.MAX_WAIT_MS). */
export const MAX_WAIT_MS = 300_000;
/** RenewMany and ReleaseMany take at most this many leases per call. */
export const MAX_RENEW_MANY = 10_000;
/** Grants an acquire may see expire before their late reply could be renewed, before it gives up. */
export const MAX_LOST_ON_ARRIVAL = 3;

/** Retries of idempotent calls: 50 ms doubling to 0.8 s, five at most, no jitter. */
export function backoff(attempt: number): number | null {
	return attempt > 5 ? null : Math.min(0.8, 0.05 * 2 ** (attempt - 1));
}

export const sleep = (s: number): Promise<void> =>
	new Promise((r) => setTimeout(r, s * 1000));

/** A guard to promise a new token to on acquire (a `GuardClient`). */
export interface Fencer {
	readonly target: string;
	fence(fenced: Fenced): Promise<number>;
}

export interface LeaseClientOptions extends ConnectOptions {
	/** Names this client in leases (default host-pid-random). */
	holder?: string;
	/** Bound on the release sent on leaving `hold`, retries included (seconds, default 2). */
	releaseTimeout?: number;
	/** `auto` (default: the lease stream, unary against a server without it), `stream`, `unary`. */
	transport?: Transport;
	policy?: Partial<RenewalPolicy>;
	/** A monotonic clock in seconds (tests). */
	clock?: Clock;
}

export interface AcquireOptions {
	/** Seconds the lease lives from its grant. */
	ttl: number;
	/** Seconds to wait for a held resource (undefined: forever). */
	timeout?: number;
	/** Guards to promise the new token to before returning (each gets Fence(resource, token)). */
	fence?: readonly Fencer[];
}

export interface HoldOptions extends AcquireOptions {
	/** Called once when the lease is lost. */
	onLost?: (lease: Lease) => void;
}

export interface LeaseState {
	resource: string;
	held: boolean;
	holder: string;
	token: number;
	remainingMs: number;
	lastToken: number;
	/** The held lease's own ttl (ms), which `renew` without a ttl renews by (0 when free). */
	ttlMs: number;
}

export type EventKind =
	| "acquired"
	| "renewed"
	| "released"
	| "expired"
	| "resync";

export interface LeaseEvent {
	kind: EventKind;
	resource: string;
	token: number;
	holder: string;
	revision: number;
	ttlMs: number;
	logId: string;
}

export interface WatchOptions {
	/** Every resource starting with it (instead of one resource). */
	prefix?: string;
	/** Resume after this revision (0: the whole log the server keeps, from revision 1;
	 * absent: from now). */
	afterRevision?: number;
	logId?: string;
	/** Ends the iteration (the stream is cancelled). */
	signal?: AbortSignal;
}

/** A granted lease: `resource`, `holder`, `token` (the proof, judged only by guards) and local liveness. */
export class Lease implements Fenced {
	readonly resource: string;
	readonly holder: string;
	readonly token: number;
	ttlMs: number;
	/** What renewals ask for: the ttl the acquire asked for. */
	renewTtlMs: number;
	/** Set once this holder gave the lease up (not a loss, but no longer ours to act on). */
	released = false;
	readonly schedule: RenewalSchedule;
	private readonly controller = new AbortController();
	private readonly callbacks: Array<(lease: Lease) => void> = [];

	constructor(
		private readonly client: LeaseClient,
		msg: LeaseMsg,
		sentAt: number,
		receivedAt: number,
		askedTtlMs: number,
	) {
		this.resource = msg.resource;
		this.holder = msg.holder;
		this.token = msg.token;
		this.ttlMs = msg.ttlMs;
		this.renewTtlMs = askedTtlMs || msg.ttlMs;
		this.schedule = new RenewalSchedule(
			msg.ttlMs,
			sentAt,
			client.policy,
			msg.waitedMs,
			receivedAt,
		);
	}

	/** Aborted (with a `LeaseLostError` as its reason) once the lease can no longer be trusted. */
	get signal(): AbortSignal {
		return this.controller.signal;
	}

	get lost(): boolean {
		return this.controller.signal.aborted;
	}

	/** Seconds until the local deadline (0 once lost or released). */
	remaining(): number {
		if (this.lost || this.released) return 0;
		return this.schedule.remaining(this.client.clock());
	}

	/** Throw `LeaseLostError` if lost, past the local deadline, or released. */
	check(): void {
		if (
			!this.lost &&
			!this.released &&
			this.schedule.expired(this.client.clock())
		) {
			this.markLost("local deadline passed");
		}
		if (this.lost) throw this.lostError();
		if (this.released) {
			throw new LeaseLostError(
				`lease on '${this.resource}' with token ${this.token} was released`,
				{
					resource: this.resource,
					token: this.token,
				},
			);
		}
	}

	/** Call `callback(lease)` once when the lease is lost (now, if it already is). */
	onLost(callback: (lease: Lease) => void): void {
		if (this.lost) callback(this);
		else this.callbacks.push(callback);
	}

	/** Renew now (`ttl` seconds, default the granted ttl); `LeaseLostError` if refused. */
	async renew(ttl?: number): Promise<void> {
		this.check();
		const ttlMs =
			ttl === undefined
				? this.renewTtlMs
				: Math.round(seconds(ttl, "ttl") * 1000);
		const sentAt = this.client.clock();
		const timeout = this.schedule.rpcTimeout(sentAt, this.client.rpcTimeout);
		try {
			const msg = await this.client.calls.renew(
				{
					resource: this.resource,
					token: this.token,
					ttlMs,
					holder: this.holder,
				},
				timeout,
			);
			this.renewed(sentAt, msg.ttlMs);
		} catch (err) {
			if (err instanceof LeaseLostError) this.markLost("renewal refused");
			throw err;
		}
	}

	/** Give the lease up now; `LeaseLostError` if it was no longer ours. */
	async release(): Promise<void> {
		if (this.released) return;
		this.released = true;
		try {
			await this.client.calls.release(
				{ resource: this.resource, token: this.token, holder: this.holder },
				this.client.rpcTimeout,
			);
		} catch (err) {
			if (err instanceof LeaseLostError) {
				this.markLost("release refused", true);
			} else {
				this.released = false;
			}
			throw err;
		}
	}

	toString(): string {
		return `Lease(${this.resource}, token=${this.token}, ${this.lost ? "lost" : "live"})`;
	}

	/** @internal */
	renewed(sentAt: number, ttlMs: number): void {
		this.schedule.renewed(sentAt, ttlMs);
		this.ttlMs = ttlMs;
		this.renewTtlMs = ttlMs;
	}

	/** @internal */
	lostError(): LeaseLostError {
		return new LeaseLostError("", {
			resource: this.resource,
			token: this.token,
		});
	}

	/** @internal Set lost once and run the callbacks; a released lease is not lost later. */
	markLost(why: string, refusedRelease = false): void {
		if (this.lost || (this.released && !refusedRelease)) return;
		const reason = new LeaseLostError(
			`lease on '${this.resource}' with token ${this.token} is lost: ${why}`,
			{
				resource: this.resource,
				token: this.token,
			},
		);
		this.controller.abort(reason);
		for (const cb of this.callbacks.splice(0)) {
			try {
				cb(this);
			} catch (err) {
				console.error("onLost callback failed", err);
			}
		}
	}
}

/** The client's one keepalive: every lease held through `hold` renewed together by RenewMany. */
class Session {
	private readonly leases = new Set<Lease>();
	private timer: NodeJS.Timeout | null = null;
	private running = false;
	private stopped = false;

	constructor(private readonly client: LeaseClient) {}

	add(lease: Lease): void {
		this.leases.add(lease);
		this.schedule();
	}

	discard(lease: Lease): void {
		this.leases.delete(lease);
	}

	stop(): void {
		this.stopped = true;
		if (this.timer !== null) clearTimeout(this.timer);
		this.timer = null;
	}

	private schedule(): void {
		if (this.stopped || this.running) return;
		if (this.timer !== null) clearTimeout(this.timer);
		this.timer = null;
		if (this.leases.size === 0) return;
		const now = this.client.clock();
		let delay = Number.POSITIVE_INFINITY;
		for (const lease of this.leases)
			delay = Math.min(delay, lease.schedule.sleepFor(now));
		this.timer = setTimeout(() => {
			this.timer = null;
			void this.tick();
		}, delay * 1000);
	}

	private async tick(): Promise<void> {
		this.running = true;
		try {
			const now = this.client.clock();
			const due: Lease[] = [];
			for (const lease of this.leases) {
				if (lease.lost || lease.released) {
					this.leases.delete(lease);
				} else if (lease.schedule.expired(now)) {
					lease.markLost("local deadline passed before a renewal succeeded");
					this.leases.delete(lease);
				} else if (lease.schedule.sleepFor(now) <= 0) {
					due.push(lease);
				}
			}
			for (let i = 0; i < due.length; i += MAX_RENEW_MANY) {
				await this.renew(due.slice(i, i + MAX_RENEW_MANY));
			}
		} finally {
			this.running = false;
			this.schedule();
		}
	}

	private async renew(chunk: Lease[]): Promise<void> {
		const sentAt = this.client.clock();
		let timeout = this.client.rpcTimeout;
		for (const lease of chunk)
			timeout = Math.min(
				timeout,
				lease.schedule.rpcTimeout(sentAt, this.client.rpcTimeout),
			);
		try {
			const res = await this.client.calls.renewMany(
				{
					renewals: chunk.map((l) => ({
						resource: l.resource,
						token: l.token,
						ttlMs: l.renewTtlMs,
						holder: l.holder,
					})),
				},
				timeout,
			);
			chunk.forEach((lease, i) => {
				const result = res.results[i];
				if (result === undefined || result.lost || result.lease === undefined) {
					lease.markLost("renewal refused");
				} else {
					lease.renewed(sentAt, result.lease.ttlMs);
				}
			});
		} catch (err) {
			const now = this.client.clock();
			for (const lease of chunk) {
				if (isTransient(err)) lease.schedule.failed(now);
				else
					lease.markLost(
						`renewal failed: ${err instanceof Error ? err.message : String(err)}`,
					);
			}
		}
	}
}

/** A fresh request id (128 random bits as hex): one per acquire or claim, kept by its retries. */
export function newRequestId(): string {
	return randomBytes(16).toString("hex");
}

function defaultHolder(): string {
	return `${hostname().slice(0, 64)}-${process.pid}-${randomBytes(4).toString("hex")}`;
}

function ttlMsOf(ttl: number): number {
	return Math.round(seconds(ttl, "ttl") * 1000);
}

const EVENT_KINDS: Partial<Record<LeaseEvent_Kind, EventKind>> = {
	[LeaseEvent_Kind.ACQUIRED]: "acquired",
	[LeaseEvent_Kind.RENEWED]: "renewed",
	[LeaseEvent_Kind.RELEASED]: "released",
	[LeaseEvent_Kind.EXPIRED]: "expired",
	[LeaseEvent_Kind.RESYNC]: "resync",
};

/** Did the body end because of the lease's loss (its signal), rather than by an error of its own? */
function endedByLoss(err: unknown, signal: AbortSignal): boolean {
	if (!signal.aborted) return false;
	if (err === signal.reason || err instanceof LeaseLostError) return true;
	return err instanceof Error && err.name === "AbortError";
}

/**
 * A client of `fencing.v1.LeaseService`.
 *
 * ```ts
 * const leases = new LeaseClient("127.0.0.1:50051");
 * await leases.hold("orders", { ttl: 10 }, async (lease, signal) => {
 *   await guard.put(lease, "k", "v");   // fenced by lease.token
 *   lease.check();                      // LeaseLostError once it is gone
 * });
 * ```
 */
export class LeaseClient {
	readonly target: string;
	readonly holder: string;
	readonly rpcTimeout: number;
	readonly releaseTimeout: number;
	readonly transport: Transport;
	readonly policy: RenewalPolicy;
	/** @internal */
	readonly clock: Clock;
	/** @internal */
	readonly calls: LeaseCalls;
	private readonly stub: LeaseServiceClient;
	private session: Session | null = null;

	constructor(target: string, options: LeaseClientOptions = {}) {
		this.target = target;
		this.holder = options.holder || defaultHolder();
		this.rpcTimeout = seconds(options.rpcTimeout ?? 5, "rpcTimeout");
		this.releaseTimeout = seconds(
			options.releaseTimeout ?? 2,
			"releaseTimeout",
		);
		this.transport = transportOf(options.transport);
		this.policy = { ...DEFAULT_POLICY, ...options.policy };
		this.clock = options.clock ?? monotonic;
		const ch = channelFor(target, options);
		this.stub = new LeaseServiceClient(target, ch.credentials, ch.options);
		this.calls =
			this.transport === "unary"
				? new UnaryCalls(this.stub)
				: new StreamCalls(this.stub, this.transport);
	}

	/** Stop renewing and close the channel (held leases then expire on their own). */
	close(): void {
		this.session?.stop();
		this.session = null;
		this.calls.close();
		this.stub.close();
	}

	private keepalive(): Session {
		this.session ??= new Session(this);
		return this.session;
	}

	/**
	 * Acquire `resource` for `ttl` seconds, waiting up to `timeout` (undefined: forever).
	 * Throws `AcquireTimeoutError` (a `LeaseHeldError`) when the timeout runs out. The lease
	 * is not renewed: use `hold`, or `lease.renew()`.
	 */
	async acquire(resource: string, options: AcquireOptions): Promise<Lease> {
		const lease = await this.acquireOnce(resource, options, false);
		await this.promise(lease, options.fence ?? []);
		return lease;
	}

	/** Acquire only if free now; `LeaseHeldError` at once otherwise. */
	async acquireNowait(
		resource: string,
		options: Omit<AcquireOptions, "timeout">,
	): Promise<Lease> {
		const lease = await this.acquireOnce(resource, options, true);
		await this.promise(lease, options.fence ?? []);
		return lease;
	}

	private async acquireOnce(
		resource: string,
		options: AcquireOptions,
		nowait: boolean,
	): Promise<Lease> {
		if (!resource)
			throw new InvalidArgumentError("resource must not be empty", "resource");
		ttlMsOf(options.ttl); // checked before anything is sent
		if (options.timeout !== undefined && !(options.timeout >= 0)) {
			throw new InvalidArgumentError(
				`timeout must be >= 0 seconds, got ${options.timeout}`,
				"timeout",
			);
		}
		const requestId = newRequestId();
		this.calls.beginAcquire(requestId);
		try {
			return await this.acquireAttempts(resource, options, nowait, requestId);
		} finally {
			this.calls.endAcquire(requestId);
		}
	}

	private async acquireAttempts(
		resource: string,
		options: AcquireOptions,
		nowait: boolean,
		requestId: string,
	): Promise<Lease> {
		const ttlMs = ttlMsOf(options.ttl);
		const end =
			options.timeout === undefined ? null : this.clock() + options.timeout;
		const timedOut = (): boolean => end !== null && this.clock() >= end;
		let transientAttempt = 0;
		let lostOnArrival = 0;
		for (;;) {
			const waitMs = nowait
				? 0
				: end === null
					? MAX_WAIT_MS
					: Math.max(
							0,
							Math.min(MAX_WAIT_MS, Math.floor((end - this.clock()) * 1000)),
						);
			const sentAt = this.clock();
			let pause: number;
			try {
				const msg = await this.calls.acquire(
					{ resource, holder: this.holder, ttlMs, waitMs, requestId },
					waitMs / 1000 + this.rpcTimeout,
				);
				const lease = new Lease(this, msg, sentAt, this.clock(), ttlMs);
				if (lease.schedule.dueOnArrival(this.clock())) {
					// The reply came too late to trust its first deadline: renew before handing it out.
					const renewSent = this.clock();
					const renewed = await this.calls.renew(
						{
							resource,
							token: lease.token,
							ttlMs: lease.renewTtlMs,
							holder: lease.holder,
						},
						this.rpcTimeout,
					);
					lease.renewed(renewSent, renewed.ttlMs);
				}
				return lease;
			} catch (err) {
				if (err instanceof LeaseLostError) {
					lostOnArrival += 1;
					if (nowait || timedOut() || lostOnArrival > MAX_LOST_ON_ARRIVAL)
						throw err;
					pause = 0;
				} else if (err instanceof LeaseHeldError && !nowait) {
					if (timedOut()) {
						throw new AcquireTimeoutError(err.message, {
							resource: err.resource || resource,
							holder: err.holder,
							remainingMs: err.remainingMs,
						});
					}
					pause = 0;
				} else if (isTransient(err) && !timedOut()) {
					transientAttempt += 1;
					const next = backoff(transientAttempt);
					if (next === null) throw err;
					pause = next;
				} else {
					throw err;
				}
			}
			if (pause > 0) await sleep(pause);
		}
	}

	private async promise(
		lease: Lease,
		guards: readonly Fencer[],
	): Promise<void> {
		for (const guard of guards) {
			try {
				await guard.fence(lease);
			} catch (err) {
				await lease.release().catch(() => {});
				if (err instanceof Error) {
					err.message += ` (fencing guard ${guard.target} to token ${lease.token} of '${lease.resource}' failed; the lease was released)`;
				}
				throw err;
			}
		}
	}

	/**
	 * Acquire (promising to the `fence` guards), keep renewed by the client's session, run
	 * `body(lease, signal)`, and release on every exit. `signal` aborts (reason: a
	 * `LeaseLostError`) when the lease is lost, so the body's fetches and timers given it
	 * stop; `hold` then rejects with `LeaseLostError` (unless the body threw an error of
	 * its own). The body's result is `hold`'s.
	 */
	async hold<T>(
		resource: string,
		options: HoldOptions,
		body: (lease: Lease, signal: AbortSignal) => Promise<T>,
	): Promise<T> {
		const lease = await this.acquire(resource, options);
		if (options.onLost !== undefined) lease.onLost(options.onLost);
		const session = this.keepalive();
		session.add(lease);
		// The local deadline fires the signal even if the keepalive has not noticed yet.
		const deadline = setInterval(
			() => {
				if (!lease.released && lease.schedule.expired(this.clock()))
					lease.markLost("local deadline passed");
			},
			1000 * Math.max(0.01, Math.min(1, lease.schedule.ttl / 10)),
		);
		let result: T;
		try {
			result = await body(lease, lease.signal);
		} catch (err) {
			clearInterval(deadline);
			session.discard(lease);
			await this.releaseOnExit([lease]);
			if (endedByLoss(err, lease.signal)) throw lease.lostError();
			throw err;
		}
		clearInterval(deadline);
		session.discard(lease);
		await this.releaseOnExit([lease]);
		if (lease.lost) throw lease.lostError();
		return result;
	}

	/**
	 * Release what leaving `hold` may still hold, lost or not: a lease believed lost may
	 * still be ours on the server, and a token-checked Release frees it for the next holder
	 * now rather than at its expiry. Bounded by `releaseTimeout`, retries included.
	 */
	private async releaseOnExit(leases: Lease[]): Promise<void> {
		const pending = leases.filter((l) => !l.released);
		if (pending.length === 0) return;
		for (const l of pending) l.released = true;
		const end = this.clock() + this.releaseTimeout;
		for (let attempt = 1; ; attempt++) {
			const timeout = Math.max(0.001, end - this.clock());
			try {
				const res = await this.calls.releaseMany(
					{
						releases: pending.map((l) => ({
							resource: l.resource,
							token: l.token,
							holder: l.holder,
						})),
					},
					timeout,
				);
				pending.forEach((l, i) => {
					if (res.released[i] === false) l.markLost("release refused", true);
				});
				return;
			} catch (err) {
				const pause = isTransient(err) ? backoff(attempt) : null;
				if (pause === null || this.clock() + pause >= end) return;
				await sleep(pause);
			}
		}
	}

	/** Who holds `resource` now, with which token, and the last token ever issued. */
	async describe(resource: string): Promise<LeaseState> {
		const m = await unary(
			this.stub.describe.bind(this.stub),
			{ resource },
			this.rpcTimeout,
		);
		return {
			resource: m.resource,
			held: m.held,
			holder: m.holder,
			token: m.token,
			remainingMs: m.remainingMs,
			lastToken: m.lastToken,
			ttlMs: m.ttlMs,
		};
	}

	/**
	 * Renew by (resource, token) without a handle for `ttl` seconds (absent: the lease's own
	 * ttl, that of its grant or last renewal); returns the granted ttl in ms.
	 */
	async renew(resource: string, token: number, ttl?: number): Promise<number> {
		return (
			await this.calls.renew(
				{
					resource,
					token,
					ttlMs: ttl === undefined ? 0 : ttlMsOf(ttl),
					holder: "",
				},
				this.rpcTimeout,
			)
		).ttlMs;
	}

	/** Release by (resource, token) without a handle. */
	async release(resource: string, token: number): Promise<void> {
		await this.calls.release({ resource, token, holder: "" }, this.rpcTimeout);
	}

	/**
	 * The events of `resource` (or of every resource starting with `options.prefix`), from now
	 * or after `afterRevision`. A `resync` event means events were missed: re-read with
	 * `describe`. Breaking out of the loop (or `signal`) cancels the stream.
	 */
	async *watch(
		resource: string,
		options: WatchOptions = {},
	): AsyncGenerator<LeaseEvent, void, undefined> {
		if (options.afterRevision !== undefined && options.afterRevision < 0) {
			throw new InvalidArgumentError(
				`afterRevision must be >= 0, got ${options.afterRevision}`,
				"afterRevision",
			);
		}
		const rpc = this.stub.watch({
			resource,
			prefix: options.prefix ?? "",
			afterRevision: options.afterRevision,
			logId: options.logId ?? "",
		});
		const onAbort = (): void => {
			rpc.cancel();
		};
		options.signal?.addEventListener("abort", onAbort, { once: true });
		try {
			for await (const raw of rpc) {
				const msg = raw as LeaseEventMsg;
				const kind = EVENT_KINDS[msg.kind];
				if (kind === undefined) continue;
				yield {
					kind,
					resource: msg.resource,
					token: msg.token,
					holder: msg.holder,
					revision: msg.revision,
					ttlMs: msg.ttlMs,
					logId: msg.logId,
				};
			}
		} catch (err) {
			if (options.signal?.aborted) return;
			throw translate(err);
		} finally {
			options.signal?.removeEventListener("abort", onAbort);
			rpc.cancel();
		}
	}
}
