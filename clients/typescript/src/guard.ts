/**
 * `GuardClient`: guarded writes and reads against a fencing guard. Every write carries
 * the token of the lease (or any `{resource, token}`) that fences it; a stale token is
 * refused with `StaleTokenError` naming the guard's current token, nothing applied.
 * Writes are not retried (as in the Python SDK): retry yourself with an idempotency key.
 */
import { channelFor, type ConnectOptions, seconds } from "./channel.js";
import {
	GuardServiceClient,
	type Op as OpMsg,
} from "./gen/fencing/v1/guard.js";
import { unary } from "./transport.js";

/** Anything that carries a fencing token: a `Lease`, or `{resource, token}`. */
export interface Fenced {
	readonly resource: string;
	readonly token: number;
}

/** One op of a write. */
export type Op =
	| { type: "put"; key: string; value: Uint8Array | string }
	| { type: "delete"; key: string };

export interface WriteOptions {
	/** A repeat of a write with this key (by the current token) applies nothing again. */
	idempotencyKey?: string;
}

/** The fence after a write; `replayed` when its idempotency key matched an earlier write. */
export interface WriteResult {
	fence: number;
	replayed: boolean;
	/** When replayed: the token that applied the recorded write (yours: your earlier attempt landed). */
	replayedByToken: number;
}

/** A stored value with the token of the write that stored it. */
export interface StoredRecord {
	value: Buffer;
	writtenByToken: number;
}

export interface ManyResult {
	/** The fence after the write, by resource. */
	fences: Map<string, number>;
	replayed: boolean;
	replayedByTokens: Map<string, number>;
}

function bytes(value: Uint8Array | string): Buffer {
	return typeof value === "string"
		? Buffer.from(value)
		: Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

function opMsg(op: Op): OpMsg {
	if (op.type === "put")
		return {
			op: { $case: "put", value: { key: op.key, value: bytes(op.value) } },
		};
	return { op: { $case: "delete", value: { key: op.key } } };
}

function opsOf(ops: Op | readonly Op[]): OpMsg[] {
	return (Array.isArray(ops) ? (ops as readonly Op[]) : [ops as Op]).map(opMsg);
}

export class GuardClient {
	readonly target: string;
	readonly rpcTimeout: number;
	private readonly stub: GuardServiceClient;

	constructor(target: string, options: ConnectOptions = {}) {
		this.target = target;
		this.rpcTimeout = seconds(options.rpcTimeout ?? 5, "rpcTimeout");
		const ch = channelFor(target, options);
		this.stub = new GuardServiceClient(target, ch.credentials, ch.options);
	}

	close(): void {
		this.stub.close();
	}

	/** Apply `ops` atomically under `fenced.token`; `StaleTokenError` if a newer token wrote or fenced. */
	async write(
		fenced: Fenced,
		ops: Op | readonly Op[],
		options: WriteOptions = {},
	): Promise<WriteResult> {
		const res = await unary(
			this.stub.write.bind(this.stub),
			{
				resource: fenced.resource,
				token: fenced.token,
				ops: opsOf(ops),
				idempotencyKey: options.idempotencyKey ?? "",
			},
			this.rpcTimeout,
		);
		return {
			fence: res.fence,
			replayed: res.replayed,
			replayedByToken: res.replayedByToken,
		};
	}

	/** Store one value; returns the fence after the write. */
	async put(
		fenced: Fenced,
		key: string,
		value: Uint8Array | string,
		options: WriteOptions = {},
	): Promise<number> {
		return (await this.write(fenced, { type: "put", key, value }, options))
			.fence;
	}

	/** Remove one key; returns the fence after the write. */
	async delete(
		fenced: Fenced,
		key: string,
		options: WriteOptions = {},
	): Promise<number> {
		return (await this.write(fenced, { type: "delete", key }, options)).fence;
	}

	/** The value under `key` with the token that wrote it, or null. */
	async read(resource: string, key: string): Promise<StoredRecord | null> {
		const res = await unary(
			this.stub.read.bind(this.stub),
			{ resource, key },
			this.rpcTimeout,
		);
		return res.found
			? { value: Buffer.from(res.value), writtenByToken: res.writtenByToken }
			: null;
	}

	/** Promise: from now on reject every token older than `fenced.token`. Returns the fence. */
	async fence(fenced: Fenced): Promise<number> {
		const res = await unary(
			this.stub.fence.bind(this.stub),
			{ resource: fenced.resource, token: fenced.token },
			this.rpcTimeout,
		);
		return res.fence;
	}

	/** The guard's fence for `resource` (0 if never written or fenced). */
	async describeFence(resource: string): Promise<number> {
		return (
			await unary(
				this.stub.describeFence.bind(this.stub),
				{ resource },
				this.rpcTimeout,
			)
		).fence;
	}

	/**
	 * Write several resources atomically, each under its own token: all or nothing. One stale
	 * token throws `StaleTokenError` naming the first stale resource in sorted order.
	 */
	async writeMany(
		writes: ReadonlyArray<readonly [Fenced, Op | readonly Op[]]>,
		options: WriteOptions = {},
	): Promise<ManyResult> {
		const res = await unary(
			this.stub.writeMany.bind(this.stub),
			{
				writes: writes.map(([f, ops]) => ({
					resource: f.resource,
					token: f.token,
					ops: opsOf(ops),
				})),
				idempotencyKey: options.idempotencyKey ?? "",
			},
			this.rpcTimeout,
		);
		const fences = new Map(
			res.fences.map((f) => [f.resource, f.fence] as const),
		);
		const replayedByTokens = new Map<string, number>();
		res.fences.forEach((f, i) => {
			const t = res.replayedByTokens[i];
			if (t !== undefined) replayedByTokens.set(f.resource, t);
		});
		return { fences, replayed: res.replayed, replayedByTokens };
	}
}
