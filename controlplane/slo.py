"""Pool SLO targets and the scale recommendation, as the control plane holds and publishes them.

- SLO records (`PoolSlo` at keys.SLOS + pool) are written by the admin API on any instance and
  watched by every instance (`PoolSlos`); the leader copies each into its pool's RoutingTable,
  so a router reads a pool's targets and replicas at one revision (see docs/OPERATIONS.md).
- `ScaleReporter` turns each pool's computed table (fitted rates, running, waiting, KV) and the
  replicas' last reports (prompt/generation tokens per second, finished requests per second)
  into `tidegate.policy.scale.recommend` inputs, keeps the latest result per pool for
  `ListPools`, sets the gauge `tidegate_pool_recommended_replicas` and writes a
  `ScaleRecommendation` to keys.SCALE + pool when the figure, its binding constraint or the
  replicas serving change, or when the stored one is older than `refresh_s`. Writes are fenced
  like the tables (controlplane/fenced.py): a deposed leader's write does not land.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import structlog
from prometheus_client import CollectorRegistry, Gauge

from tidegate import codec, keys
from tidegate.controlplane.fenced import FencedWriter
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import _timestamp
from tidegate.policy.registry import SloTargets
from tidegate.policy.scale import ReplicaLoad, ScaleConfig, recommend
from tidegate.policy.weights import ROUTABLE_STATES
from tidegate.store.api import Fence, KeyValue, Store
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)

MAX_TARGET_S = 3600.0


def validate(slo: records_pb2.PoolSlo) -> None:
    """Raises ValueError naming what is wrong with an SLO record to set."""
    if not slo.pool or slo.pool != slo.pool.strip() or any(ord(c) < 32 for c in slo.pool):
        raise ValueError(f"invalid pool name {slo.pool!r}")
    for name, v in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
        if not (math.isfinite(v) and 0 < v <= MAX_TARGET_S):
            raise ValueError(f"{name} target must be > 0 and <= {MAX_TARGET_S:g} s, got {v:g}")


def targets(slo: records_pb2.PoolSlo | None) -> SloTargets | None:
    """The policy's view of a record; None for none (or a record that fails validation)."""
    if slo is None:
        return None
    try:
        return SloTargets(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s)
    except ValueError:
        return None


def slo_targets_ms(slos: Mapping[str, records_pb2.PoolSlo]) -> dict[str, tuple[float, float]]:
    """Pool -> (TTFT, TPOT) in ms, for the SLO feedback (FleetState.set_slo_targets)."""
    return {pool: (slo.ttft_s * 1000.0, slo.tpot_s * 1000.0) for pool, slo in slos.items()}


def decode_all(items: Mapping[str, KeyValue]) -> dict[str, records_pb2.PoolSlo]:
    out = {}
    for key, kv in items.items():
        try:
            slo = codec.decode(kv.value, records_pb2.PoolSlo)
        except codec.DecodeError:
            log.warning("slo_undecodable", key=key)
            continue
        pool = keys.leaf(keys.SLOS, key)
        if targets(slo) is None:
            log.warning("slo_invalid", pool=pool)
            continue
        slo.pool = pool  # the key is the truth
        out[pool] = slo
    return out


class PoolSlos:
    """Every pool's SLO record, from a WatchCache (decoded again only when the cache changes)."""

    def __init__(self, store: Store, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self.cache = WatchCache(store, keys.SLOS, on_change=self._changed)
        self._decoded: dict[str, records_pb2.PoolSlo] | None = {}

    def _changed(self, key: str, kv: KeyValue | None) -> None:
        self._decoded = None
        self._on_change()

    @property
    def synced(self) -> bool:
        return self.cache.synced.is_set()

    def all(self) -> Mapping[str, records_pb2.PoolSlo]:
        if self._decoded is None:
            self._decoded = decode_all(self.cache.items())
        return self._decoded

    async def run(self) -> None:
        await self.cache.run()


def replica_loads(entries: Sequence[records_pb2.RouteEntry], fleet: FleetState) -> list[ReplicaLoad]:
    out = []
    for e in entries:
        rec = fleet.get(e.replica_id)
        eng = rec.report.engine if rec is not None and rec.report is not None else None
        kv = 1.0 - e.kv_free_tokens / e.kv_capacity_tokens if e.kv_capacity_tokens > 0 else 0.0
        out.append(ReplicaLoad(
            e.replica_id, e.state in ROUTABLE_STATES and e.weight > 0,
            prefill_tokens_per_s=e.prefill_tokens_per_s, decode_step_base_ms=e.decode_step_base_ms,
            decode_step_per_seq_ms=e.decode_step_per_seq_ms,
            prompt_tokens_per_s=_finite(eng.prompt_tokens_per_s) if eng else 0.0,
            generation_tokens_per_s=_finite(eng.generation_tokens_per_s) if eng else 0.0,
            requests_per_s=_finite(eng.e2e.count / eng.window_s) if eng and eng.window_s > 0 else 0.0,
            running=e.running, waiting=e.waiting, kv_usage=min(1.0, max(0.0, kv))))
    return out


def _finite(v: float) -> float:
    return v if math.isfinite(v) and v > 0 else 0.0


class ScaleReporter:
    def __init__(self, store: Store, controlplane_id: str, *, registry: CollectorRegistry | None = None,
                 config: ScaleConfig | None = None, refresh_s: float = 30.0,
                 wall_clock: Callable[[], float] = time.time,
                 on_fenced: Callable[[str], None] = lambda reason: None) -> None:
        self._writer = FencedWriter(store, "scale", on_fenced)
        self._id = controlplane_id
        self._cfg = config or ScaleConfig()
        self._refresh_s = refresh_s
        self._wall = wall_clock
        self._latest: dict[str, records_pb2.ScaleRecommendation] = {}
        self._written: dict[str, tuple[tuple[object, ...], float]] = {}
        self._gauged: set[str] = set()
        self.gauge = Gauge("tidegate_pool_recommended_replicas",
                           "Replicas each pool needs to meet its SLO at the current demand (absent: no "
                           "recommendation; see tidegate/policy/scale.py).", ["pool"], registry=registry)

    def latest(self) -> Mapping[str, records_pb2.ScaleRecommendation]:
        return dict(self._latest)

    def reset(self) -> None:
        """On becoming leader: write every pool again."""
        self._written.clear()

    def compute(self, tables: Mapping[str, Sequence[records_pb2.RouteEntry]], fleet: FleetState,
                slos: Mapping[str, records_pb2.PoolSlo]) -> dict[str, records_pb2.ScaleRecommendation]:
        now = self._wall()
        out = {}
        for pool, entries in tables.items():
            r = recommend(replica_loads(entries, fleet), targets(slos.get(pool)), self._cfg)
            msg = records_pb2.ScaleRecommendation(
                pool=pool, recommended_replicas=r.replicas or 0, current_replicas=r.current, binding=r.binding,
                reason=r.reason, headroom=r.headroom, prompt_tokens_per_s=r.prompt_tokens_per_s,
                generation_tokens_per_s=r.generation_tokens_per_s, leader_id=self._id)
            msg.computed_at.CopyFrom(_timestamp(now))
            out[pool] = msg
        gauged = {pool for pool, msg in out.items() if msg.recommended_replicas}
        for pool in self._gauged - gauged:
            self.gauge.remove(pool)  # no figure is not the figure 0
        for pool in gauged:
            self.gauge.labels(pool=pool).set(out[pool].recommended_replicas)
        self._gauged = gauged
        self._latest = out
        return out

    async def publish(self, fence: Callable[[], Fence | None]) -> list[str]:
        """Writes, fenced by `fence()` (nothing while it is None), the pools whose figure changed
        (or whose record is due a refresh); returns their names. Never raises StoreError."""
        now = self._wall()
        due = []
        for pool, msg in sorted(self._latest.items()):
            key = (msg.recommended_replicas, msg.binding, msg.current_replicas)
            last = self._written.get(pool)
            if last is None or last[0] != key or now - last[1] >= self._refresh_s:
                due.append((pool, key, msg))
        landed = await self._writer.write([(keys.scale(pool), codec.encode(msg)) for pool, _, msg in due], fence)
        for (pool, key, _), ok in zip(due, landed, strict=True):
            if ok:
                self._written[pool] = (key, now)
        return [pool for (pool, _, _), ok in zip(due, landed, strict=True) if ok]
