"""controlplane/fenced.py's FencedWriter on an in-memory store: an etcd error (not a refused
fence) loses nothing and ends no term: the write is reported as not landed, so its caller tries it
again next tick; a partial failure reports exactly which writes landed."""

from __future__ import annotations

from tidegate.controlplane.fenced import FencedWriter
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore

FENCE_KEY = "/tidegate/v1/election/controlplane/1"


async def _fence(store: InMemoryStore) -> Fence:
    await store.put(FENCE_KEY, b"cp")
    return Fence(FENCE_KEY, store.create_revision(FENCE_KEY))


async def test_an_etcd_error_is_not_landed_not_fenced_and_the_retry_lands() -> None:
    store, reasons = InMemoryStore(), []
    fence = await _fence(store)
    writer = FencedWriter(store, "scale", reasons.append)
    store.down = True
    assert await writer.write([("/k/a", b"1"), ("/k/b", b"2")], lambda: fence) == [False, False]
    assert reasons == []                                  # an outage is not a lost term
    store.down = False
    assert await writer.write([("/k/a", b"1"), ("/k/b", b"2")], lambda: fence) == [True, True]
    assert (await store.get("/k/a")).value == b"1"  # type: ignore[union-attr]


async def test_a_partial_failure_names_the_writes_that_landed() -> None:
    store, reasons = InMemoryStore(), []
    fence = await _fence(store)
    writer = FencedWriter(store, "scale", reasons.append)
    store.fail_next(1)                                    # the first of the three puts fails
    landed = await writer.write([("/k/a", b"1"), ("/k/b", b"2"), ("/k/c", b"3")], lambda: fence)
    assert landed == [False, True, True] and reasons == []
    assert await store.get("/k/a") is None and await store.get("/k/c") is not None


async def test_nothing_is_tried_while_not_leading() -> None:
    store = InMemoryStore()
    writer = FencedWriter(store, "scale", lambda reason: None)
    calls = store.calls
    assert await writer.write([("/k/a", b"1")], lambda: None) == [False]
    assert store.calls == calls and await store.get("/k/a") is None
