"""Regenerate the Python code for proto/ into the package tree.

Usage: python scripts/gen_proto.py [OUT_DIR]   (default: the repository root)

The generated modules land next to the package that the proto path names
(proto/tidegate/v1/x.proto -> tidegate/v1/x_pb2.py), because generated code
imports its siblings by the path relative to -I. Never edit them by hand;
tests/unit/test_proto_fresh.py fails when they are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(PROTO.rglob("*.proto"))
    rel = [str(f.relative_to(PROTO)) for f in files]
    args = [
        "protoc",
        f"-I{PROTO}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    produced = []
    for r in rel:
        stem = Path(r).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            produced.append(out_dir / f"{stem}{suffix}")
    return produced


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for p in generate(out):
        print(p.relative_to(out))
