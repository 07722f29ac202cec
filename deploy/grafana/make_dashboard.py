"""Write deploy/grafana/tidegate.json, the Tidegate Grafana dashboard (this file is its source;
tests/unit/test_deploy_observability.py fails when the JSON is stale and checks every query).

    python deploy/grafana/make_dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGET = Path(__file__).resolve().parent / "tidegate.json"
RI = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


class Layout:
    """Places panels left to right in rows of 24 grid units, numbering them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = self._y = self._row_h = 0

    def row(self, title: str) -> None:
        self.endrow()
        self.panels.append({"type": "row", "title": title, "id": len(self.panels) + 1, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y}, "panels": []})
        self._y += 1

    def endrow(self) -> None:
        self._y += self._row_h
        self._x = self._row_h = 0

    def panel(self, title: str, targets: list[tuple[str, str]], *, kind: str = "timeseries", unit: str = "short",
              w: int = 8, h: int = 8, desc: str = "", extra: dict[str, Any] | None = None) -> None:
        if self._x + w > 24:
            self.endrow()
        options: dict[str, Any] = (
            {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
             "tooltip": {"mode": "multi", "sort": "desc"}} if kind == "timeseries" else
            {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
             "colorMode": "value", "graphMode": "area", "textMode": "auto"})
        self.panels.append({
            "type": kind, "title": title, "id": len(self.panels) + 1, "description": desc, "datasource": DATASOURCE,
            "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y},
            "fieldConfig": {"defaults": {"unit": unit, **(extra or {})}, "overrides": []},
            "options": options,
            "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
                        for i, (expr, legend) in enumerate(targets)]})
        self._x += w
        self._row_h = max(self._row_h, h)


def quantile(q: str, histogram: str, by: str, selector: str = "") -> str:
    """The q-quantile of a histogram's rate, summed by `by` (which must include le)."""
    return f"histogram_quantile({q}, sum by ({by}) (rate({histogram}_bucket{{{selector}}}[{RI}])))"


def build() -> dict[str, Any]:
    d = Layout()
    M = 'model=~"$model"'

    d.row("Fleet")
    d.panel("Leader (1 = leads)", [("tidegate_cp_leader", "{{pod}}{{instance}}")], kind="stat", w=4, h=5,
          desc="tidegate_cp_leader of every control-plane instance: exactly one should be 1.")
    d.panel("Replicas known to the leader", [("sum(tidegate_cp_replicas and tidegate_cp_leader == 1)", "replicas")],
          kind="stat", w=4, h=5)
    d.panel("Agent streams open", [("sum(tidegate_cp_streams_open)", "streams")], kind="stat", w=4, h=5,
          desc="Replicas known minus streams open = replicas that stopped reporting (stale).")
    d.panel("Routers synced", [("sum(tidegate_router_tables_synced)", "synced"),
                             ("count(tidegate_router_tables_synced)", "routers")], kind="stat", w=4, h=5)
    d.panel("Requests/s", [(f"sum(rate(tidegate_router_requests_total[{RI}]))", "req/s")], kind="stat", w=4, h=5,
          unit="reqps")
    d.panel("TTFT SLO attainment", [(f'sum(rate(tidegate_router_ttft_seconds_bucket{{le="$ttft_slo"}}[{RI}])) / '
                                   f"sum(rate(tidegate_router_ttft_seconds_count[{RI}]))", "attainment")],
          kind="stat", w=4, h=5, unit="percentunit",
          desc="Share of streamed requests whose first token left the router within $ttft_slo s.")
    d.endrow()
    d.panel("Stale replicas (known, not reporting)",
          [("(tidegate_cp_replicas - tidegate_cp_streams_open) and tidegate_cp_leader == 1", "stale")], w=8)
    d.panel("Recommended replicas per pool", [("max by (pool) (tidegate_pool_recommended_replicas)", "{{pool}}")], w=8,
          desc="Replicas each pool needs to meet its SLO at the current demand (control-plane scale recommendation).")
    d.panel("Telemetry streams refused/s",
            [(f"sum by (code) (rate(tidegate_cp_streams_refused_total[{RI}]))", "{{code}}")],
          w=8, unit="ops")
    d.endrow()

    d.row("SLOs")
    d.panel("Router TTFT percentiles", [
        (f"histogram_quantile({q}, sum by (le, model) (rate(tidegate_router_ttft_seconds_bucket{{{M}}}[{RI}])))",
         f"P{int(float(q) * 100)} {{{{model}}}}") for q in ("0.5", "0.95", "0.99")], unit="s",
          desc="Arrival at the router to the first body chunk sent (streamed requests), from the router's histogram.")
    ITL = (f"rate(vllm:inter_token_latency_seconds_bucket{{model_name=~\"$model\"}}[{RI}]) or "
           f"rate(vllm:time_per_output_token_seconds_bucket{{model_name=~\"$model\"}}[{RI}])")
    d.panel("TPOT (inter-token latency) percentiles, engines", [
        (f"histogram_quantile({q}, sum by (le, model_name) ({ITL}))",
         f"P{int(float(q) * 100)} {{{{model_name}}}}") for q in ("0.5", "0.95", "0.99")], unit="s",
          desc="From the engines' own histograms: vllm:inter_token_latency_seconds (recent vLLM), else "
               "vllm:time_per_output_token_seconds (older releases). The router does not measure TPOT.")
    d.panel("Engine TTFT P95 vs router TTFT P95", [
        (quantile("0.95", "vllm:time_to_first_token_seconds", "le, model_name", 'model_name=~"$model"'),
         "engine {{model_name}}"),
        (f"histogram_quantile(0.95, sum by (le, model) (rate(tidegate_router_ttft_seconds_bucket{{{M}}}[{RI}])))",
         "router {{model}}")], unit="s",
          desc="The gap is time held in admission queues, the proxy and the network.")
    d.endrow()
    d.panel("TTFT SLO attainment by model", [
        (f'sum by (model) (rate(tidegate_router_ttft_seconds_bucket{{{M},le="$ttft_slo"}}[{RI}])) / '
         f"sum by (model) (rate(tidegate_router_ttft_seconds_count{{{M}}}[{RI}]))", "{{model}}")],
          unit="percentunit", extra={"min": 0, "max": 1})
    d.panel("TTFT SLO attainment by priority class", [
        (f'sum by (priority) (rate(tidegate_router_class_ttft_seconds_bucket{{{M},le="$ttft_slo"}}[{RI}])) / '
         f"sum by (priority) (rate(tidegate_router_class_ttft_seconds_count{{{M}}}[{RI}]))", "{{priority}}")],
          unit="percentunit", extra={"min": 0, "max": 1})
    d.panel("TTFT P95 by priority class", [
        (quantile("0.95", "tidegate_router_class_ttft_seconds", "le, priority", M),
         "{{priority}}")], unit="s")
    d.endrow()
    d.panel("TTFT error-budget burn rate (1 = on budget)", [
        (f"tidegate:ttft_slo_errors:ratio_rate{w} / 0.05", f"{w} {{{{model}}}}") for w in ("5m", "1h", "6h", "3d")],
          w=12, desc="From deploy/prometheus/alerts.yml recording rules: 95% within 2.5 s.")
    d.panel("Availability (non-5xx) error-budget burn rate", [
        (f"tidegate:availability_errors:ratio_rate{w} / 0.001", f"{w} {{{{model}}}}")
        for w in ("5m", "1h", "6h", "3d")],
          w=12, desc="From deploy/prometheus/alerts.yml recording rules: 99.9% answered without a 5xx.")
    d.endrow()

    d.row("Admission")
    d.panel("Rejections/s by reason", [
        (f"sum by (reason) (rate(tidegate_router_admission_rejected_total{{{M}}}[{RI}]))", "{{reason}}")], unit="reqps",
          w=6)
    d.panel("Rejections/s by priority class", [
        (f"sum by (priority) (rate(tidegate_router_admission_rejected_total{{{M}}}[{RI}]))", "{{priority}}")],
          unit="reqps", w=6)
    d.panel("Held in queue now, by class", [
        (f"sum by (priority) (tidegate_router_admission_queued{{{M}}})", "{{priority}}")], w=6)
    d.panel("Queue wait P95 by class and outcome", [
        (quantile("0.95", "tidegate_router_admission_queue_wait_seconds", "le, priority, outcome", M),
         "{{priority}} {{outcome}}")], unit="s", w=6)
    # The two measured margins admission plans with (docs/OPERATIONS.md): steady values are normal,
    # a TTFT margin near the TTFT target or a TPOT margin pinned at 2 are not.
    d.panel("TTFT margin per router (added to every predicted TTFT)", [
        (f"tidegate_router_admission_ttft_margin_seconds{{{M}}}", "{{model}} {{pod}}{{instance}}")], unit="s", w=12)
    d.panel("TPOT plan margin per router (target divided by it)", [
        (f"tidegate_router_tpot_plan_margin{{{M}}}", "{{model}} {{pod}}{{instance}}")], w=12)
    d.endrow()

    d.row("Routers")
    d.panel("Requests/s by status", [
        (f"sum by (status) (rate(tidegate_router_requests_total{{{M}}}[{RI}]))", "{{status}}")], unit="reqps")
    d.panel("Requests/s by class and status", [
        (f"sum by (priority, status) (rate(tidegate_router_class_requests_total{{{M}}}[{RI}]))",
         "{{priority}} {{status}}")], unit="reqps")
    d.panel("In flight per router", [("tidegate_router_inflight_requests", "{{pod}}{{instance}}")])
    d.endrow()
    d.panel("Upstream latency and whole-request P95", [
        (quantile("0.95", "tidegate_router_upstream_latency_seconds", "le, model", M),
         "to headers {{model}}"),
        (quantile("0.95", "tidegate_router_request_duration_seconds", "le, model", M),
         "whole request {{model}}")], unit="s")
    d.panel("Retries/s by reason, budget refusals", [
        (f"sum by (reason) (rate(tidegate_router_retries_total{{{M}}}[{RI}]))", "{{reason}}"),
        (f"sum(rate(tidegate_router_retry_budget_exhausted_total[{RI}]))", "budget exhausted")], unit="ops")
    d.panel("Client side: connections, disconnects, front-door events", [
        ("sum(tidegate_router_client_connections)", "open connections"),
        (f"sum(rate(tidegate_router_client_disconnects_total[{RI}]))", "abandoned requests/s"),
        (f"sum by (kind) (rate(tidegate_router_client_connection_events_total[{RI}]))", "{{kind}}/s")])
    d.endrow()
    d.panel("etcd watch healthy per router", [("tidegate_router_etcd_healthy", "{{pod}}{{instance}}")],
          extra={"min": 0, "max": 1})
    d.panel("Routing-table generation per pool", [("max by (pool) (tidegate_router_table_generation)", "{{pool}}")],
          desc="Rises on every change the leader publishes; flat while replicas change = the leader is not publishing.")
    d.panel("Table age and panic mode per pool", [
        ("max by (pool) (tidegate_router_table_age_seconds)", "age {{pool}}"),
        ("max by (pool) (tidegate_router_table_suspect)", "suspect {{pool}}")],
          desc="suspect = 1: the latest table lost most replicas, routers use the last known set.")
    d.endrow()

    d.row("Replicas")
    d.panel("Router in flight per replica", [("sum by (replica_id) (tidegate_router_inflight)", "{{replica_id}}")])
    d.panel("KV-cache use per engine", [
        ("vllm:kv_cache_usage_perc", "{{pod}}{{instance}}"),
        ("sglang:token_usage", "{{pod}}{{instance}}")], unit="percentunit", extra={"min": 0, "max": 1})
    d.panel("Queue per engine (waiting / running)", [
        ("vllm:num_requests_waiting", "waiting {{pod}}{{instance}}"),
        ("vllm:num_requests_running", "running {{pod}}{{instance}}")])
    d.endrow()
    d.panel("Preemptions/s per engine", [(f"rate(vllm:num_preemptions_total[{RI}])", "{{pod}}{{instance}}")],
            unit="ops")
    d.panel("Tokens/s per engine", [
        (f"rate(vllm:generation_tokens_total[{RI}])", "generated {{pod}}{{instance}}"),
        (f"rate(vllm:prompt_tokens_total[{RI}])", "prefill {{pod}}{{instance}}")])
    d.panel("Upstream errors/s by replica and kind", [
        (f"sum by (replica_id, kind) (rate(tidegate_router_upstream_errors_total[{RI}]))", "{{replica_id}} {{kind}}")],
          unit="ops")
    d.endrow()

    d.row("Control plane and agents")
    d.panel("Reports/s received", [(f"sum by (pod, instance) (rate(tidegate_cp_reports_received_total[{RI}]))",
                                  "{{pod}}{{instance}}")], unit="ops")
    d.panel("Decision tick P50/P99", [
        (f"histogram_quantile({q}, sum by (le) (rate(tidegate_cp_tick_seconds_bucket[{RI}])))", f"P{int(float(q)*100)}")
        for q in ("0.5", "0.99")], unit="s")
    d.panel("Tables published/s and publish errors", [
        (f"sum by (pool) (rate(tidegate_cp_tables_published_total[{RI}]))", "{{pool}}"),
        (f"sum(rate(tidegate_cp_publish_errors_total[{RI}]))", "errors")], unit="ops")
    d.endrow()
    d.panel("Agent scrapes/s by result",
            [(f"sum by (result) (rate(tidegate_agent_scrapes_total[{RI}]))", "{{result}}")],
          unit="ops")
    d.panel("Agent streams up / reconnects", [
        ("sum(tidegate_agent_stream_up)", "streams up"),
        (f"sum(rate(tidegate_agent_stream_reconnects_total[{RI}]))", "reconnects/s")])
    d.panel("Agent reports sent/s", [(f"sum(rate(tidegate_agent_reports_sent_total[{RI}]))", "reports/s")], unit="ops")
    d.endrow()

    return {
        "title": "Tidegate",
        "uid": "tidegate-fleet",
        "description": "Tidegate fleet: leader, replicas, routers, SLOs, admission. Metrics: every name is "
                       "exported by a "
                       "Tidegate process or the engines (tests/unit/test_deploy_observability.py); SLO burn rates need "
                       "the recording rules of deploy/prometheus/alerts.yml.",
        "tags": ["tidegate", "llm", "slo"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            {"name": "model", "label": "Model (pool)", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(tidegate_router_requests_total, model)", "refId": "model"},
             "definition": "label_values(tidegate_router_requests_total, model)",
             "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "current": {}, "hide": 0},
            {"name": "ttft_slo", "label": "TTFT SLO (s, a histogram bound)", "type": "custom",
             "query": "0.5,1,2.5,5,10", "current": {"text": "2.5", "value": "2.5"},
             "options": [{"text": v, "value": v, "selected": v == "2.5"} for v in ("0.5", "1", "2.5", "5", "10")],
             "hide": 0},
        ]},
        "panels": d.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render())
