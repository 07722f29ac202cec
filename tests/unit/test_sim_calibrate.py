"""`tidegate sim calibrate`: the packaged reference points, the table, the exit codes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tidegate.simulator import calibrate
from tidegate.simulator.profiles import get_profile

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidegate.cli.main", "sim", "calibrate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_every_profile_passes():
    proc = run_cli("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    by_profile: dict[str, int] = {}
    for p in doc["points"]:
        by_profile[p["profile"]] = by_profile.get(p["profile"], 0) + 1
        assert abs(p["rel_error"]) <= p["tolerance"]
    # 10 decode points + 1 prefill per 8B profile; 19 splitwise points x (prompt, token)
    assert by_profile == {"llama3-8b-h100": 11, "llama3-8b-h200": 11, "llama3-70b-tp4-h100": 38}


def test_cli_table_for_one_profile():
    proc = run_cli("--profile", "llama3-8b-h100")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["profile", "point"]
    assert any("decode b=256 ctx=4096" in line and "71.09" in line for line in lines)
    assert lines[-1] == "11 points, 0 outside tolerance"


def test_cli_profile_without_reference_data_is_an_error():
    proc = run_cli("--profile", "tiny-h100")
    assert proc.returncode == 2
    assert "no reference data" in proc.stderr and "llama3-8b-h100" in proc.stderr


def test_off_profile_fails_and_exits_non_zero(monkeypatch, capsys):
    slow = get_profile("llama3-8b-h100")
    slow = dataclasses.replace(slow, cost=slow.cost.scaled(1.2))
    points = calibrate.REFERENCES["llama3-8b-h100"](slow)
    assert points and not any(p.ok for p in points)
    monkeypatch.setitem(calibrate.REFERENCES, "llama3-8b-h100", lambda _: points)
    assert calibrate.run_cli("llama3-8b-h100", False) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(("batch", "prompt"), [(1, 1024), (16, 512)])
def test_engine_batch_prompt_time_counts_the_whole_batch(batch, prompt):
    profile = get_profile("llama3-70b-tp4-h100")
    prompt_ms, token_ms = calibrate.engine_batch_times(profile, prompt, batch, 10)
    tokens = batch * prompt  # at most one 8192-token step here
    assert prompt_ms == pytest.approx(profile.cost.step_ms(tokens, tokens))
    assert token_ms > profile.cost.decode_step_ms(batch, prompt)


def test_splitwise_means_and_decode_steps():
    pts = {(p, b, t): (s, pm, tm) for p, b, t, s, pm, tm in calibrate.splitwise_points()}
    assert len(pts) == 19
    steps, prompt_ms, token_ms = pts[(512, 64, 128)]
    assert steps == 127 and prompt_ms == pytest.approx(3532.3, abs=0.1) and token_ms == pytest.approx(52.0, abs=0.1)
    assert pts[(512, 1, 8192)][0] < 1000  # the measured run stopped early (see calibration/README.md)
