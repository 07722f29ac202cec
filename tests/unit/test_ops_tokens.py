"""`tidegate up`'s local admin tokens: fresh, owner-only files, a tokens file the control plane reads."""

from __future__ import annotations

import stat
from pathlib import Path

from tidegate.controlplane.auth import parse_tokens
from tidegate.fleet.up import write_tokens


def test_write_tokens(tmp_path: Path) -> None:
    paths, csv = write_tokens(tmp_path)
    assert set(paths) == {"operator", "viewer"}
    for p in (Path(paths["operator"]), Path(paths["viewer"]), csv):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    operator = Path(paths["operator"]).read_text().strip()
    viewer = Path(paths["viewer"]).read_text().strip()
    assert operator != viewer and len(operator) >= 32
    principals = parse_tokens(csv.read_text())
    assert principals[operator].name == "local-operator" and principals[operator].role == "operator"
    assert principals[viewer].name == "local-viewer" and principals[viewer].role == "viewer"


def test_write_tokens_again_makes_new_tokens_and_keeps_modes(tmp_path: Path) -> None:
    first, _ = write_tokens(tmp_path)
    before = Path(first["operator"]).read_text()
    Path(first["operator"]).chmod(0o644)
    second, _ = write_tokens(tmp_path)
    assert Path(second["operator"]).read_text() != before
    assert stat.S_IMODE(Path(second["operator"]).stat().st_mode) == 0o600
