"""`tidegate up` passes the router's priority and admission flags through (what e2e fleets use), and
tells each agent its simulated engine's seats."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.fleet.up import Fleet, UpConfig
from tidegate.simulator.profiles import get_profile


def test_router_flags_pass_through(tmp_path: Path) -> None:
    plain = Fleet(UpConfig(run_dir=tmp_path / "a"))._router_flags()
    assert not {"--trust-priority-header", "--admission", "--admission-queue"} & set(plain)
    cfg = UpConfig(run_dir=tmp_path / "b", trust_priority_header=True, admission=True,
                   admission_queue="critical=4,sheddable=0", admission_max_wait="2s")
    flags = Fleet(cfg)._router_flags()
    assert flags[-6:] == ["--trust-priority-header", "--admission", "--admission-queue", "critical=4,sheddable=0",
                          "--admission-max-wait", "2s"]


@pytest.mark.parametrize("profile", ["tiny-h100", "llama3-8b-h100"])
def test_agents_get_the_profiles_seats(tmp_path: Path, profile: str) -> None:
    flags = Fleet(UpConfig(run_dir=tmp_path, profile=profile))._agent_flags()
    assert flags == ["--engine-max-num-seqs", str(get_profile(profile).max_num_seqs)]


def test_unknown_profile_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown profile 'h9000'.*tiny-h100"):
        UpConfig(run_dir=tmp_path, profile="h9000")
