"""Regenerate the committed gRPC/protobuf stubs in fencing/v1 from proto/.

    python scripts/gen_protos.py          # rewrite fencing/v1/*_pb2*.py(i)
    python scripts/gen_protos.py --check  # exit 1 if the committed copy is stale

Needs the `dev` extra (grpcio-tools, mypy-protobuf), pinned in pyproject.toml
because the generated code embeds the protobuf version that produced it.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_PACKAGE = Path("fencing") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) for every .proto into out_dir; return written files."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    # google/rpc/status.proto: shipped by googleapis-common-protos (grpcio-status needs
    # it), whose generated module google.rpc.status_pb2 the stubs import.
    import google.rpc.status_pb2 as rpc_status

    googleapis = Path(rpc_status.__file__).resolve().parent.parent.parent
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"-I{googleapis}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / OUT_PACKAGE).glob("*_pb2*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when committed stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        target = ROOT / OUT_PACKAGE
        stale: list[str] = []
        fresh_names = {p.name for p in fresh}
        committed = {p.name for p in target.glob("*_pb2*") if p.name.endswith(GENERATED_SUFFIXES)}
        for path in fresh:
            dest = target / path.name
            if not dest.exists() or not filecmp.cmp(path, dest, shallow=False):
                stale.append(path.name)
                if not args.check:
                    dest.write_bytes(path.read_bytes())
        for name in sorted(committed - fresh_names):
            stale.append(name)
            if not args.check:
                (target / name).unlink()
    if args.check and stale:
        print(f"stale generated stubs in {OUT_PACKAGE}: {', '.join(stale)}", file=sys.stderr)
        print("run: python scripts/gen_protos.py", file=sys.stderr)
        return 1
    print("stubs up to date" if not stale else f"regenerated: {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
