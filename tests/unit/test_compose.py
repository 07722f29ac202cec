"""Every command in docker-compose.yml is a valid `tidegate` invocation whose config loads."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from tidegate.cli.main import COMMANDS, build_parser
from tidegate.config import load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
TIDEGATE_SERVICES = {
    name: svc for name, svc in COMPOSE["services"].items() if svc.get("image", "").startswith("tidegate")
}


def test_compose_describes_the_fleet() -> None:
    kinds = sorted(svc["command"][0] for svc in TIDEGATE_SERVICES.values())
    assert kinds.count("controlplane") == 2
    assert kinds.count("router") >= 1
    assert kinds.count("sim") == kinds.count("agent") >= 1
    assert "etcd" in COMPOSE["services"]


@pytest.mark.parametrize("service", sorted(TIDEGATE_SERVICES))
def test_command_is_valid(service: str) -> None:
    argv = TIDEGATE_SERVICES[service]["command"]
    assert argv[0] in COMMANDS
    args = build_parser().parse_args(argv)  # exits (SystemExit) on an unknown flag
    module = importlib.import_module(COMMANDS[argv[0]][0])
    cfg = load(module.CONFIG_CLASS, argv[0], args, None, environ={})
    assert cfg is not None


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_each_agent_reports_its_engines_seats() -> None:
    """vLLM does not export max_num_seqs, so the agent is told: the same figure as the engine it
    watches runs with (its profile's), or the pick's seat wait and the budget's seat bound are off."""
    from tidegate.simulator.profiles import get_profile

    sims = {name: svc["command"] for name, svc in TIDEGATE_SERVICES.items() if svc["command"][0] == "sim"}
    agents = [svc["command"] for svc in TIDEGATE_SERVICES.values() if svc["command"][0] == "agent"]
    assert agents
    for argv in agents:
        engine = _flag(argv, "--engine-url")
        assert engine is not None
        sim = sims[engine.split("//")[1].split(":")[0]]
        assert _flag(argv, "--engine-max-num-seqs") == str(get_profile(_flag(sim, "--profile") or "").max_num_seqs)
