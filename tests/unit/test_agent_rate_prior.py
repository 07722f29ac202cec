"""The agent's optional rate prior: config flag -> Hello fields the control plane seeds its fit with."""

from __future__ import annotations

import pytest

from tidegate.agent.main import AgentConfig
from tidegate.agent.stream import HelloInfo
from tidegate.config import ConfigError, load
from tidegate.controlplane.fleet import FleetState
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.v1 import telemetry_pb2

GOOD = {"engine_url": "http://127.0.0.1:8000", "replica_id": "r1", "model": "m", "controlplane": "127.0.0.1:7000"}


def test_no_prior_by_default() -> None:
    cfg = load(AgentConfig, "agent", GOOD, environ={})
    assert cfg.rate_prior == ()
    hello = HelloInfo("r1", "m", "http://x", rate_prior=cfg.rate_prior).message(1.0).hello
    assert (hello.prior_prefill_tokens_per_s, hello.prior_decode_step_base_ms,
            hello.prior_decode_step_per_seq_ms) == (0, 0, 0)


def test_prior_reaches_the_hello_and_seeds_the_control_plane() -> None:
    cfg = load(AgentConfig, "agent", {**GOOD, "rate_prior": "40000,8,0.08"}, environ={})
    assert cfg.rate_prior == (40000.0, 8.0, 0.08)
    hello = HelloInfo("r1", "m", "http://x", rate_prior=cfg.rate_prior).message(1.0).hello
    assert (hello.prior_prefill_tokens_per_s, hello.prior_decode_step_base_ms,
            hello.prior_decode_step_per_seq_ms) == (40000.0, 8.0, 0.08)
    fs = FleetState(WeightPolicyConfig(), now=lambda: 0.0)
    fs.on_hello(hello)
    fs.on_report(hello, telemetry_pb2.Report(seq=1, engine=telemetry_pb2.EngineStats(healthy=True)))
    assert fs.view("r1").prefill_tokens_per_s == pytest.approx(40000.0, rel=0.03)


@pytest.mark.parametrize("value", ["40000,8", "40000,0,0.08", "40000,-8,0.08", "40000,nan,0.08", "a,b,c"])
def test_bad_prior_names_the_field(value: str) -> None:
    with pytest.raises(ConfigError, match="agent.rate_prior"):
        load(AgentConfig, "agent", {**GOOD, "rate_prior": value}, environ={})
