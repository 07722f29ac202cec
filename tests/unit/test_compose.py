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
