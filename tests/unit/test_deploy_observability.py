"""The Grafana dashboard and the Prometheus rules name only metrics the processes really export.

The exported names come from the processes' own registries, built here the way each composition
root builds them (router, control plane, agent) plus the engine simulator's vLLM and SGLang
expositions, which reproduce the engines' names: nothing is listed by hand. `promtool` (Debian's
`prometheus` package; scripts/test.sh installs it) checks the rules' syntax and runs their unit
tests (deploy/prometheus/alerts_test.yml).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from module_file import load_module  # type: ignore[import-not-found]
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "tidegate.json"
# Series Prometheus makes itself for every target, not exported by any process.
PROMETHEUS_SERIES = frozenset({"up"})
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "summary": ("", "_count", "_sum", "_created"), "info": ("_info",), "unknown": ("",),
             "stateset": ("",), "gaugehistogram": ("_bucket", "_gcount", "_gsum")}


def _registries() -> Iterator[tuple[str, CollectorRegistry]]:
    import random
    import time

    from tidegate.agent.metrics import AgentMetrics
    from tidegate.controlplane.metrics import Metrics
    from tidegate.controlplane.slo import ScaleReporter
    from tidegate.router.admission import AdmissionMetrics
    from tidegate.router.inflight import InflightCounter
    from tidegate.router.metrics import RouterMetrics
    from tidegate.router.tables import RoutingTables
    from tidegate.simulator.engine import Engine
    from tidegate.simulator.metrics import FLAVORS, SimMetrics
    from tidegate.simulator.profiles import get_profile
    from tidegate.store.memory import InMemoryStore

    router = RouterMetrics(RoutingTables(), InflightCounter(), wall=time.time)
    AdmissionMetrics(router.registry)  # router/main.py adds these to the router's registry
    yield "router", router.registry
    cp = Metrics()
    ScaleReporter(InMemoryStore(), "cp", registry=cp.registry)  # controlplane/main.py does the same
    yield "controlplane", cp.registry
    yield "agent", AgentMetrics().registry
    for flavor in FLAVORS:
        engine = Engine(get_profile("tiny-h100"), random.Random(0))
        yield f"engine ({flavor})", SimMetrics(engine, "m", flavor).registry


def _exports() -> tuple[dict[str, str], dict[str, set[str]]]:
    """(series name -> process, series name -> label names where the registry knows them)."""
    names: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for process, registry in _registries():
        declared: dict[str, set[str]] = {}
        # Labels of a metric without children yet: only its collector knows them.
        for collector, series in registry._collector_to_names.items():
            if hasattr(collector, "_labelnames"):
                declared.update({n: set(collector._labelnames) for n in series})
        for family in registry.collect():
            for suffix in _SUFFIXES[family.type]:
                names[family.name + suffix] = process
                if family.name + suffix in declared:
                    labels[family.name + suffix] = declared[family.name + suffix] | (
                        {"le"} if suffix == "_bucket" else set())
            for sample in family.samples:
                names[sample.name] = process
                labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


def exported_names() -> dict[str, str]:
    """Every series name a process exposes -> the process."""
    return _exports()[0]


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan", "Inf", "NaN"})


# Labels Prometheus (and the Prometheus Operator) put on every scraped series.
TARGET_LABELS = frozenset({"instance", "job", "pod", "namespace", "service", "endpoint", "container"})
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\{([^{}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^()]*)\)\s*\(")


def label_errors(expr: str, labels: dict[str, set[str]]) -> list[str]:
    """Labels a selector matches on or an aggregation groups by that its metrics do not carry."""
    errors = []
    text = _STRINGS.sub('""', expr)
    for name, body in _SELECTOR.findall(text):
        for label in _MATCHER.findall(body):
            if name in labels and label not in labels[name] | TARGET_LABELS:
                errors.append(f"{name} has no label {label}")
    for m in _BY.finditer(text):
        depth, end = 1, m.end()
        while depth and end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        inner = metric_names(text[m.end():end - 1])
        if not inner or not inner <= labels.keys():
            continue  # recorded series or the like: their labels are not in a registry
        have = set().union(*(labels[n] for n in inner)) | TARGET_LABELS
        errors.extend(f"{sorted(inner)} have no label {label}" for label in
                      (x.strip() for x in m.group(1).split(",")) if label and label not in have)
    return errors


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, labels, keywords and numbers excluded)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub(" ", text)
    return {m for m in _IDENT.findall(text) if m not in _KEYWORDS}


def _rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def _unknown(exprs: list[tuple[str, str]], known: set[str]) -> list[str]:
    return [f"{where}: {name}" for where, expr in exprs for name in sorted(metric_names(expr) - known)]


def _known() -> set[str]:
    recorded = {str(r["record"]) for r in _rules() if "record" in r}
    return set(exported_names()) | recorded | PROMETHEUS_SERIES


@pytest.mark.parametrize(("expr", "expected"), [
    ('sum by (le, model) (rate(tidegate_router_ttft_seconds_bucket{model=~"$model",le="2.5"}[$__rate_interval]))',
     {"tidegate_router_ttft_seconds_bucket"}),
    ("(tidegate_cp_replicas - tidegate_cp_streams_open) > 0 and tidegate_cp_leader == 1",
     {"tidegate_cp_replicas", "tidegate_cp_streams_open", "tidegate_cp_leader"}),
    ("histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[5m]))) > 1e3",
     {"vllm:inter_token_latency_seconds_bucket"}),
    ("tidegate:ttft_slo_errors:ratio_rate1h > (14.4 * 0.05)", {"tidegate:ttft_slo_errors:ratio_rate1h"}),
    ('absent(up{endpoint="agent-metrics"}) or sum without (pod) (x_total offset 5m)', {"up", "x_total"}),
], ids=["matchers-and-grouping", "binary-ops", "colon-names-and-numbers", "recorded", "keywords"])
def test_metric_names_are_read_from_promql(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_exported_names_come_from_the_registries() -> None:
    names = exported_names()
    # one per process kind, to show each registry was enumerated
    for name in ("tidegate_router_requests_total", "tidegate_router_admission_rejected_total",
                 "tidegate_router_table_suspect", "tidegate_cp_leader", "tidegate_pool_recommended_replicas",
                 "tidegate_agent_stream_up", "vllm:kv_cache_usage_perc", "sglang:token_usage",
                 "tidegate_cp_tick_seconds_bucket"):
        assert name in names


def test_every_dashboard_query_names_an_exported_metric() -> None:
    exprs = _dashboard_exprs()
    assert len(exprs) > 30
    assert _unknown(exprs, _known()) == []


def test_engine_metrics_are_real_engines_names() -> None:
    """The simulator reproduces the engines' names; every dashboard query of engine series must also
    find a series on the real engines' pages (tests/fixtures/metrics, each with its source)."""
    from prometheus_client.parser import text_string_to_metric_families

    real: set[str] = set()
    for page in (ROOT / "tests" / "fixtures" / "metrics").glob("*.txt"):
        for family in text_string_to_metric_families(page.read_text()):
            real.update(s.name for s in family.samples)
    engine_exprs = [(where, names) for where, e in _dashboard_exprs()
                    if (names := {n for n in metric_names(e) if n.startswith(("vllm:", "sglang:"))})]
    assert engine_exprs, "the dashboard shows no engine series"
    # A query may prefer a newer engine's name (`new or old`); one of its names must be on a real page.
    assert [f"{where}: {sorted(names)}" for where, names in engine_exprs if not names & real] == []


def test_every_rule_names_an_exported_metric() -> None:
    exprs = [(str(r.get("alert") or r.get("record")), str(r["expr"])) for r in _rules()]
    assert _unknown(exprs, _known()) == []


def test_every_query_uses_labels_its_metrics_carry() -> None:
    labels = _exports()[1]
    exprs = _dashboard_exprs() + [(str(r.get("alert") or r.get("record")), str(r["expr"])) for r in _rules()]
    assert [f"{where}: {e}" for where, expr in exprs for e in label_errors(expr, labels)] == []


def test_a_wrong_label_is_caught() -> None:
    labels = _exports()[1]
    assert label_errors('sum by (pool) (rate(tidegate_router_requests_total{modle="x"}[5m]))', labels) == [
        "tidegate_router_requests_total has no label modle", "['tidegate_router_requests_total'] have no label pool"]
    assert label_errors("histogram_quantile(0.9, sum by (le, model) (rate(tidegate_router_ttft_seconds_bucket[1m])))",
                        labels) == []


def test_a_made_up_metric_is_caught() -> None:
    exprs = [("p", 'sum(rate(tidegate_router_requests_totl{status="500"}[5m]))'), ("q", "tidegate_cp_leader")]
    assert _unknown(exprs, _known()) == ["p: tidegate_router_requests_totl"]


def test_the_alerts_the_fleet_needs_exist() -> None:
    alerts = {str(r["alert"]): r for r in _rules() if "alert" in r}
    for name in ("TidegateTTFTBudgetBurnFast", "TidegateTTFTBudgetBurnSlow", "TidegateStaleReplicas",
                 "TidegateNoLeader", "TidegateRouterEtcdUnreachable", "TidegateControlPlaneEtcdErrors",
                 "TidegateRouterTableSuspect", "TidegateHighRejectionRate"):
        assert name in alerts
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"page", "ticket", "warning"}, name  # type: ignore[index]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name  # type: ignore[index]


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "model", "ttft_slo"}
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def _load(path: Path) -> Any:
    return load_module(path)


def test_dashboard_json_is_generated() -> None:
    module = _load(DASHBOARD.parent / "make_dashboard.py")
    assert DASHBOARD.read_text() == module.render(), \
        "deploy/grafana/tidegate.json is stale: python deploy/grafana/make_dashboard.py"


def test_prometheusrule_is_alerts_yml() -> None:
    module = _load(ALERTS.parent / "make_prometheusrule.py")
    assert module.TARGET.read_text() == module.render(), \
        "deploy/kubernetes/base/prometheusrule.yaml is stale: python deploy/prometheus/make_prometheusrule.py"
    assert yaml.safe_load(module.TARGET.read_text())["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; scripts/test.sh installs it as root)")
    return path


def test_promtool_checks_the_rules() -> None:
    run = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, as a recording rule: promtool parses them all."""
    grafana_vars = {"$__rate_interval": "5m", "$model": ".*", "$ttft_slo": "2.5"}
    rules = []
    for i, (_, expr) in enumerate(_dashboard_exprs()):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_rule_unit_tests() -> None:
    run = subprocess.run([_promtool(), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True,
                         timeout=120, cwd=ALERT_TESTS.parent)
    assert run.returncode == 0, run.stdout + run.stderr
