"""`tidegate up` passes the router's priority and admission flags through (what e2e fleets use)."""

from __future__ import annotations

from pathlib import Path

from tidegate.fleet.up import Fleet, UpConfig


def test_router_flags_pass_through(tmp_path: Path) -> None:
    plain = Fleet(UpConfig(run_dir=tmp_path / "a"))._router_flags()
    assert not {"--trust-priority-header", "--admission", "--admission-queue"} & set(plain)
    cfg = UpConfig(run_dir=tmp_path / "b", trust_priority_header=True, admission=True,
                   admission_queue="critical=4,sheddable=0", admission_max_wait="2s")
    flags = Fleet(cfg)._router_flags()
    assert flags[-6:] == ["--trust-priority-header", "--admission", "--admission-queue", "critical=4,sheddable=0",
                          "--admission-max-wait", "2s"]
