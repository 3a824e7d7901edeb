/**
 * TLS, mTLS and bearer tokens against real servers (the TypeScript twin of the Python
 * SDK's tests/integration/test_security.py): throw-away certificates made by `trustme`
 * in a child Python, servers started with `--tls-cert/--tls-key` (and `--tls-ca` for
 * mTLS) and an `--auth-file` TOML policy. Every refusal is checked for its typed error
 * and beside it a client that differs only in the one thing refused, which works.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
	BackendUnavailableError,
	type ConnectOptions,
	GuardClient,
	InvalidArgumentError,
	LeaseClient,
	type LeaseClientOptions,
	PermissionDeniedError,
	type TlsOptions,
	UnauthenticatedError,
} from "../src/index.js";
import { type Stack, startStack, unique } from "./servers.js";

const PYTHON = process.env.PYTHON ?? "python";

/** The same principals as the Python test: alice may write orders/, bob only read them. */
const POLICY = `
[principals.alice]
tokens = ["alice-token"]
allow = [
  { prefix = "orders/", actions = ["acquire", "renew", "release", "describe"] },
  { prefix = "orders/", actions = ["write", "read"] },
]

[principals.bob]
tokens = ["bob-token"]
allow = [{ prefix = "orders/", actions = ["acquire", "renew", "release", "describe", "read"] }]
`;

/**
 * A CA, the server's certificate by it (localhost, 127.0.0.1), client certificates by it
 * (worker-1.example.com, billing.svc, stranger.svc) and a second CA that signed nothing of
 * ours, as PEM files.
 */
const MAKE_CERTS = `
import sys, pathlib, trustme
d = pathlib.Path(sys.argv[1])
ca, other = trustme.CA(), trustme.CA()
ca.cert_pem.write_to_path(d / "ca.pem")
other.cert_pem.write_to_path(d / "other-ca.pem")
server = ca.issue_cert("localhost", "127.0.0.1")
server.cert_chain_pems[0].write_to_path(d / "server.pem")
server.private_key_pem.write_to_path(d / "server.key")
for name, identity in [
    ("client", "worker-1.example.com"),
    ("billing", "billing.svc"),
    ("stranger", "stranger.svc"),
]:
    cert = ca.issue_cert(identity, common_name=identity)
    cert.cert_chain_pems[0].write_to_path(d / f"{name}.pem")
    cert.private_key_pem.write_to_path(d / f"{name}.key")
`;

/** mTLS principals: a certificate identity maps to a principal of the policy. */
const IDENTITY_POLICY = `
[principals.billing]
identities = ["billing.svc"]
allow = [{ prefix = "orders/", actions = ["acquire", "release", "describe"] }]
`;

let certs: string;
const pem = (name: string): string => join(certs, name);

/** TLS trusting our CA and presenting the certificate `name`.pem / `name`.key. */
const presenting = (name: string): TlsOptions => ({
	ca: pem("ca.pem"),
	cert: pem(`${name}.pem`),
	key: pem(`${name}.key`),
});

before(() => {
	certs = mkdtempSync(join(tmpdir(), "fencing-ts-certs-"));
	execFileSync(PYTHON, ["-c", MAKE_CERTS, certs], { stdio: "inherit" });
	writeFileSync(pem("auth.toml"), POLICY);
	writeFileSync(pem("identities.toml"), IDENTITY_POLICY);
});
after(() => {
	rmSync(certs, { recursive: true, force: true });
});

/** TLS trusting our CA (the PEM text, as a user holding it in memory would pass it). */
/** The servers' TLS flags (their certificate and key), then ``extra``. */
const serving = (...extra: string[]): string[] => [
	"--tls-cert",
	pem("server.pem"),
	"--tls-key",
	pem("server.key"),
	...extra,
];
const trusting = (): TlsOptions => ({
	ca: readFileSync(pem("ca.pem"), "utf8"),
});

const TRANSPORTS = ["stream", "unary"] as const;

describe("TLS and bearer tokens", () => {
	let stack: Stack;
	const clients: { close(): void }[] = [];
	function leaseClient(options: LeaseClientOptions): LeaseClient {
		const c = new LeaseClient(stack.lease.address, options);
		clients.push(c);
		return c;
	}
	function guardClient(options: ConnectOptions): GuardClient {
		const c = new GuardClient(stack.guard.address, options);
		clients.push(c);
		return c;
	}
	before(async () => {
		const serve = serving("--auth-file", pem("auth.toml"));
		stack = await startStack(false, { lease: serve, guard: serve });
	});
	after(async () => {
		for (const c of clients) c.close();
		await stack.stop();
	});

	for (const transport of TRANSPORTS) {
		test(`a client with the CA and a token works as its principal (${transport})`, async () => {
			const leases = leaseClient({
				tls: trusting(),
				token: "alice-token",
				holder: "not-alice",
				transport,
			});
			const guard = guardClient({ tls: trusting(), token: "alice-token" });
			const resource = unique("orders/tls");
			const lease = await leases.acquire(resource, { ttl: 5 });
			// The server names the holder after the token's principal, not the holder option.
			assert.equal(lease.holder, "alice");
			assert.equal((await leases.describe(resource)).holder, "alice");
			assert.equal(await guard.put(lease, "total", "42"), lease.token);
			const record = await guard.read(resource, "total");
			assert.equal(record?.value.toString(), "42");
			assert.equal(record?.writtenByToken, lease.token);
			await lease.renew();
			await lease.release();
			assert.equal((await leases.describe(resource)).held, false);
		});

		test(`no token or an unknown one is unauthenticated (${transport})`, async () => {
			const resource = unique("orders/anon");
			const anon = leaseClient({ tls: trusting(), transport });
			await assert.rejects(
				anon.acquireNowait(resource, { ttl: 5 }),
				(err: unknown) => {
					assert.ok(err instanceof UnauthenticatedError, String(err));
					assert.match(err.message, /no credentials/);
					return true;
				},
			);
			const wrong = leaseClient({ tls: trusting(), token: "wrong", transport });
			await assert.rejects(
				wrong.acquireNowait(resource, { ttl: 5 }),
				(err: unknown) => {
					assert.ok(err instanceof UnauthenticatedError, String(err));
					assert.match(err.message, /unknown bearer token/);
					return true;
				},
			);
			// Nobody got the resource on the way.
			const alice = leaseClient({ tls: trusting(), token: "alice-token" });
			assert.equal((await alice.describe(resource)).held, false);
		});
	}

	test("a guard client without a token is unauthenticated", async () => {
		const anon = guardClient({ tls: trusting() });
		await assert.rejects(
			anon.read(unique("orders/anon"), "k"),
			UnauthenticatedError,
		);
	});

	test("a token without the prefix's permission is refused, naming it", async () => {
		const alice = leaseClient({ tls: trusting(), token: "alice-token" });
		const bobGuard = guardClient({ tls: trusting(), token: "bob-token" });
		const payments = unique("payments/p");
		await assert.rejects(
			alice.acquireNowait(payments, { ttl: 5 }),
			(err: unknown) => {
				assert.ok(err instanceof PermissionDeniedError, String(err));
				assert.ok(
					err.message.includes(`may not acquire '${payments}'`),
					err.message,
				);
				return true;
			},
		);
		const resource = unique("orders/bob");
		const lease = await alice.acquire(resource, { ttl: 5 });
		// bob may read orders/ but not write them.
		await assert.rejects(bobGuard.put(lease, "k", "v"), (err: unknown) => {
			assert.ok(err instanceof PermissionDeniedError, String(err));
			assert.match(err.message, /may not write/);
			return true;
		});
		assert.equal(await bobGuard.read(resource, "k"), null);
		await lease.release();
	});

	test("a plaintext client, or one trusting another CA, cannot connect", async () => {
		const resource = unique("orders/plain");
		const plaintext = leaseClient({ token: "alice-token", rpcTimeout: 1 });
		await assert.rejects(
			plaintext.acquireNowait(resource, { ttl: 5 }),
			BackendUnavailableError,
		);
		const unverified = (err: unknown): boolean => {
			assert.ok(err instanceof BackendUnavailableError, String(err));
			assert.match(err.message, /unable to verify/);
			return true;
		};
		const stranger = { ca: pem("other-ca.pem") };
		await assert.rejects(
			leaseClient({
				tls: stranger,
				token: "alice-token",
				rpcTimeout: 1,
			}).acquireNowait(resource, { ttl: 5 }),
			unverified,
		);
		await assert.rejects(
			guardClient({ tls: stranger, token: "alice-token", rpcTimeout: 1 }).read(
				resource,
				"k",
			),
			unverified,
		);
		// The control: the same call with TLS trusting our CA gets the (free) resource.
		const alice = leaseClient({ tls: trusting(), token: "alice-token" });
		await (await alice.acquireNowait(resource, { ttl: 5 })).release();
	});
});

describe("mTLS", () => {
	let stack: Stack;
	before(async () => {
		const serve = serving("--tls-ca", pem("ca.pem"));
		stack = await startStack(false, { lease: serve, guard: serve });
	});
	after(async () => {
		await stack.stop();
	});

	test("a client certificate names the holder; no certificate is refused", async () => {
		const resource = unique("jobs/mtls");
		const leases = new LeaseClient(stack.lease.address, {
			tls: presenting("client"),
			holder: "ignored",
		});
		const anon = new LeaseClient(stack.lease.address, {
			tls: trusting(),
			rpcTimeout: 1,
		});
		try {
			const lease = await leases.acquire(resource, { ttl: 5 });
			assert.equal(lease.holder, "worker-1.example.com");
			assert.equal(
				(await leases.describe(resource)).holder,
				"worker-1.example.com",
			);
			await lease.release();
			// Without a client certificate the handshake itself fails (the resource is free).
			await assert.rejects(
				anon.acquireNowait(resource, { ttl: 5 }),
				BackendUnavailableError,
			);
		} finally {
			leases.close();
			anon.close();
		}
	});
});

describe("mTLS with an auth policy", () => {
	let stack: Stack;
	before(async () => {
		const serve = serving(
			"--tls-ca",
			pem("ca.pem"),
			"--auth-file",
			pem("identities.toml"),
		);
		stack = await startStack(false, { lease: serve, guard: serve });
	});
	after(async () => {
		await stack.stop();
	});

	test("a certificate identity acts as its principal; an unknown one is refused, named", async () => {
		const billing = new LeaseClient(stack.lease.address, {
			tls: presenting("billing"),
		});
		const stranger = new LeaseClient(stack.lease.address, {
			tls: presenting("stranger"),
		});
		try {
			const resource = unique("orders/mtls");
			const lease = await billing.acquire(resource, { ttl: 5 });
			assert.equal(lease.holder, "billing");
			await lease.release();
			await assert.rejects(
				billing.acquireNowait(unique("payments/mtls"), { ttl: 5 }),
				PermissionDeniedError,
			);
			await assert.rejects(
				stranger.acquireNowait(resource, { ttl: 5 }),
				(err: unknown) => {
					assert.ok(err instanceof UnauthenticatedError, String(err));
					assert.match(err.message, /stranger\.svc/);
					return true;
				},
			);
		} finally {
			billing.close();
			stranger.close();
		}
	});
});

test("a token to a non-loopback address without TLS is refused before any call", () => {
	for (const make of [
		() => new LeaseClient("10.1.2.3:50051", { token: "secret" }),
		() => new GuardClient("10.1.2.3:50052", { token: "secret" }),
	]) {
		assert.throws(make, (err: unknown) => {
			assert.ok(err instanceof InvalidArgumentError, String(err));
			assert.equal(err.field, "token");
			assert.match(err.message, /only sent over TLS/);
			return true;
		});
	}
	// The control: the same token over TLS, to a loopback address or to a Unix socket
	// (this host's alone, as the Python SDK has it), is allowed.
	for (const c of [
		new LeaseClient("10.1.2.3:50051", { token: "secret", tls: {} }),
		new GuardClient("10.1.2.3:50052", { token: "secret", tls: {} }),
		new LeaseClient("127.0.0.1:50051", { token: "secret" }),
		new GuardClient("localhost:50052", { token: "secret" }),
		new LeaseClient("unix:/tmp/fencing-absent.sock", { token: "secret" }),
	])
		c.close();
});
