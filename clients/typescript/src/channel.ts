/**
 * How a client reaches a server: TLS (mTLS with a client certificate) and the bearer
 * token the Python SDK sends (`authorization: Bearer <token>` on every call, only over
 * TLS or to a loopback address: never in the clear across a network).
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import {
	type ChannelCredentials,
	type ChannelOptions,
	credentials,
	type Interceptor,
	type InterceptorOptions,
	InterceptingCall,
	type Metadata,
} from "@grpc/grpc-js";
import { InvalidArgumentError } from "./errors.js";

/** PEM text, or a path to a PEM file. */
export type Pem = string | Buffer;

/** TLS for a client channel: `ca` verifies the server; `cert` + `key` present a client certificate. */
export interface TlsOptions {
	ca?: Pem;
	cert?: Pem;
	key?: Pem;
	/** The name the server's certificate must carry, if not the target's host. */
	serverName?: string;
}

/** What every client takes to reach its server. */
export interface ConnectOptions {
	tls?: TlsOptions;
	/** Bearer token sent on every call (over TLS, or to a loopback address only). */
	token?: string;
	/** Per-call deadline of calls that do not wait, in seconds (default 5). */
	rpcTimeout?: number;
}

/** The gRPC message size limit the servers enforce (fencing.limits.MAX_MESSAGE_BYTES). */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

function pem(value: Pem | undefined): Buffer | null {
	if (value === undefined) return null;
	if (Buffer.isBuffer(value)) return value;
	return value.includes("-----BEGIN")
		? Buffer.from(value)
		: readFileSync(value);
}

export function hostOf(target: string): string {
	if (target.startsWith("[")) return target.slice(1, target.indexOf("]"));
	const colon = target.lastIndexOf(":");
	return colon < 0 ? target : target.slice(0, colon);
}

export function isLoopback(host: string): boolean {
	if (host === "localhost") return true;
	if (isIP(host) === 4) return host.startsWith("127.");
	return host === "::1";
}

/** A target only this host can reach: a loopback address, or a Unix socket (`unix:PATH`,
 * guarded by the file system's permissions). */
export function isLocalTarget(target: string): boolean {
	if (target.startsWith("unix:") || target.startsWith("unix-abstract:"))
		return true;
	return isLoopback(hostOf(target));
}

export interface Channel {
	credentials: ChannelCredentials;
	options: ChannelOptions;
	interceptors: Interceptor[];
}

/** The credentials, options and interceptors of a channel to `target`. */
export function channelFor(target: string, opts: ConnectOptions): Channel {
	const options: ChannelOptions = {
		"grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
		"grpc.max_send_message_length": MAX_MESSAGE_BYTES,
		"grpc.keepalive_time_ms": 30_000,
		"grpc.keepalive_timeout_ms": 10_000,
	};
	let creds: ChannelCredentials;
	if (opts.tls !== undefined) {
		creds = credentials.createSsl(
			pem(opts.tls.ca),
			pem(opts.tls.key),
			pem(opts.tls.cert),
		);
		if (opts.tls.serverName !== undefined) {
			options["grpc.ssl_target_name_override"] = opts.tls.serverName;
			options["grpc.default_authority"] = opts.tls.serverName;
		}
	} else {
		creds = credentials.createInsecure();
	}
	const interceptors: Interceptor[] = [];
	if (opts.token) {
		if (opts.tls === undefined && !isLocalTarget(target)) {
			throw new InvalidArgumentError(
				`a bearer token is only sent over TLS, to a loopback address or to a Unix socket; ${target} needs tls`,
				"token",
			);
		}
		const header = `Bearer ${opts.token}`;
		interceptors.push(
			(options: InterceptorOptions, next) =>
				new InterceptingCall(next(options), {
					start(metadata: Metadata, listener, nextStart) {
						metadata.set("authorization", header);
						nextStart(metadata, listener);
					},
				}),
		);
	}
	return {
		credentials: creds,
		options: { ...options, interceptors },
		interceptors,
	};
}

/** Check a positive number of seconds. */
export function seconds(value: number, field: string): number {
	if (!(Number.isFinite(value) && value > 0)) {
		throw new InvalidArgumentError(
			`${field} must be positive seconds, got ${value}`,
			field,
		);
	}
	return value;
}
