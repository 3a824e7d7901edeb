/**
 * When to renew a lease and when to stop trusting it (the Python SDK's
 * `fencing._renewal`), on the monotonic clock, in seconds.
 *
 *     start    = min(sentAt + waited * (1 - marginRatio), receivedAt)
 *     deadline = start + ttl - margin,   margin = ttl * marginRatio + marginFloor
 *
 * The lease lives its ttl from the grant: `waited` (the server's report of the time the
 * request spent in line) is added to the send time, so a wait is not counted against it.
 * Renewals go every ttl/3 from the start; a failed one is retried sooner, never past the
 * deadline.
 */
import { performance } from "node:perf_hooks";

export type Clock = () => number;

/** Seconds on the monotonic clock. */
export const monotonic: Clock = () => performance.now() / 1000;

export interface RenewalPolicy {
	renewRatio: number;
	marginRatio: number;
	marginFloor: number;
	retryRatio: number;
	maxRetryInterval: number;
}

export const DEFAULT_POLICY: RenewalPolicy = {
	renewRatio: 1 / 3,
	marginRatio: 0.05,
	marginFloor: 0.005,
	retryRatio: 0.1,
	maxRetryInterval: 1.0,
};

function margin(p: RenewalPolicy, ttl: number): number {
	return Math.min(ttl * p.marginRatio + p.marginFloor, ttl / 2);
}

export class RenewalSchedule {
	ttl: number;
	deadline: number;
	nextRenewal: number;
	constructor(
		ttlMs: number,
		sentAt: number,
		readonly policy: RenewalPolicy,
		waitedMs: number,
		receivedAt: number,
	) {
		this.ttl = ttlMs / 1000;
		const allowed =
			Math.max(0, waitedMs / 1000) * Math.max(0, 1 - policy.marginRatio);
		const start = Math.max(sentAt, Math.min(sentAt + allowed, receivedAt));
		this.deadline = start + this.ttl - margin(policy, this.ttl);
		this.nextRenewal = start + this.ttl * policy.renewRatio;
	}
	dueOnArrival(now: number): boolean {
		return now >= this.nextRenewal;
	}
	renewed(sentAt: number, ttlMs: number): void {
		const ttl = ttlMs / 1000;
		this.ttl = ttl;
		this.deadline = Math.max(
			this.deadline,
			sentAt + ttl - margin(this.policy, ttl),
		);
		this.nextRenewal = sentAt + ttl * this.policy.renewRatio;
	}
	failed(now: number): void {
		const retry = Math.min(
			this.ttl * this.policy.retryRatio,
			this.policy.maxRetryInterval,
		);
		this.nextRenewal = Math.min(now + retry, this.deadline);
	}
	expired(now: number): boolean {
		return now >= this.deadline;
	}
	remaining(now: number): number {
		return Math.max(0, this.deadline - now);
	}
	sleepFor(now: number): number {
		return Math.max(0, Math.min(this.nextRenewal, this.deadline) - now);
	}
	rpcTimeout(now: number, cap: number): number {
		return Math.max(0.001, Math.min(cap, this.deadline - now));
	}
}
