/**
 * A holder in its own process, for the paused-holder tests: holds `resource` with
 * `ttl`, prints `token N`, then on each stdin line `write` writes through the guard and
 * prints `ok fence=N` or `stale current=N`; prints `lost` when its lease's signal fires,
 * and leaves on `exit`. The test freezes this whole process with SIGSTOP: renewals,
 * timers and all.
 *
 *   node holder_child.js LEASE_ADDR GUARD_ADDR RESOURCE TTL
 */
import { GuardClient, LeaseClient, StaleTokenError } from "../src/index.js";

const [leaseAddr, guardAddr, resource, ttl] = process.argv.slice(2) as [
	string,
	string,
	string,
	string,
];
const leases = new LeaseClient(leaseAddr);
const guard = new GuardClient(guardAddr);

await leases
	.hold(resource, { ttl: Number(ttl) }, async (lease, signal) => {
		signal.addEventListener("abort", () => console.log("lost"));
		console.log(`token ${lease.token}`);
		let buffered = "";
		await new Promise<void>((done) => {
			process.stdin.on("data", async (chunk: Buffer) => {
				buffered += chunk.toString();
				let nl = buffered.indexOf("\n");
				while (nl >= 0) {
					const line = buffered.slice(0, nl);
					buffered = buffered.slice(nl + 1);
					nl = buffered.indexOf("\n");
					if (line === "exit") return done();
					if (line !== "write") continue;
					try {
						// Deliberately no lease.check(): the guard alone must refuse the paused holder.
						const fence = await guard.put(
							lease,
							"owner",
							`token ${lease.token}`,
						);
						console.log(`ok fence=${fence}`);
					} catch (err) {
						if (err instanceof StaleTokenError)
							console.log(`stale current=${err.currentToken}`);
						else console.log(`error ${String(err)}`);
					}
				}
			});
		});
		process.stdin.pause();
	})
	.catch((err: unknown) =>
		console.log(`hold ended: ${err instanceof Error ? err.name : String(err)}`),
	);
leases.close();
guard.close();
