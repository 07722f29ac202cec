"""Scale recommendation (tidegate.policy.scale): table tests of the pure function."""

from __future__ import annotations

import dataclasses

import pytest

from tidegate.policy.registry import SloTargets
from tidegate.policy.scale import ReplicaLoad, ScaleConfig, recommend

SLO = SloTargets(ttft_s=2.0, tpot_s=0.1)


def replica(i: int, *, p: float = 5000.0, g: float = 600.0, rps: float = 2.5, waiting: int = 0,
            kv: float = 0.3, serving: bool = True, rated: bool = True) -> ReplicaLoad:
    # llama3-8b-h100-like fitted rates: 20k prompt tok/s, step = 10 ms + 0.3 ms per sequence
    return ReplicaLoad(f"r{i}", serving, prefill_tokens_per_s=20_000.0 if rated else 0.0,
                       decode_step_base_ms=10.0 if rated else 0.0, decode_step_per_seq_ms=0.3 if rated else 0.0,
                       prompt_tokens_per_s=p, generation_tokens_per_s=g, requests_per_s=rps, waiting=waiting,
                       kv_usage=kv)


def pool(n: int, **kw: object) -> list[ReplicaLoad]:
    return [replica(i, **kw) for i in range(n)]  # type: ignore[arg-type]


# 4 replicas, 20k prompt tok/s, 2.4k gen tok/s: prefill 20000/20000/0.8 = 1.25, decode: batch <= 300,
# 3000 tok/s per replica, 2400/3000/0.8 = 1.0 -> 2.25 replicas -> 3.
CASES = [
    # id, replicas, slo, config, expected replicas (None = no recommendation), binding
    ("steady", pool(4), SLO, ScaleConfig(), 3, "prefill"),
    ("double-demand", pool(4, p=10_000.0, g=1200.0, rps=5.0), SLO, ScaleConfig(), 5, "prefill"),
    ("idle", pool(4, p=0.0, g=0.0, rps=0.0, kv=0.0), SLO, ScaleConfig(), 1, "floor"),
    ("idle-floor", pool(4, p=0.0, g=0.0, rps=0.0, kv=0.0), SLO, ScaleConfig(min_replicas=2), 2, "floor"),
    ("no-slo", pool(4), None, ScaleConfig(), None, "none"),
    ("unknown-rates", pool(4, rated=False), SLO, ScaleConfig(), None, "none"),
    ("no-serving-replica", pool(2, serving=False), SLO, ScaleConfig(), None, "none"),
    ("tpot-unmeetable", pool(2), SloTargets(ttft_s=2.0, tpot_s=0.01), ScaleConfig(), None, "none"),
    ("ttft-unmeetable", pool(2, p=50_000.0, rps=1.0), SloTargets(ttft_s=2.0, tpot_s=0.1), ScaleConfig(), None,
     "none"),
    ("kv-bound", pool(4, p=100.0, g=100.0, kv=0.95), SLO, ScaleConfig(), 5, "kv"),
    # 3 serving, 1.5 + 1.25 = 2.75 needed: within 10 % of 3, keep 3
    ("within-tolerance", pool(3, p=8000.0, g=1000.0, rps=4.0), SLO, ScaleConfig(), 3, "current"),
    ("decode-bound", pool(4, p=1000.0, g=6000.0, rps=1.0), SLO, ScaleConfig(), 11, "decode"),
    ("capped", pool(4, p=10_000.0, g=1200.0, rps=5.0), SLO, ScaleConfig(max_replicas=4), 4, "prefill"),
    # 40 waiting prompts of 2000 tokens must clear within 2 s: 80000 / 20000 / 2 / 0.8 = 2.5 more
    ("backlog", pool(4, waiting=10), SLO, ScaleConfig(), 5, "backlog"),
]


@pytest.mark.parametrize(("replicas", "slo", "cfg", "expected", "binding"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_recommend(replicas: list[ReplicaLoad], slo: SloTargets | None, cfg: ScaleConfig,
                   expected: int | None, binding: str) -> None:
    rec = recommend(replicas, slo, cfg)
    assert (rec.replicas, rec.binding) == (expected, binding), rec.reason
    assert rec.reason
    assert rec.current == sum(1 for r in replicas if r.serving)


@pytest.mark.parametrize("factor", [2.0, 3.0, 4.0])
def test_demand_times_k_needs_about_k_times_the_replicas(factor: float) -> None:
    base = recommend(pool(8, p=4000.0, g=900.0, rps=2.0, kv=0.0), SLO, ScaleConfig(tolerance=0.0))
    scaled = recommend(pool(8, p=4000.0 * factor, g=900.0 * factor, rps=2.0 * factor, kv=0.0), SLO,
                       ScaleConfig(tolerance=0.0))
    assert base.replicas is not None and scaled.replicas is not None
    assert base.replicas * factor - 1 <= scaled.replicas <= base.replicas * factor + 1


def test_more_demand_never_fewer_replicas() -> None:
    prev = 0
    for step in range(1, 30):
        rec = recommend(pool(4, p=1000.0 * step, g=150.0 * step, rps=0.5 * step, kv=0.0), SLO,
                        ScaleConfig(tolerance=0.0))
        assert rec.replicas is not None and rec.replicas >= prev
        prev = rec.replicas


def test_tighter_ttft_lowers_the_headroom() -> None:
    loose = recommend(pool(4, p=20_000.0, rps=1.0), SloTargets(ttft_s=10.0, tpot_s=0.1))
    tight = recommend(pool(4, p=20_000.0, rps=1.0), SloTargets(ttft_s=1.5, tpot_s=0.1))
    assert tight.headroom < loose.headroom == 0.8
    assert tight.replicas is not None and loose.replicas is not None and tight.replicas > loose.replicas


def test_unrated_replicas_do_not_dilute_the_rates() -> None:
    rated = pool(4)
    mixed = rated + [dataclasses.replace(replica(9, p=0.0, g=0.0, rps=0.0, kv=0.0), prefill_tokens_per_s=0.0)]
    assert recommend(mixed, SLO).reason.split(": ")[-1] == recommend(rated, SLO).reason.split(": ")[-1]


@pytest.mark.parametrize("kw", [{"headroom": 0.0}, {"kv_target": 1.5}, {"min_replicas": 0}, {"tolerance": 1.0}])
def test_config_is_validated(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScaleConfig(**kw)  # type: ignore[arg-type]
