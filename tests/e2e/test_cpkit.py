"""The e2e helpers themselves: a control plane that never gets ready is killed and reaped (no
zombie left holding its port for the next test)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import cpkit  # type: ignore[import-not-found]
import pytest

pytestmark = pytest.mark.e2e


async def test_a_control_plane_that_never_prints_its_port_is_killed_and_reaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    silent = tmp_path / "tidegate"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    monkeypatch.setattr(cpkit, "TIDEGATE", str(silent))
    started: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def watched(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        proc = await spawn(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(cpkit.asyncio, "create_subprocess_exec", watched)
    with pytest.raises(AssertionError, match="did not print its port"):
        await cpkit.start_cp("http://127.0.0.1:1", "cp-silent", tmp_path, ready_s=0.5)
    [proc] = started
    assert proc.returncode == -signal.SIGKILL  # waited for: set only once the child is reaped


async def test_kill_and_reap_tolerates_a_process_that_already_exited() -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    await cpkit.kill_and_reap(proc)
    assert proc.returncode == 0
