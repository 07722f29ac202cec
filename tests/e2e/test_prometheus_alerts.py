"""A real Prometheus server scrapes a `tidegate up --metrics` fleet and evaluates deploy/prometheus/alerts.yml.

Prometheus (Debian's `prometheus` package; scripts/test.sh installs it as root) listens on
127.0.0.1 with a 1 s scrape and evaluation interval. The fleet is healthy first: every target
is up, one control plane leads, no Tidegate alert fires. Then one agent is killed with SIGKILL:
its replica stays known to the leader without a telemetry stream, and TidegateStaleReplicas
must fire before the control plane forgets the replica (--remove-after-s, 30 s).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.fleet.up import Fleet, UpConfig, free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, Any]]]:
    cfg = UpConfig(replicas=2, controlplanes=1, profile="instant", run_dir=tmp_path / "fleet",
                   report_interval_s=0.5, ready_timeout_s=60, metrics=True)
    fl = Fleet(cfg)
    try:
        yield fl, fl.start()
    finally:
        fl.stop()


def _prometheus_config(metrics: dict[str, str], rules: Path) -> dict[str, Any]:
    def job(name: str, prefix: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        targets = [addr for proc, addr in sorted(metrics.items()) if proc.startswith(prefix)]
        return {"job_name": name, "static_configs": [{"targets": targets, "labels": labels or {}}]}

    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(rules)],
        # `endpoint` is the label the Prometheus Operator sets from the Service port name.
        "scrape_configs": [job("tidegate-controlplane", "controlplane"), job("tidegate-router", "router"),
                           job("tidegate-agent", "agent", {"endpoint": "agent-metrics"})],
    }


class Prometheus:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        assert PROMETHEUS is not None
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (workdir / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--storage.tsdb.retention.time=1h"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.log_path = workdir / "prometheus.log"

    def get(self, path: str, **params: str) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read())

    def ready(self) -> bool:
        assert self._proc.poll() is None, self.log_path.read_text()[-2000:]
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["data"]["result"])

    def firing(self) -> set[str]:
        return {name for name, state in self.active() if state == "firing"}

    def active(self) -> set[tuple[str, str]]:
        """(alert name, pending or firing) of every active alert."""
        return {(a["labels"]["alertname"], a["state"]) for a in self.get("/api/v1/alerts")["data"]["alerts"]}

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package `prometheus`; "
                                               "scripts/test.sh installs it when run as root)")
def test_stale_replica_alert_fires_after_an_agent_is_killed(fleet: tuple[Fleet, dict[str, Any]],
                                                            tmp_path: Path) -> None:
    fl, info = fleet
    metrics = info["metrics"]
    assert sorted(metrics) == ["agent-0", "agent-1", "controlplane-0", "router"]
    prom = Prometheus(tmp_path / "prometheus", _prometheus_config(metrics, ALERTS))
    try:
        wait_until(prom.ready, 30, "Prometheus ready")
        assert prom.get("/api/v1/rules")["data"]["groups"], "alerts.yml was not loaded"
        wait_until(lambda: len(prom.query("up == 1")) == 4, 30, "all four targets scraped")
        wait_until(lambda: prom.query("sum(tidegate_cp_leader)") != []
                   and float(prom.query("sum(tidegate_cp_leader)")[0]["value"][1]) == 1, 30, "one leader")
        wait_until(lambda: prom.query("tidegate_cp_streams_open") != []
                   and float(prom.query("tidegate_cp_streams_open")[0]["value"][1]) == 2, 30, "two agent streams")
        time.sleep(3)  # a few evaluations of every rule on the healthy fleet: nothing even pending
        assert prom.active() == set()

        agent = next(c for c in fl.children if c.name == "agent-1")
        agent.signal(signal.SIGKILL)
        killed = time.monotonic()
        # `for: 10s` after the stream closes; the replica is forgotten 30 s after its last report.
        wait_until(lambda: "TidegateStaleReplicas" in prom.firing(), 28, "TidegateStaleReplicas firing")
        fired_after = time.monotonic() - killed
        print(f"TidegateStaleReplicas fired {fired_after:.1f}s after the agent was killed")
        assert "TidegateNoLeader" not in prom.firing()
        wait_until(lambda: prom.query('up{job="tidegate-agent"} == 0') != [], 10, "the dead agent's target down")
    finally:
        prom.stop()
