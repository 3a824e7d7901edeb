/**
 * How the lease calls travel: one unary RPC each, or as calls of one lease stream per
 * client (`LeaseService.Session`), where calls made together share a message. `auto`
 * (the default) uses the stream and falls back to unary RPCs, for the client's life,
 * against a server without it, as the Python client does.
 */
import {
	type ClientDuplexStream,
	Metadata,
	type ServiceError,
	status as Code,
} from "@grpc/grpc-js";
import {
	BackendUnavailableError,
	DeadlineExceededError,
	fromStatus,
	InvalidArgumentError,
	RpcError,
	translate,
} from "./errors.js";
import type {
	AcquireRequest,
	Lease as LeaseMsg,
	LeaseServiceClient,
	ReleaseManyRequest,
	ReleaseManyResponse,
	ReleaseRequest,
	RenewManyRequest,
	RenewManyResponse,
	RenewRequest,
	SessionCall,
	SessionReply,
	SessionRequest,
	SessionResponse,
} from "./gen/fencing/v1/lease.js";

export type Transport = "auto" | "stream" | "unary";

export const TRANSPORT_ENV = "FENCING_TRANSPORT";
export const MAX_DEADLINE_MS = 3_600_000;

export function transportOf(value: string | undefined): Transport {
	const v = value ?? (process.env[TRANSPORT_ENV] || "auto");
	if (v === "auto" || v === "stream" || v === "unary") return v;
	throw new InvalidArgumentError(
		`transport must be one of 'auto', 'stream', 'unary', got '${v}'`,
		"transport",
	);
}

/** The lease calls, whichever way they travel; `timeout` in seconds. Errors are SDK errors. */
export interface LeaseCalls {
	/** An acquire whose attempts all carry `requestId` starts: a grant of it that its
	 * attempt's caller stopped waiting for is kept until `endAcquire`. */
	beginAcquire(requestId: string): void;
	/** The acquire of `requestId` returned or gave up: the grants it left are released. */
	endAcquire(requestId: string): void;
	acquire(req: AcquireRequest, timeout: number): Promise<LeaseMsg>;
	renew(req: RenewRequest, timeout: number): Promise<LeaseMsg>;
	release(req: ReleaseRequest, timeout: number): Promise<void>;
	renewMany(req: RenewManyRequest, timeout: number): Promise<RenewManyResponse>;
	releaseMany(
		req: ReleaseManyRequest,
		timeout: number,
	): Promise<ReleaseManyResponse>;
	close(): void;
}

type Unary<Req, Res> = (
	req: Req,
	metadata: Metadata,
	options: { deadline: Date },
	cb: (err: ServiceError | null, res: Res) => void,
) => unknown;

/** One unary call with a deadline of `timeout` seconds; rejects with the SDK's error. */
export function unary<Req, Res>(
	method: Unary<Req, Res>,
	req: Req,
	timeout: number,
): Promise<Res> {
	return new Promise((resolve, reject) => {
		method(
			req,
			new Metadata(),
			{ deadline: new Date(Date.now() + timeout * 1000) },
			(err, res) => {
				if (err) reject(translate(err));
				else resolve(res);
			},
		);
	});
}

export class UnaryCalls implements LeaseCalls {
	constructor(private readonly stub: LeaseServiceClient) {}
	// A unary call given up is cancelled, and a cancelled Acquire takes no lease.
	beginAcquire(_requestId: string): void {}
	endAcquire(_requestId: string): void {}
	acquire(req: AcquireRequest, timeout: number): Promise<LeaseMsg> {
		return unary(this.stub.acquire.bind(this.stub), req, timeout);
	}
	renew(req: RenewRequest, timeout: number): Promise<LeaseMsg> {
		return unary(this.stub.renew.bind(this.stub), req, timeout);
	}
	async release(req: ReleaseRequest, timeout: number): Promise<void> {
		await unary(this.stub.release.bind(this.stub), req, timeout);
	}
	renewMany(
		req: RenewManyRequest,
		timeout: number,
	): Promise<RenewManyResponse> {
		return unary(this.stub.renewMany.bind(this.stub), req, timeout);
	}
	releaseMany(
		req: ReleaseManyRequest,
		timeout: number,
	): Promise<ReleaseManyResponse> {
		return unary(this.stub.releaseMany.bind(this.stub), req, timeout);
	}
	close(): void {}
}

type Call = NonNullable<SessionCall["call"]>;
type Outcome = NonNullable<SessionReply["outcome"]>;

interface Pending {
	kind: Call["$case"];
	resolve: (o: Outcome) => void;
	reject: (e: unknown) => void;
	settled: boolean;
	timer: NodeJS.Timeout;
	call: Call;
}

const keyOf = (lease: LeaseMsg): string =>
	`${lease.token}\u0000${lease.resource}`;

/**
 * The grants of acquires by request id, across the client's streams. Every attempt of
 * one acquire carries one request id and the server answers a retry of a granted attempt
 * with the same lease, so the grant of an attempt whose caller stopped waiting (its
 * deadline passed) is often the very lease a later attempt returns. Such a grant is
 * released only when nobody can take it: its acquire ended, and no caller was handed the
 * same lease. Releasing it at once would free the lease the retry returns, and a second
 * client would be granted the next token while the first still holds its own.
 */
export class Acquires {
	/** Acquires going on, by request id. */
	private readonly plans = new Map<string, number>();
	/** Calls sent whose reply is still to come, by request id. */
	private readonly calls = new Map<string, number>();
	/** Leases handed to a caller, by request id. */
	private readonly kept = new Map<string, Set<string>>();
	/** Grants nobody waited for, kept while their acquire goes on. */
	private readonly parked = new Map<string, LeaseMsg[]>();

	/** Request ids remembered (none once every acquire ended and its calls came back). */
	get size(): number {
		return new Set([
			...this.plans.keys(),
			...this.calls.keys(),
			...this.kept.keys(),
		]).size;
	}

	begin(requestId: string): void {
		this.plans.set(requestId, (this.plans.get(requestId) ?? 0) + 1);
	}

	/** The acquire of `requestId` ended: the grants to release (none it was handed). */
	end(requestId: string): LeaseMsg[] {
		const left = (this.plans.get(requestId) ?? 1) - 1;
		if (left > 0) {
			this.plans.set(requestId, left);
			return [];
		}
		this.plans.delete(requestId);
		const kept = this.kept.get(requestId) ?? new Set<string>();
		const parked = this.parked.get(requestId) ?? [];
		this.parked.delete(requestId);
		this.forget(requestId);
		return parked.filter((g) => !kept.has(keyOf(g)));
	}

	sent(requestId: string): void {
		if (requestId)
			this.calls.set(requestId, (this.calls.get(requestId) ?? 0) + 1);
	}

	/** A call of `requestId` will have no more reply (answered, or its stream ended). */
	gone(requestId: string): void {
		if (!requestId) return;
		const left = (this.calls.get(requestId) ?? 1) - 1;
		if (left > 0) this.calls.set(requestId, left);
		else this.calls.delete(requestId);
		this.forget(requestId);
	}

	/** `grant` is handed to the caller of an attempt of `requestId`. */
	handed(requestId: string, grant: LeaseMsg): void {
		if (!requestId) return;
		let kept = this.kept.get(requestId);
		if (kept === undefined) {
			kept = new Set();
			this.kept.set(requestId, kept);
		}
		kept.add(keyOf(grant));
	}

	/** Whether a grant nobody waited for may still be someone's: its acquire goes on,
	 * or a caller was handed the same lease. */
	keeps(requestId: string, grant: LeaseMsg): boolean {
		if (!requestId) return false;
		return (
			this.plans.has(requestId) ||
			(this.kept.get(requestId)?.has(keyOf(grant)) ?? false)
		);
	}

	/** A grant whose caller stopped waiting: the grants to release now (it, or none). */
	orphaned(requestId: string, grant: LeaseMsg): LeaseMsg[] {
		if (!this.keeps(requestId, grant)) return [grant];
		if (!this.kept.get(requestId)?.has(keyOf(grant))) {
			const parked = this.parked.get(requestId) ?? [];
			parked.push(grant);
			this.parked.set(requestId, parked);
		}
		return [];
	}

	private forget(requestId: string): void {
		if (!this.plans.has(requestId) && !this.calls.has(requestId)) {
			this.kept.delete(requestId);
			this.parked.delete(requestId);
		}
	}
}

const requestIdOf = (call: Call): string =>
	call.$case === "acquire" ? call.value.requestId : "";

/** The server's limits, in the stream's initial metadata: acquires in flight (every call,
 * from a server without the second) and renewals and releases apart from them. */
export const SESSION_MAX_IN_FLIGHT_KEY = "fencing-session-max-in-flight";
export const SESSION_MAX_UPKEEP_IN_FLIGHT_KEY =
	"fencing-session-max-upkeep-in-flight";
/** The limit assumed from a server that says none. */
export const DEFAULT_MAX_IN_FLIGHT = 64;
/** Renewals and releases: counted apart from the acquires where the server says so. */
const UPKEEP_CALLS: ReadonlySet<string> = new Set([
	"renew",
	"release",
	"renewMany",
	"releaseMany",
]);

function countOf(md: Metadata, key: string): number | null {
	const [value] = md.get(key);
	const n = Number(value);
	return value === undefined || !Number.isInteger(n) || n < 1 ? null : n;
}

interface Queued {
	id: number;
	call: SessionCall;
	p: Pending;
}

/** @internal One open Session stream: the calls in flight on it, by id. A call counts against the
 * server's limit from the moment it is sent until its reply (a caller that gives up does
 * not free its slot: the server still has the call); a call without room waits here,
 * unsent, in order, and renewals and releases pass acquires waiting in line where the
 * server counts them apart, so a held lease's renewal never waits behind them. */
export class Stream {
	readonly pending = new Map<number, Pending>();
	private queued: SessionCall[] = [];
	private flushing = false;
	/** Calls without room yet, in the order they were made. */
	private backlog: Queued[] = [];
	/** The ids of the renewals and releases among `pending`. */
	private readonly upkeep = new Set<number>();
	/** One call (the one that opens the stream) until the initial metadata says the
	 * server's limits: callers arriving together must not overrun it. */
	private maxInFlight = 1;
	private maxUpkeep: number | null = null;
	ended = false;
	draining = false;

	constructor(
		readonly rpc: ClientDuplexStream<SessionRequest, SessionResponse>,
		private readonly acquires: Acquires,
		private readonly release: (leases: LeaseMsg[]) => void,
		private readonly onEnd: (s: Stream) => void,
	) {
		rpc.on("metadata", (md: Metadata) => {
			this.maxInFlight =
				countOf(md, SESSION_MAX_IN_FLIGHT_KEY) ?? DEFAULT_MAX_IN_FLIGHT;
			this.maxUpkeep = countOf(md, SESSION_MAX_UPKEEP_IN_FLIGHT_KEY);
			this.pump();
		});
		rpc.on("data", (msg: SessionResponse) => {
			if (msg.goaway !== undefined) {
				// The server drains: new calls go on a new stream; these still get replies
				// here. Those not sent yet fail as an unavailable server does: retried, they
				// go on the new stream.
				this.draining = true;
				this.onEnd(this);
				this.failBacklog(
					new BackendUnavailableError(
						"the lease server is draining: send new calls on a new stream",
					),
				);
			}
			for (const reply of msg.replies) this.deliver(reply);
			this.pump();
		});
		rpc.on("error", (err: ServiceError) => this.fail(err));
		rpc.on("end", () => this.fail(null));
	}

	send(id: number, call: SessionCall, p: Pending): void {
		this.acquires.sent(requestIdOf(p.call));
		this.backlog.push({ id, call, p });
		this.pump();
	}

	private hasRoom(kind: Call["$case"]): boolean {
		if (this.maxUpkeep === null) return this.pending.size < this.maxInFlight;
		if (UPKEEP_CALLS.has(kind)) return this.upkeep.size < this.maxUpkeep;
		return this.pending.size - this.upkeep.size < this.maxInFlight;
	}

	/** Send the waiting calls that have room now, in order; drop those whose caller gave
	 * up before they were sent (no reply will come for them). */
	private pump(): void {
		if (this.ended || this.draining) return;
		const waiting = this.backlog;
		this.backlog = [];
		for (const q of waiting) {
			if (q.p.settled) this.acquires.gone(requestIdOf(q.p.call));
			else if (this.hasRoom(q.p.kind)) this.transmit(q);
			else this.backlog.push(q);
		}
	}

	private failBacklog(why: unknown): void {
		const waiting = this.backlog;
		this.backlog = [];
		for (const q of waiting) {
			clearTimeout(q.p.timer);
			this.acquires.gone(requestIdOf(q.p.call));
			if (!q.p.settled) {
				q.p.settled = true;
				q.p.reject(why);
			}
		}
	}

	private transmit({ id, call, p }: Queued): void {
		this.pending.set(id, p);
		if (UPKEEP_CALLS.has(p.kind)) this.upkeep.add(id);
		this.queued.push(call);
		if (!this.flushing) {
			this.flushing = true;
			// Calls made in the same turn share one message.
			setImmediate(() => {
				this.flushing = false;
				const calls = this.queued;
				this.queued = [];
				if (!this.ended && calls.length > 0) this.rpc.write({ calls });
			});
		}
	}

	private deliver(reply: SessionReply): void {
		const p = this.pending.get(reply.id);
		if (p === undefined) return;
		this.pending.delete(reply.id);
		this.upkeep.delete(reply.id);
		clearTimeout(p.timer);
		const outcome = reply.outcome;
		const requestId = requestIdOf(p.call);
		if (p.settled) {
			// Its caller stopped waiting: give the grant back, unless the acquire it belongs
			// to may still take it, rather than let it block the resource for its ttl.
			if (outcome?.$case === "acquired")
				this.release(this.acquires.orphaned(requestId, outcome.value));
			this.acquires.gone(requestId);
			return;
		}
		// Recorded before the caller resumes: its acquire may end at once.
		if (outcome?.$case === "acquired")
			this.acquires.handed(requestId, outcome.value);
		this.acquires.gone(requestId);
		p.settled = true;
		if (outcome === undefined)
			p.reject(new BackendUnavailableError("empty reply on the lease stream"));
		else if (outcome.$case === "error") p.reject(fromStatus(outcome.value));
		else p.resolve(outcome);
	}

	private fail(err: ServiceError | null): void {
		if (this.ended) return;
		this.ended = true;
		this.onEnd(this);
		const why =
			err === null
				? new BackendUnavailableError("the lease stream ended")
				: err.code === Code.UNIMPLEMENTED
					? new RpcError(Code.UNIMPLEMENTED, err.details)
					: translate(err);
		for (const p of this.pending.values()) {
			clearTimeout(p.timer);
			this.acquires.gone(requestIdOf(p.call));
			if (!p.settled) {
				p.settled = true;
				p.reject(why);
			}
		}
		this.pending.clear();
		this.upkeep.clear();
		this.failBacklog(why);
	}

	close(): void {
		// Its callers hear it at once, not at their deadlines.
		this.fail(null);
		this.rpc.cancel();
	}
}

/** The lease calls as calls on the lease stream (one per client, reopened when it breaks). */
export class StreamCalls implements LeaseCalls {
	private stream: Stream | null = null;
	private nextId = 1;
	private unaryFallback: UnaryCalls | null = null;
	private closed = false;
	/** The grants of acquires by request id (which a caller may still take). */
	readonly acquires = new Acquires();

	constructor(
		private readonly stub: LeaseServiceClient,
		private readonly mode: "auto" | "stream",
	) {}

	beginAcquire(requestId: string): void {
		this.acquires.begin(requestId);
	}

	endAcquire(requestId: string): void {
		this.releaseGrants(this.acquires.end(requestId));
	}

	/** Token-checked releases of grants nobody can take (best effort: else they expire). */
	private releaseGrants(grants: LeaseMsg[]): void {
		if (this.closed) return;
		for (const lease of grants) {
			this.release(
				{ resource: lease.resource, token: lease.token, holder: lease.holder },
				5,
			).catch(() => {});
		}
	}

	private open(): Stream {
		if (this.stream === null || this.stream.ended || this.stream.draining) {
			const s: Stream = new Stream(
				this.stub.session(),
				this.acquires,
				(grants) => this.releaseGrants(grants),
				(ended) => {
					if (this.stream === ended) this.stream = null;
				},
			);
			this.stream = s;
		}
		return this.stream;
	}

	private async call(call: Call, timeout: number): Promise<Outcome> {
		if (this.closed)
			throw new BackendUnavailableError("the lease client is closed");
		const stream = this.open();
		const id = this.nextId++;
		const deadlineMs = Math.min(
			MAX_DEADLINE_MS,
			Math.max(1, Math.round(timeout * 1000)),
		);
		try {
			return await new Promise<Outcome>((resolve, reject) => {
				const p: Pending = {
					kind: call.$case,
					resolve,
					reject,
					settled: false,
					call,
					// The server answers DEADLINE_EXCEEDED at deadlineMs; this bounds a stream gone silent.
					timer: setTimeout(
						() => {
							if (!p.settled) {
								p.settled = true;
								reject(
									new DeadlineExceededError(
										`deadline exceeded: no reply in ${timeout} s`,
									),
								);
							}
						},
						timeout * 1000 + 1000,
					),
				};
				stream.send(id, { id, deadlineMs, call }, p);
			});
		} catch (err) {
			if (
				err instanceof RpcError &&
				err.code === Code.UNIMPLEMENTED &&
				this.mode === "auto"
			) {
				// An older server without Session: unary calls from now on.
				this.unaryFallback ??= new UnaryCalls(this.stub);
				throw new FallbackSignal();
			}
			throw err;
		}
	}

	private async route<T>(
		viaStream: () => Promise<T>,
		viaUnary: (u: UnaryCalls) => Promise<T>,
	): Promise<T> {
		if (this.unaryFallback !== null) return viaUnary(this.unaryFallback);
		try {
			return await viaStream();
		} catch (err) {
			if (err instanceof FallbackSignal && this.unaryFallback !== null)
				return viaUnary(this.unaryFallback);
			throw err;
		}
	}

	acquire(req: AcquireRequest, timeout: number): Promise<LeaseMsg> {
		return this.route(
			async () =>
				expect(
					await this.call({ $case: "acquire", value: req }, timeout),
					"acquired",
				),
			(u) => u.acquire(req, timeout),
		);
	}
	renew(req: RenewRequest, timeout: number): Promise<LeaseMsg> {
		return this.route(
			async () =>
				expect(
					await this.call({ $case: "renew", value: req }, timeout),
					"renewed",
				),
			(u) => u.renew(req, timeout),
		);
	}
	release(req: ReleaseRequest, timeout: number): Promise<void> {
		return this.route(
			async () => {
				expect(
					await this.call({ $case: "release", value: req }, timeout),
					"released",
				);
			},
			(u) => u.release(req, timeout),
		);
	}
	renewMany(
		req: RenewManyRequest,
		timeout: number,
	): Promise<RenewManyResponse> {
		return this.route(
			async () =>
				expect(
					await this.call({ $case: "renewMany", value: req }, timeout),
					"renewedMany",
				),
			(u) => u.renewMany(req, timeout),
		);
	}
	releaseMany(
		req: ReleaseManyRequest,
		timeout: number,
	): Promise<ReleaseManyResponse> {
		return this.route(
			async () =>
				expect(
					await this.call({ $case: "releaseMany", value: req }, timeout),
					"releasedMany",
				),
			(u) => u.releaseMany(req, timeout),
		);
	}
	close(): void {
		this.closed = true;
		this.stream?.close();
		this.stream = null;
	}
}

class FallbackSignal extends Error {}

type Values = { [O in Outcome as O["$case"]]: O["value"] };

function expect<K extends keyof Values>(o: Outcome, kind: K): Values[K] {
	if (o.$case !== kind)
		throw new BackendUnavailableError(
			`lease stream answered ${o.$case}, expected ${kind}`,
		);
	const value: unknown = o.value;
	return value as Values[K];
}
