"""agent.stream.backoff_delay (pure, injected rng) and the agent's config."""

from __future__ import annotations

import random

import pytest

from tidegate.agent.main import AgentConfig
from tidegate.agent.stream import backoff_delay
from tidegate.config import ConfigError, load


def test_backoff_ceiling_doubles_to_cap() -> None:
    ceilings = [backoff_delay(a, lambda: 1.0) for a in range(10)]
    assert ceilings == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0, 10.0])


def test_backoff_full_jitter_uses_rng() -> None:
    assert backoff_delay(3, lambda: 0.0) == 0.0
    assert backoff_delay(3, lambda: 0.5) == pytest.approx(0.8)
    rng = random.Random(7)
    delays = [backoff_delay(a, rng.random) for a in range(50)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert len(set(delays)) == 50  # jittered, not a fixed schedule


def test_backoff_huge_attempt_and_custom_bounds() -> None:
    assert backoff_delay(10_000, lambda: 1.0) == 10.0
    assert backoff_delay(0, lambda: 1.0, initial_s=1.0, max_s=3.0) == 1.0
    assert backoff_delay(5, lambda: 1.0, initial_s=1.0, max_s=3.0) == 3.0
    assert backoff_delay(-1, lambda: 1.0) == pytest.approx(0.2)


GOOD = {
    "engine_url": "http://127.0.0.1:8000/",
    "replica_id": "r1",
    "model": "llama-8b",
    "controlplane": "127.0.0.1:7000, 10.0.0.2:7000",
}


def test_config_parses_lists_and_defaults() -> None:
    cfg = load(AgentConfig, "agent", {**GOOD, "gpu_indices": "0,2"}, environ={})
    assert cfg.controlplane == ("127.0.0.1:7000", "10.0.0.2:7000")
    assert cfg.gpu_indices == (0, 2)
    assert cfg.engine_url == "http://127.0.0.1:8000"
    assert cfg.endpoint == "http://127.0.0.1:8000"  # advertise_url defaults to engine_url
    assert (cfg.region, cfg.zone, cfg.report_interval_s, cfg.metrics_port) == ("local", "local-a", 1.0, 0)


def test_config_env_and_advertise() -> None:
    env = {"TIDEGATE_AGENT_ADVERTISE_URL": "http://10.0.0.5:8000"}
    cfg = load(AgentConfig, "agent", GOOD, environ=env)
    assert cfg.endpoint == "http://10.0.0.5:8000"


@pytest.mark.parametrize("missing", ["engine_url", "replica_id", "model", "controlplane"])
def test_config_missing_required_names_field(missing: str) -> None:
    values = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ConfigError, match=f"agent.{missing}"):
        load(AgentConfig, "agent", values, environ={})


@pytest.mark.parametrize(
    ("field", "value"),
    [("controlplane", "nohostport"), ("engine_url", "127.0.0.1:8000"), ("gpu_indices", "0,x"),
     ("report_interval_s", "0")],
)
def test_config_bad_values_name_field(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"agent.{field}"):
        load(AgentConfig, "agent", {**GOOD, field: value}, environ={})
