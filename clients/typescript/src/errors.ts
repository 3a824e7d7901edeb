/**
 * The errors of the fencing SDK: one tree, the same as the Python SDK's
 * (`fencing.errors`), rebuilt from the `google.rpc.ErrorInfo` (domain `fencing.v1`)
 * every server error status carries.
 */
import { Metadata, type ServiceError, status as Code } from "@grpc/grpc-js";
import { ErrorInfo } from "./gen/google/rpc/error_details.js";
import { Status } from "./gen/google/rpc/status.js";

export const DOMAIN = "fencing.v1";

type Meta = Readonly<Record<string, string>>;

function int(meta: Meta, key: string): number {
	const v = meta[key];
	return v ? Number(v) : 0;
}

function keyApplied(meta: Meta): boolean | null {
	const v = meta.key_applied;
	return v === undefined ? null : v === "true";
}

/** Root of every error the SDK throws on purpose. */
export class FencingError extends Error {
	static readonly reason: string = "UNKNOWN";
	override name = "FencingError";
	/** The `ErrorInfo` reason (`STALE_TOKEN`, `LEASE_HELD`...). */
	get reason(): string {
		return (this.constructor as typeof FencingError).reason;
	}
}

/** A write or fence carried a token older than one the guard already saw; nothing applied. */
export class StaleTokenError extends FencingError {
	static override readonly reason = "STALE_TOKEN";
	override name = "StaleTokenError";
	readonly resource: string;
	readonly token: number;
	/** The guard's fence for the resource when it refused. */
	readonly currentToken: number;
	/** For a write with an idempotency key: whether a write with that key was applied (null: no key). */
	readonly keyApplied: boolean | null;
	/** ... and by which token (0 if none). */
	readonly appliedByToken: number;
	constructor(
		message: string,
		f: {
			resource: string;
			token: number;
			currentToken: number;
			keyApplied?: boolean | null;
			appliedByToken?: number;
		},
	) {
		super(
			message ||
				`token ${f.token} is stale for '${f.resource}': fence is ${f.currentToken}`,
		);
		this.resource = f.resource;
		this.token = f.token;
		this.currentToken = f.currentToken;
		this.keyApplied = f.keyApplied ?? null;
		this.appliedByToken = f.appliedByToken ?? 0;
	}
}

/** Someone else holds an unexpired lease on the resource. */
export class LeaseHeldError extends FencingError {
	static override readonly reason = "LEASE_HELD";
	override name = "LeaseHeldError";
	readonly resource: string;
	readonly holder: string;
	readonly remainingMs: number;
	constructor(
		message: string,
		f: { resource: string; holder: string; remainingMs: number },
	) {
		super(
			message ||
				`'${f.resource}' is held by '${f.holder}' for ${f.remainingMs} ms`,
		);
		this.resource = f.resource;
		this.holder = f.holder;
		this.remainingMs = f.remainingMs;
	}
}

/** `acquire` waited its whole timeout and the lease stayed held. */
export class AcquireTimeoutError extends LeaseHeldError {
	override name = "AcquireTimeoutError";
}

/** The lease (or job claim) is no longer the caller's: expired, taken over or released. */
export class LeaseLostError extends FencingError {
	static override readonly reason = "LEASE_LOST";
	override name = "LeaseLostError";
	readonly resource: string;
	readonly token: number;
	readonly keyApplied: boolean | null;
	readonly appliedByToken: number;
	constructor(
		message: string,
		f: {
			resource: string;
			token: number;
			keyApplied?: boolean | null;
			appliedByToken?: number;
		},
	) {
		super(message || `lease on '${f.resource}' with token ${f.token} is lost`);
		this.resource = f.resource;
		this.token = f.token;
		this.keyApplied = f.keyApplied ?? null;
		this.appliedByToken = f.appliedByToken ?? 0;
	}
}

/** A request field is out of its limits (`field` names it). */
export class InvalidArgumentError extends FencingError {
	static override readonly reason = "INVALID_ARGUMENT";
	override name = "InvalidArgumentError";
	readonly field: string;
	constructor(message: string, field = "") {
		super(message);
		this.field = field;
	}
}

/** The server or the store behind it is unreachable: safe to retry idempotently. */
export class BackendUnavailableError extends FencingError {
	static override readonly reason = "BACKEND_UNAVAILABLE";
	override name = "BackendUnavailableError";
}

/** The call's deadline passed: its effect is unknown. */
export class DeadlineExceededError extends FencingError {
	static override readonly reason = "DEADLINE_EXCEEDED";
	override name = "DeadlineExceededError";
}

export class UnauthenticatedError extends FencingError {
	static override readonly reason = "UNAUTHENTICATED";
	override name = "UnauthenticatedError";
}

export class PermissionDeniedError extends FencingError {
	static override readonly reason = "PERMISSION_DENIED";
	override name = "PermissionDeniedError";
}

export class NotFoundError extends FencingError {
	static override readonly reason = "NOT_FOUND";
	override name = "NotFoundError";
}

/** A per-client cap was hit (`limit` names it): back off and retry. */
export class ResourceExhaustedError extends FencingError {
	static override readonly reason = "RESOURCE_EXHAUSTED";
	override name = "ResourceExhaustedError";
	readonly limit: string;
	constructor(message: string, limit = "") {
		super(message);
		this.limit = limit;
	}
}

/** A status the SDK has no error class for (UNIMPLEMENTED...), with its gRPC code. */
export class RpcError extends Error {
	override name = "RpcError";
	readonly code: number;
	constructor(code: number, details: string) {
		super(`${Code[code] ?? code}: ${details}`);
		this.code = code;
	}
}

/** The SDK error for a fencing.v1 reason with its ErrorInfo metadata. */
export function fromReason(
	reason: string,
	message: string,
	meta: Meta,
): FencingError | null {
	switch (reason) {
		case "STALE_TOKEN":
			return new StaleTokenError(message, {
				resource: meta.resource ?? "",
				token: int(meta, "token"),
				currentToken: int(meta, "current_token"),
				keyApplied: keyApplied(meta),
				appliedByToken: int(meta, "applied_by_token"),
			});
		case "LEASE_HELD":
			return new LeaseHeldError(message, {
				resource: meta.resource ?? "",
				holder: meta.holder ?? "",
				remainingMs: int(meta, "remaining_ms"),
			});
		case "LEASE_LOST":
			return new LeaseLostError(message, {
				resource: meta.resource ?? "",
				token: int(meta, "token"),
				keyApplied: keyApplied(meta),
				appliedByToken: int(meta, "applied_by_token"),
			});
		case "INVALID_ARGUMENT":
			return new InvalidArgumentError(message, meta.field ?? "");
		case "BACKEND_UNAVAILABLE":
			return new BackendUnavailableError(message);
		case "DEADLINE_EXCEEDED":
			return new DeadlineExceededError(message);
		case "UNAUTHENTICATED":
			return new UnauthenticatedError(message);
		case "PERMISSION_DENIED":
			return new PermissionDeniedError(message);
		case "NOT_FOUND":
			return new NotFoundError(message);
		case "RESOURCE_EXHAUSTED":
			return new ResourceExhaustedError(message, meta.limit ?? "");
		default:
			return null;
	}
}

/** The nearest SDK error for a status without our ErrorInfo. */
export function fromCode(code: number, details: string): Error {
	switch (code) {
		case Code.UNAVAILABLE:
			return new BackendUnavailableError(`server unavailable: ${details}`);
		case Code.DEADLINE_EXCEEDED:
			return new DeadlineExceededError(`deadline exceeded: ${details}`);
		case Code.UNAUTHENTICATED:
			return new UnauthenticatedError(details || "unauthenticated");
		case Code.PERMISSION_DENIED:
			return new PermissionDeniedError(details || "permission denied");
		case Code.RESOURCE_EXHAUSTED:
			return new ResourceExhaustedError(details || "resource exhausted");
		case Code.INVALID_ARGUMENT:
			return new InvalidArgumentError(details || "invalid argument");
		case Code.CANCELLED:
			return new BackendUnavailableError(`call cancelled: ${details}`);
		default:
			return new RpcError(code, details);
	}
}

/** Rebuild the SDK error a `google.rpc.Status` stands for. */
export function fromStatus(status: Status): Error {
	for (const detail of status.details) {
		if (detail.typeUrl.endsWith("/google.rpc.ErrorInfo")) {
			const info = ErrorInfo.decode(detail.value);
			if (info.domain === DOMAIN) {
				const ours = fromReason(info.reason, status.message, info.metadata);
				if (ours !== null) return ours;
			}
		}
	}
	return fromCode(status.code, status.message);
}

function isServiceError(err: unknown): err is ServiceError {
	return (
		err instanceof Error &&
		typeof (err as Partial<ServiceError>).code === "number"
	);
}

/** The SDK error for a failed gRPC call (anything else is returned unchanged). */
export function translate(err: unknown): unknown {
	if (!isServiceError(err)) return err;
	const bin =
		err.metadata instanceof Metadata
			? err.metadata.get("grpc-status-details-bin")
			: [];
	const raw = bin[0];
	if (raw instanceof Buffer) {
		return fromStatus(Status.decode(raw));
	}
	return fromCode(err.code, err.details);
}

/** Failures where the request may not have reached a decision: safe to retry idempotently. */
export function isTransient(err: unknown): boolean {
	return (
		err instanceof BackendUnavailableError ||
		err instanceof DeadlineExceededError
	);
}
