"""Shared fixtures: a real etcd per test session (and a private one for tests that stop it)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import structlog

from tidegate.etcd_server import EmbeddedEtcd
from tidegate.store.etcd import EtcdStore


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EmbeddedEtcd]:
    """One etcd process for the whole session; do not stop it (use `fresh_etcd` for that)."""
    with EmbeddedEtcd() as server:
        yield server


@pytest.fixture
def etcd_endpoint(etcd_server: EmbeddedEtcd) -> str:
    """"127.0.0.1:PORT" of the session's etcd."""
    return etcd_server.endpoint


@pytest.fixture
async def clean_etcd(etcd_endpoint: str) -> AsyncIterator[str]:
    """The session etcd with every /tidegate/ key deleted before the test; yields the endpoint."""
    store = EtcdStore([etcd_endpoint])
    await store.connect()
    try:
        await store.delete_prefix("/tidegate/")
    finally:
        await store.close()
    yield etcd_endpoint


@pytest.fixture
def fresh_etcd() -> Iterator[EmbeddedEtcd]:
    """A private etcd for this test only (tests that stop, kill or restart etcd)."""
    with EmbeddedEtcd() as server:
        yield server


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Tests that configure logging (e.g. at level warning) must not hide info logs from
    later tests' structlog.testing.capture_logs()."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture
def refused_port() -> Iterator[Callable[[], int]]:
    """Makes loopback ports that refuse connections: bound but never listening, and held until
    the test ends, so no other process (a parallel test run) can take one and answer."""
    held: list[socket.socket] = []

    def make() -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
        return int(s.getsockname()[1])

    yield make
    for s in held:
        s.close()
