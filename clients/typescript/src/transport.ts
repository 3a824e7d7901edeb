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

/** One open Session stream: the calls in flight on it, by id. */
class Stream {
	readonly pending = new Map<number, Pending>();
	private queued: SessionCall[] = [];
	private flushing = false;
	ended = false;
	draining = false;

	constructor(
		readonly rpc: ClientDuplexStream<SessionRequest, SessionResponse>,
		private readonly onOrphan: (lease: LeaseMsg) => void,
		private readonly onEnd: (s: Stream) => void,
	) {
		rpc.on("data", (msg: SessionResponse) => {
			if (msg.goaway !== undefined) {
				// The server drains: new calls go on a new stream; these still get replies here.
				this.draining = true;
				this.onEnd(this);
			}
			for (const reply of msg.replies) this.deliver(reply);
		});
		rpc.on("error", (err: ServiceError) => this.fail(err));
		rpc.on("end", () => this.fail(null));
	}

	send(id: number, call: SessionCall, p: Pending): void {
		this.pending.set(id, p);
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
		clearTimeout(p.timer);
		const outcome = reply.outcome;
		if (p.settled) {
			// Nobody waits for this grant any more: give it back rather than let it block
			// the resource until its ttl runs out.
			if (outcome?.$case === "acquired") this.onOrphan(outcome.value);
			return;
		}
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
			if (!p.settled) {
				p.settled = true;
				p.reject(why);
			}
		}
		this.pending.clear();
	}

	close(): void {
		this.ended = true;
		this.rpc.cancel();
	}
}

/** The lease calls as calls on the lease stream (one per client, reopened when it breaks). */
export class StreamCalls implements LeaseCalls {
	private stream: Stream | null = null;
	private nextId = 1;
	private unaryFallback: UnaryCalls | null = null;
	private closed = false;

	constructor(
		private readonly stub: LeaseServiceClient,
		private readonly mode: "auto" | "stream",
	) {}

	private open(): Stream {
		if (this.stream === null || this.stream.ended || this.stream.draining) {
			const s: Stream = new Stream(
				this.stub.session(),
				(lease) => {
					this.release(
						{
							resource: lease.resource,
							token: lease.token,
							holder: lease.holder,
						},
						5,
					).catch(() => {});
				},
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
