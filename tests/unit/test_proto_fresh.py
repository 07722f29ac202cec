"""The generated code under tidegate/v1 and tidegate/etcdapi matches proto/ (never hand-edited)."""

from __future__ import annotations

from pathlib import Path

from module_file import load_module  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]


def _gen_module():
    return load_module(ROOT / "scripts" / "gen_proto.py")


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    produced = _gen_module().generate(tmp_path)
    assert produced, "no proto files found"
    stale = []
    for path in produced:
        rel = path.relative_to(tmp_path)
        committed = ROOT / rel
        if not committed.exists() or committed.read_bytes() != path.read_bytes():
            stale.append(str(rel))
    assert not stale, f"generated code is stale, run `python scripts/gen_proto.py`: {stale}"


def test_every_proto_has_generated_code() -> None:
    for proto in (ROOT / "proto").rglob("*.proto"):
        stem = proto.relative_to(ROOT / "proto").with_suffix("")
        assert (ROOT / f"{stem}_pb2.py").exists(), stem
