"""Render a kustomization without kubectl: the subset of kustomize that deploy/kubernetes uses.

Supported fields: resources (files and folders with their own kustomization.yaml), namespace,
labels (pairs on metadata only), images (newName/newTag/digest by image name). Any other field
is an error, so an overlay that grows past this subset fails loudly where kubectl is absent
instead of rendering something kubectl would not. tests/unit/test_deploy_kubernetes.py checks
that this renderer and `kubectl kustomize` agree wherever kubectl exists.

    python deploy/kubernetes/kustomize_lite.py deploy/kubernetes/overlays/example
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = frozenset({"apiVersion", "kind", "resources", "namespace", "labels", "images"})
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                            "PersistentVolume", "StorageClass", "PriorityClass", "IngressClass",
                            "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"})
_POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})


class UnsupportedKustomization(ValueError):
    """The kustomization uses a field this renderer does not implement."""


def render(folder: str | Path) -> list[dict[str, Any]]:
    folder = Path(folder)
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text()) or {}
    unknown = sorted(set(spec) - SUPPORTED)
    if unknown:
        raise UnsupportedKustomization(f"{folder}/kustomization.yaml: unsupported fields {unknown}; "
                                       "use `kubectl kustomize`")
    objs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        if path.is_dir():
            objs.extend(render(path))
        else:
            objs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for entry in spec.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise UnsupportedKustomization(f"{folder}: labels with includeSelectors/includeTemplates")
        for obj in objs:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    for image in spec.get("images", []):
        for obj in objs:
            for container in _containers(obj):
                if _image_name(container.get("image", "")) == image["name"]:
                    container["image"] = _retag(container["image"], image)
    if "namespace" in spec:
        for obj in objs:
            if obj.get("kind") not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = spec["namespace"]
    return objs


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj.get("kind") == "Pod":
        pod = obj.get("spec", {})
    elif obj.get("kind") in _POD_TEMPLATE_KINDS:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    else:
        return []
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _image_name(ref: str) -> str:
    ref = ref.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return ref[:colon] if colon > slash else ref


def _retag(ref: str, image: dict[str, str]) -> str:
    name = image.get("newName", _image_name(ref))
    if "digest" in image:
        return f"{name}@{image['digest']}"
    rest = ref[len(_image_name(ref)):]
    return name + (f":{image['newTag']}" if "newTag" in image else rest)


if __name__ == "__main__":
    print(yaml.safe_dump_all(render(sys.argv[1]), sort_keys=True), end="")
