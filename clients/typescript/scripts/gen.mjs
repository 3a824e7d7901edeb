// Regenerate src/gen/ from the repository's proto/ with ts-proto.
//
//   npm run gen          rewrite src/gen/
//   npm run gen:check    exit 1 if the committed copy is stale
//
// protoc is the one the Python stubs are generated with (grpcio-tools, the repository's
// dev extra), so both SDKs are generated from the same protos by the same compiler;
// google/rpc/*.proto come from googleapis-common-protos, as for the Python stubs.
import { execFileSync } from "node:child_process";
import {
	mkdtempSync,
	readdirSync,
	readFileSync,
	rmSync,
	statSync,
	writeFileSync,
	mkdirSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = resolve(here, "..");
const root = resolve(pkg, "..", "..");
const protoRoot = join(root, "proto");
const target = join(pkg, "src", "gen");
const python = process.env.PYTHON ?? "python";

const includes = execFileSync(python, [
	"-c",
	"import os, grpc_tools, google.rpc.status_pb2 as s; " +
		"print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto')); " +
		"print(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(s.__file__)))))",
])
	.toString()
	.trim()
	.split("\n");

function walk(dir) {
	return readdirSync(dir).flatMap((name) => {
		const path = join(dir, name);
		return statSync(path).isDirectory() ? walk(path) : [path];
	});
}

const protos = walk(protoRoot)
	.filter((p) => p.endsWith(".proto"))
	.map((p) => relative(protoRoot, p))
	.sort();

function generate(out) {
	const plugin = join(pkg, "node_modules", ".bin", "protoc-gen-ts_proto");
	const options = [
		"outputServices=grpc-js",
		"esModuleInterop=true",
		"importSuffix=.js",
		"forceLong=number",
		"useOptionals=none",
		"oneof=unions-value",
		"useExactTypes=false",
		"env=node",
	].join(",");
	execFileSync(python, [
		"-m",
		"grpc_tools.protoc",
		`--plugin=protoc-gen-ts_proto=${plugin}`,
		`--ts_proto_out=${out}`,
		`--ts_proto_opt=${options}`,
		`-I${protoRoot}`,
		...includes.map((i) => `-I${i}`),
		...protos,
		// ErrorInfo, the detail every fencing error status carries.
		"google/rpc/error_details.proto",
	]);
	return walk(out)
		.map((p) => relative(out, p))
		.sort();
}

const check = process.argv.includes("--check");
const tmp = mkdtempSync(join(tmpdir(), "fencing-ts-gen-"));
try {
	const fresh = generate(tmp);
	const committed = statSync(target, { throwIfNoEntry: false })
		? walk(target)
				.map((p) => relative(target, p))
				.sort()
		: [];
	const stale = [];
	for (const name of fresh) {
		const text = readFileSync(join(tmp, name));
		let same = false;
		try {
			same = readFileSync(join(target, name)).equals(text);
		} catch {}
		if (!same) {
			stale.push(name);
			if (!check) {
				mkdirSync(dirname(join(target, name)), { recursive: true });
				writeFileSync(join(target, name), text);
			}
		}
	}
	for (const name of committed.filter((n) => !fresh.includes(n))) {
		stale.push(name);
		if (!check) rmSync(join(target, name));
	}
	if (check && stale.length > 0) {
		console.error(
			`stale generated code in src/gen: ${stale.join(", ")}\nrun: npm run gen`,
		);
		process.exit(1);
	}
	console.log(
		stale.length === 0
			? "generated code up to date"
			: `regenerated: ${stale.join(", ")}`,
	);
} finally {
	rmSync(tmp, { recursive: true, force: true });
}
