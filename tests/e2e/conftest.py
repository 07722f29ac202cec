"""End-to-end fixtures shared by several test modules (helpers they use directly: cpkit.py,
etcd_records.py, polling.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cpkit import ControlPlaneProc, start_cp  # type: ignore[import-not-found]

from tidegate.store.etcd import EtcdStore


@pytest.fixture
async def store(clean_etcd: str) -> AsyncIterator[EtcdStore]:
    """A client of the session etcd, every /tidegate/ key deleted before the test."""
    async with EtcdStore([clean_etcd]) as s:
        yield s


@pytest.fixture
async def cps(clean_etcd: str, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[ControlPlaneProc]]]:
    """Starts control-plane processes on the clean session etcd: `await cps("cp-a", *flags)`;
    those still running at the end are killed."""
    started: list[ControlPlaneProc] = []

    async def start(cp_id: str, *extra: str) -> ControlPlaneProc:
        cp = await start_cp(clean_etcd, cp_id, tmp_path, *extra)
        started.append(cp)
        return cp

    yield start
    for cp in started:
        if cp.proc.returncode is None:
            cp.proc.kill()
            await cp.proc.wait()
