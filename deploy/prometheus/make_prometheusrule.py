"""Write deploy/kubernetes/base/prometheusrule.yaml: alerts.yml wrapped in a Prometheus Operator
PrometheusRule. alerts.yml is the source; tests/unit/test_deploy_observability.py fails when the
two differ.

    python deploy/prometheus/make_prometheusrule.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
TARGET = HERE.parents[0] / "kubernetes" / "base" / "prometheusrule.yaml"
HEADER = "# Generated from deploy/prometheus/alerts.yml by deploy/prometheus/make_prometheusrule.py: edit those.\n"


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # multi-line PromQL stays readable as a block, as in alerts.yml
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def render() -> str:
    groups = yaml.safe_load((HERE / "alerts.yml").read_text())["groups"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "tidegate"}, "spec": {"groups": groups}}
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
    TARGET.write_text(render())
