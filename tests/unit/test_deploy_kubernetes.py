"""deploy/kubernetes renders, validates against the Kubernetes schemas offline, and hangs together.

The overlay is rendered by `kubectl kustomize` where kubectl exists and always by the small
Python renderer (deploy/kubernetes/kustomize_lite.py); both must agree. Every object is checked
against the OpenAPI schemas of two Kubernetes versions (kubernetes-validate, no cluster), and
then across objects: selectors match pod labels, probes and Services name real container
ports, every Secret a pod mounts is one make-secrets.sh creates with the keys it reads, the
control plane's own parsers accept those Secrets and let an engine pod's agent in, the etcd
certificate names the address clients dial, and every tidegate container's arguments parse
with the real CLI and load its config.
"""

from __future__ import annotations

import base64
import copy
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tidegate.cli.main import COMMANDS, build_parser
from tidegate.config import load
from tidegate.errors import PermissionDeniedError

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAY = K8S / "overlays" / "example"
# The oldest Kubernetes minor the manifests target and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# Not in the Kubernetes schemas: checked by _check_service_monitors below instead.
CRD_KINDS = {"ServiceMonitor": "Prometheus Operator CRD (monitoring.coreos.com/v1): its schema is not "
                               "vendored; selectors and ports are checked against the Services instead",
             "PrometheusRule": "Prometheus Operator CRD: its rules are deploy/prometheus/alerts.yml, checked by "
                               "promtool (tests/unit/test_deploy_observability.py)"}
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def _lite():
    spec = importlib.util.spec_from_file_location("kustomize_lite", K8S / "kustomize_lite.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kustomize_lite", module)
    spec.loader.exec_module(module)
    return module


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _lite().render(OVERLAY)


def test_python_renderer_matches_kubectl(rendered: list[dict[str, Any]]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlay is rendered by kustomize_lite.py alone")
    out = subprocess.run([kubectl, "kustomize", str(OVERLAY)], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    by_kubectl = {_key(o): o for o in yaml.safe_load_all(out) if o}
    assert {_key(o): o for o in rendered} == by_kubectl


def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches:\n  - path: p.yaml\n")
    lite = _lite()
    with pytest.raises(lite.UnsupportedKustomization, match="patches"):
        lite.render(tmp_path)


def test_overlay_has_the_parts(rendered: list[dict[str, Any]]) -> None:
    kinds = {_key(o) for o in rendered}
    for expected in [("Deployment", "tidegate-router"), ("Service", "tidegate-router"),
                     ("HorizontalPodAutoscaler", "tidegate-router"), ("PodDisruptionBudget", "tidegate-router"),
                     ("Deployment", "tidegate-controlplane"), ("Service", "tidegate-controlplane"),
                     ("StatefulSet", "tidegate-etcd"), ("Deployment", "vllm-llama-8b"),
                     ("ServiceMonitor", "tidegate-router")]:
        assert expected in kinds
    objs = {_key(o): o for o in rendered}
    assert objs["Deployment", "tidegate-controlplane"]["spec"]["replicas"] == 2
    assert objs["StatefulSet", "tidegate-etcd"]["spec"]["replicas"] == 3
    engine = objs["Deployment", "vllm-llama-8b"]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in engine] == ["vllm", "agent"]
    assert engine[0]["image"].startswith("vllm/vllm-openai:")
    assert engine[0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert all(o["metadata"].get("namespace") == "tidegate" for o in rendered if o["kind"] != "Namespace")
    # vLLM does not export its seats, so the sidecar is told them: the same figure as the engine's.
    flags = [{a.split("=", 1)[0]: a.split("=", 1)[1] for a in c["args"] if a.startswith("--") and "=" in a}
             for c in engine]
    assert flags[0]["--max-num-seqs"] == flags[1]["--engine-max-num-seqs"]


def _schema_errors(objs: list[dict[str, Any]]) -> list[str]:
    errors = []
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']} (k8s {version}): {e.message} at "
                              f"{'.'.join(str(p) for p in e.path)}")
    return errors


def test_every_object_validates_against_the_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    assert _schema_errors(rendered) == []
    assert {o["kind"] for o in rendered} - set(CRD_KINDS), "nothing was validated"


def _pods(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, o["spec"]["template"]) for o in objs if o["kind"] in POD_KINDS]


def _cross_errors(objs: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    pods = _pods(objs)
    for owner, template in pods:
        name = f"{owner['kind']}/{owner['metadata']['name']}"
        selector = owner["spec"]["selector"]["matchLabels"]
        if not selector.items() <= template["metadata"]["labels"].items():
            errors.append(f"{name}: selector {selector} does not match its pod labels")
        for c in template["spec"]["containers"]:
            ports = {p["name"] for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                action = c.get(probe, {}).get("httpGet") or c.get(probe, {}).get("tcpSocket")
                if action and action["port"] not in ports:
                    errors.append(f"{name}/{c['name']}: {probe} port {action['port']!r} is not a container port")
            if c["name"] != "vllm" and not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                errors.append(f"{name}/{c['name']}: root filesystem is writable")
            if c["name"] != "vllm" and not (c.get("securityContext", {}).get("runAsNonRoot")
                                            or template["spec"].get("securityContext", {}).get("runAsNonRoot")):
                errors.append(f"{name}/{c['name']}: may run as root")
            if "requests" not in c.get("resources", {}):
                errors.append(f"{name}/{c['name']}: no resource requests")
    for svc in (o for o in objs if o["kind"] == "Service"):
        selected = [t for _, t in pods if svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()]
        if not selected:
            errors.append(f"Service/{svc['metadata']['name']}: selects no pod")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for t in selected:
                names = {p.get("name") for c in t["spec"]["containers"] for p in c.get("ports", [])}
                numbers = {p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
                if target not in names | numbers:
                    errors.append(f"Service/{svc['metadata']['name']}: targetPort {target!r} not in its pods")
    errors.extend(_check_service_monitors(objs))
    return errors


def _check_service_monitors(objs: list[dict[str, Any]]) -> list[str]:
    errors = []
    services = [o for o in objs if o["kind"] == "Service"]
    for sm in (o for o in objs if o["kind"] == "ServiceMonitor"):
        name = f"ServiceMonitor/{sm['metadata']['name']}"
        if sm["apiVersion"] != "monitoring.coreos.com/v1":
            errors.append(f"{name}: apiVersion {sm['apiVersion']}")
        want = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if want.items() <= s["metadata"].get("labels", {}).items()]
        if not matched:
            errors.append(f"{name}: selects no Service")
        for ep in sm["spec"]["endpoints"]:
            if set(ep) - {"port", "path", "interval", "scheme", "scrapeTimeout"}:
                errors.append(f"{name}: unexpected endpoint fields {sorted(ep)}")
            if not any(ep["port"] in {p["name"] for p in s["spec"]["ports"]} for s in matched):
                errors.append(f"{name}: port {ep['port']!r} on none of its Services")
    return errors


def test_objects_hang_together(rendered: list[dict[str, Any]]) -> None:
    assert _cross_errors(rendered) == []


def _tidegate_containers(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{o['metadata']['name']}/{c['name']}", c) for o, t in _pods(objs) for c in t["spec"]["containers"]
            if c["image"].split("/")[-1].startswith("tidegate")]


def test_tidegate_commands_are_valid(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    containers = _tidegate_containers(rendered)
    assert sorted(c["args"][0] for _, c in containers) == ["agent", "controlplane", "router"]
    for name, c in containers:
        # $(VAR) is expanded by the kubelet from the container's env: give each a plausible value.
        env = {e["name"]: {"POD_IP": "10.1.2.3"}.get(e["name"], "pod-0") for e in c.get("env", [])}
        argv = [_mounted(_expand(a, env), c, tmp_path) for a in c["args"]]
        assert "$(" not in " ".join(argv), f"{name}: unknown variable in {argv}"
        args = build_parser().parse_args(argv)  # SystemExit on an unknown flag
        module = importlib.import_module(COMMANDS[argv[0]][0])
        assert load(module.CONFIG_CLASS, argv[0], args, None, environ={}) is not None, name


def _mounted(arg: str, container: dict[str, Any], tmp: Path) -> str:
    """A flag naming a file in a mounted volume points at a stand-in file (the config checks it is readable)."""
    for m in container.get("volumeMounts", []):
        flag, _, value = arg.partition("=")
        if value.startswith(m["mountPath"] + "/"):
            local = tmp / m["name"] / value[len(m["mountPath"]) + 1:]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text("")
            return f"{flag}={local}"
    return arg


def _expand(arg: str, env: dict[str, str]) -> str:
    for k, v in env.items():
        arg = arg.replace(f"$({k})", v)
    return arg


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secrets") / "cli"


@pytest.fixture(scope="module")
def secrets(secrets_dir: Path) -> dict[str, dict[str, Any]]:
    if shutil.which("openssl") is None:
        pytest.skip("make-secrets.sh needs openssl, not installed here")
    run = subprocess.run(["bash", str(K8S / "make-secrets.sh"), "tidegate", str(secrets_dir)],
                         env={**os.environ, "DRY_RUN": "1"}, check=True, capture_output=True, text=True, timeout=120)
    return {o["metadata"]["name"]: o for o in yaml.safe_load_all(run.stdout) if o}


def _secret_file(secrets: dict[str, dict[str, Any]], name: str, key: str) -> bytes:
    return base64.b64decode(secrets[name]["data"][key])


def _arg(container: dict[str, Any], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "="))


def test_made_secrets_let_the_agents_and_the_cli_in(rendered: list[dict[str, Any]], secrets: dict[str, dict[str, Any]],
                                                    secrets_dir: Path) -> None:
    """The control plane's own parsers accept what make-secrets.sh made, and an engine pod's agent
    with its token, its pod name as replica id and a pod IP is let in by the manifests' settings."""
    from tidegate.controlplane.auth import parse_tokens
    from tidegate.controlplane.telemetry_auth import AllowedNetworks, authorize, identify, parse_credentials

    tokens = parse_tokens(_secret_file(secrets, "tidegate-admin-tokens", "tokens.csv").decode())
    operator = (secrets_dir / "operator.token").read_text()
    assert tokens[operator].role == "operator"
    assert tokens[(secrets_dir / "viewer.token").read_text()].role == "viewer"
    objs = {_key(o): o for o in rendered}
    cp = objs["Deployment", "tidegate-controlplane"]["spec"]["template"]["spec"]["containers"][0]
    networks = AllowedNetworks.parse(_arg(cp, "--telemetry-allowed-networks").split(","))
    credentials = parse_credentials(_secret_file(secrets, "tidegate-telemetry-credentials", "credentials.csv").decode())
    agent_token = _secret_file(secrets, "tidegate-agent-vllm-llama-8b", "token").decode()
    identity = identify(credentials, agent_token)
    authorize(identity, "vllm-llama-8b-7d9f8c6b5d-x2x4q", "http://10.1.2.3:8000", networks)
    with pytest.raises(PermissionDeniedError, match="may not speak for"):
        authorize(identity, "other-deployment-abc", "http://10.1.2.3:8000", networks)


def test_etcd_certificate_names_the_address_clients_use(rendered: list[dict[str, Any]],
                                                        secrets: dict[str, dict[str, Any]]) -> None:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(_secret_file(secrets, "tidegate-etcd-server", "tls.crt"))
    names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName))
    objs = {_key(o): o for o in rendered}
    for deployment in ("tidegate-controlplane", "tidegate-router"):
        c = objs["Deployment", deployment]["spec"]["template"]["spec"]["containers"][0]
        host = _arg(c, "--etcd").rsplit(":", 1)[0]
        assert host in names, f"{deployment} dials {host}; the etcd certificate names {sorted(names)}"
    assert "*.tidegate-etcd.tidegate.svc" in names  # the members' peer addresses


def test_make_secrets_covers_every_mounted_secret(rendered: list[dict[str, Any]],
                                                  secrets: dict[str, dict[str, Any]]) -> None:
    assert _schema_errors(list(secrets.values())) == []
    for owner, template in _pods(rendered):
        for vol in template["spec"].get("volumes", []):
            if "secret" not in vol:
                continue
            name = vol["secret"]["secretName"]
            assert name in secrets, f"{owner['metadata']['name']} mounts Secret {name}, which make-secrets.sh lacks"
            for c in template["spec"]["containers"]:
                for m in c.get("volumeMounts", []):
                    if m["name"] == vol["name"]:
                        for a in c.get("args", []):
                            if a.startswith("--") and "=" in a and a.split("=", 1)[1].startswith(m["mountPath"] + "/"):
                                key = a.split("=", 1)[1][len(m["mountPath"]) + 1:]
                                assert key in secrets[name]["data"], f"{name} has no key {key} for {a}"
    assert {s["metadata"]["namespace"] for s in secrets.values()} == {"tidegate"}


def test_a_broken_manifest_fails(rendered: list[dict[str, Any]]) -> None:
    """The checks above can fail: each mutation must be caught."""
    objs = copy.deepcopy(rendered)
    router = next(o for o in objs if _key(o) == ("Deployment", "tidegate-router"))
    router["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"cores": 1}
    router["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/", "port": "nope"}}
    assert any("tidegate-router" in e for e in _schema_errors(objs))
    assert any("port 'nope'" in e for e in _cross_errors(objs))
    objs = copy.deepcopy(rendered)
    svc = next(o for o in objs if _key(o) == ("Service", "tidegate-controlplane"))
    svc["spec"]["selector"] = {"app.kubernetes.io/name": "typo"}
    assert any("selects no pod" in e for e in _cross_errors(objs))
    objs = copy.deepcopy(rendered)
    hpa = next(o for o in objs if o["kind"] == "HorizontalPodAutoscaler")
    hpa["spec"]["minReplicas"] = "two"
    assert any("HorizontalPodAutoscaler" in e for e in _schema_errors(objs))
