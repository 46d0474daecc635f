"""Turn a manifest dict from workloads/ into the matching Pulumi Kubernetes resource.

Built-in kinds get their typed class (so the engine knows their schema); custom resources
become ``CustomResource`` with the same ``kubernetes:<group>/<version>:<Kind>`` token.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

# API group -> pulumi_kubernetes module of built-in kinds.
_BUILTIN_GROUPS = {
    "": "core",
    "apps": "apps",
    "batch": "batch",
    "policy": "policy",
    "storage.k8s.io": "storage",
    "scheduling.k8s.io": "scheduling",
    "networking.k8s.io": "networking",
    "rbac.authorization.k8s.io": "rbac",
    "autoscaling": "autoscaling",
    "flowcontrol.apiserver.k8s.io": "flowcontrol",
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def apply_object(name: str, obj: Mapping[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Create the resource for ``obj`` (a complete manifest with apiVersion and kind)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    group, _, version = api_version.rpartition("/")
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    module_name = _BUILTIN_GROUPS.get(group)
    if module_name is not None:
        module = importlib.import_module(f"pulumi_kubernetes.{module_name}.{version}")
        resource_class = getattr(module, kind)
        return resource_class(name, opts=opts, **{_snake(k): v for k, v in fields.items()})
    return k8s.apiextensions.CustomResource(name, api_version=api_version, kind=kind, opts=opts, **fields)


def apply_namespace_objects(
    prefix: str, objects: Sequence[Mapping[str, Any]], parent: pulumi.Resource,
) -> tuple[pulumi.CustomResource, list[pulumi.CustomResource]]:
    """A namespace and the objects that live in it (``namespace_objects``: the namespace first),
    named ``<prefix>-namespace`` and ``<prefix>-netpol-<name>``; the rest wait for the namespace."""
    namespace = apply_object(f"{prefix}-namespace", objects[0], pulumi.ResourceOptions(parent=parent))
    in_namespace = pulumi.ResourceOptions(parent=parent, depends_on=[namespace])
    return namespace, [apply_object(f"{prefix}-netpol-{obj['metadata']['name']}", obj, in_namespace)
                       for obj in objects[1:]]
