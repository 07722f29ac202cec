"""The fault policy's memory in etcd: one FaultRecord per replica with an ejection history.

Without it a new leader (failover, or etcd back after an outage) would know nothing of an
ejection and re-admit the replica at its first healthy report, skipping the backoff. The
leader writes a record, fenced like the tables, when the persistent part of a replica's
`FaultState` changes (ejected, cause, permanence, times, ejections in a row), and deletes it
when the state is clean again or the replica is forgotten. A new term reads them all and
gives each to a replica whose state here is still the default.

Times are wall-clock in etcd and monotonic in memory; `to_record` / `from_record` convert with
the two clocks read once (pure functions of their arguments).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import structlog
from google.protobuf import timestamp_pb2

from tidegate import codec, keys
from tidegate.controlplane.fleet import FleetState
from tidegate.errors import StoreError
from tidegate.policy.faults import FaultState
from tidegate.store.api import Fence, FencedError, Store
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)

Persisted = tuple[bool, str, bool, float, float, int, float | None]


def persisted(state: FaultState) -> Persisted | None:
    """The part of `state` worth keeping across leaders; None when there is nothing to keep."""
    if not state.ejected and state.ejections == 0:
        return None
    return (state.ejected, state.cause, state.permanent, state.ejected_at, state.readmit_at, state.ejections,
            state.last_readmit_at)


def _ts(wall: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(wall * 1e9))
    return ts


def to_record(replica_id: str, state: FaultState, mono_now: float, wall_now: float,
              controlplane_id: str) -> records_pb2.FaultRecord:
    def wall(mono: float) -> timestamp_pb2.Timestamp:
        return _ts(wall_now + (mono - mono_now))

    rec = records_pb2.FaultRecord(replica_id=replica_id, ejected=state.ejected, cause=state.cause,
                                  permanent=state.permanent, ejected_at=wall(state.ejected_at),
                                  readmit_at=wall(state.readmit_at), ejections=state.ejections,
                                  controlplane_id=controlplane_id)
    if state.last_readmit_at is not None:
        rec.last_readmit_at.CopyFrom(wall(state.last_readmit_at))
    return rec


def from_record(rec: records_pb2.FaultRecord, mono_now: float, wall_now: float) -> FaultState:
    def mono(ts: timestamp_pb2.Timestamp) -> float:
        return mono_now + (ts.ToNanoseconds() / 1e9 - wall_now)

    return replace(FaultState(), ejected=rec.ejected, cause=rec.cause, permanent=rec.permanent,
                   ejected_at=mono(rec.ejected_at), readmit_at=mono(rec.readmit_at), ejections=rec.ejections,
                   last_readmit_at=mono(rec.last_readmit_at) if rec.HasField("last_readmit_at") else None)


class FaultBook:
    def __init__(self, store: Store, controlplane_id: str, *, now: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_fenced: Callable[[str], None] = lambda reason: None) -> None:
        self._store = store
        self._on_fenced = on_fenced
        self._id = controlplane_id
        self._now = now
        self._wall = wall
        self._saved: dict[str, Persisted] = {}

    async def restore(self, fleet: FleetState) -> int:
        """Reads every FaultRecord and gives it to replicas still in their default state here.
        Returns how many were applied; raises StoreError (the caller retries next tick)."""
        listing = await self._store.list_prefix(keys.FAULTS)
        mono_now, wall_now = self._now(), self._wall()
        self._saved.clear()
        applied = 0
        for kv in listing.items:
            rid = keys.leaf(keys.FAULTS, kv.key)
            try:
                state = from_record(codec.decode(kv.value, records_pb2.FaultRecord), mono_now, wall_now)
            except codec.DecodeError:
                log.warning("fault_record_undecodable", replica_id=rid)
                continue
            saved = persisted(state)
            if saved is not None:
                self._saved[rid] = saved
            if fleet.restore_fault(rid, state):
                applied += 1
        if applied:
            log.info("faults_restored", replicas=applied)
        return applied

    async def save(self, fleet: FleetState, fence: Callable[[], Fence | None]) -> None:
        """Writes what changed since the last save; deletes records of clean or forgotten
        replicas (both fenced: a deposed leader must not erase its successor's record). Never
        raises StoreError: it stops at the first failure and the next tick retries what is left."""
        states = fleet.fault_states()
        mono_now, wall_now = self._now(), self._wall()
        try:
            for rid, state in sorted(states.items()):
                want = persisted(state)
                if want is None or self._saved.get(rid) == want:
                    continue
                current = fence()
                if current is None:
                    return
                rec = to_record(rid, state, mono_now, wall_now, self._id)
                await self._store.put_fenced(keys.fault(rid), codec.encode(rec), current)
                self._saved[rid] = want
            for rid in [r for r in self._saved if persisted(states.get(r, FaultState())) is None]:
                current = fence()
                if current is None:
                    return
                await self._store.delete_fenced(keys.fault(rid), current)
                del self._saved[rid]
        except FencedError as e:
            # Tables may not change this tick, so their publisher need not meet the refusal itself.
            log.warning("faults_save_fenced", error=str(e))
            self._on_fenced(str(e))
        except StoreError as e:
            log.info("faults_save_failed", error=str(e))
