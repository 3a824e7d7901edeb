/** fencing-guard's TypeScript SDK: leases with fencing tokens, guarded writes. */
export type { ConnectOptions, Pem, TlsOptions } from "./channel.js";
export {
	AcquireTimeoutError,
	BackendUnavailableError,
	DeadlineExceededError,
	FencingError,
	InvalidArgumentError,
	LeaseHeldError,
	LeaseLostError,
	NotFoundError,
	PermissionDeniedError,
	ResourceExhaustedError,
	RpcError,
	StaleTokenError,
	UnauthenticatedError,
} from "./errors.js";
export type {
	Fenced,
	ManyResult,
	Op,
	StoredRecord,
	WriteOptions,
	WriteResult,
} from "./guard.js";
export { GuardClient } from "./guard.js";
export type {
	AcquireOptions,
	EventKind,
	Fencer,
	HoldOptions,
	LeaseClientOptions,
	LeaseEvent,
	LeaseState,
	WatchOptions,
} from "./lease.js";
export { Lease, LeaseClient } from "./lease.js";
export type { RenewalPolicy } from "./renewal.js";
export type { Transport } from "./transport.js";
export type { FailResult, Handler, NewJob, WorkerOptions } from "./queue.js";
export { Job, QueueClient, Worker } from "./queue.js";
