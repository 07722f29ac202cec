"""Where the agent's telemetry token comes from (agent.main.load_token): file, then environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.agent.main import TOKEN_ENV, AgentConfig, load_token
from tidegate.config import ConfigError, load

BASE = {"engine_url": "http://127.0.0.1:8000", "replica_id": "r1", "model": "m", "controlplane": "h:1"}


def cfg(**extra: str) -> AgentConfig:
    return load(AgentConfig, "agent", {**BASE, **extra}, environ={})


def test_file_wins_over_environment(tmp_path: Path) -> None:
    f = tmp_path / "agent.token"
    f.write_text("from-file\n")
    assert load_token(cfg(telemetry_token_file=str(f)), {TOKEN_ENV: "from-env"}) == "from-file"


def test_environment_then_none() -> None:
    assert load_token(cfg(), {TOKEN_ENV: " from-env "}) == "from-env"
    assert load_token(cfg(), {TOKEN_ENV: ""}) is None
    assert load_token(cfg(), {}) is None


@pytest.mark.parametrize(("content", "error"), [
    pytest.param(None, "cannot read", id="missing"),
    pytest.param("", "must hold one token", id="empty"),
    pytest.param("two words\n", "must hold one token", id="spaces"),
])
def test_bad_token_file(tmp_path: Path, content: str | None, error: str) -> None:
    f = tmp_path / "agent.token"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ConfigError, match=error) as err:
        load_token(cfg(telemetry_token_file=str(f)), {})
    assert "words" not in str(err.value)  # the file's content is never quoted
