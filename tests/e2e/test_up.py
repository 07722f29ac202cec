"""`tidegate up` as a user runs it: a real subprocess that writes its endpoints file, survives a
crashed child, and leaves no process behind after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_up_writes_endpoints_and_stops_everything(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidegate.cli.main", "up", "--replicas", "2", "--profile", "instant",
         "--endpoints-file", str(endpoints), "--run-dir", str(tmp_path / "run"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not endpoints.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no endpoints file"
            time.sleep(0.2)
        info = json.loads(endpoints.read_text())
        assert info["router_url"].startswith("http://127.0.0.1:")
        assert info["etcd_embedded"] is True and len(info["replicas"]) == 2
        assert Path(info["tokens"]["operator"]).exists()
        pids = list(info["pids"].values())
        assert all(_alive(p) for p in pids)

        # A child crashes: `up` keeps running, and still cleans up the rest at the end.
        os.kill(info["pids"]["sim-1"], signal.SIGKILL)
        time.sleep(1.0)
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        time.sleep(0.5)
        assert [p for p in pids if _alive(p)] == []
        assert not endpoints.exists(), "the endpoints file of a stopped fleet must go"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
