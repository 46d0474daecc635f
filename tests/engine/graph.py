"""The resource graph of the recording engine (``infra.plan``) against the real engine's state.

Compared per URN: the type, the parent, the provider (its URN: the id half of a provider reference
is the provider resource's id, which each engine makes up), the dependencies, ``protect`` and the
inputs. The state holds the inputs the provider's ``Check`` returned, the recording what the
program sent; what differs between the two for that reason alone, and what the engine adds by
itself, is not reported, each rule as narrow as the source it cites:

- resources only the engine registers: the root stack resource (``pulumi:pulumi:Stack``), the
  default provider of a package the program does not disable (``pulumi:providers:eks``, which only
  constructs the pulumi-eks component) and the engine's own ``pulumi`` provider;
- the objects a ``kubernetes:kustomize/v2:Directory`` registers: the provider builds them from the
  overlay at deploy time (its Construct), which the offline plan does not run. They are compared,
  one by one, with the overlay as ``kubectl kustomize`` builds it (``expected_kustomize_children``);
- a remote component's inputs: the engine hands them to Construct and keeps none in the state;
- ``__defaults`` and ``__internal``: the providers' bookkeeping, not inputs;
- a provider resource's ``version``: the engine adds the plugin version the SDK asked for, which
  must be the pinned SDK's; its structured config reaches the state JSON-encoded (the recording
  decodes it);
- the Kubernetes provider's kubeconfig: the ``eks`` stand-in returns the test control plane's
  server, CA and credentials (docs/testing.md: not modelled); contexts and names must match;
- autonames: pulumi-aws's Check adds ``name`` (``bucket`` for a bucket) when the program gives
  none; it must be the name the recording fabricated for that resource's outputs;
- a Helm release: Check fills the provider's defaults for options the program leaves out (each
  must hold its zero value, ``values`` an empty map) and consumes the SDK's ``compat`` marker
  (pulumi-kubernetes v4.25.0 provider/pkg/provider/helm_release.go, the ``Release`` struct);
- a Secret: the provider's Check moves ``stringData`` into ``data`` (both secret);
- a field the Kubernetes provider's typed normalization drops because it holds the Go zero value
  (``omitempty``: ``false``, ``0``, ``""``), such as a PriorityClass's ``globalDefault: false``;
- secret values: the state holds them encrypted, the recording as ``"[secret]"``; both must be
  secret at the same place.
"""
from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Iterable, Optional

STACK_TYPE = "pulumi:pulumi:Stack"
SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET_VALUE = "1b47061264138c4ac30d75fd1eb44270"
RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
KUSTOMIZE_TYPE = "kubernetes:kustomize/v2:Directory"
# Default providers the engine creates for packages the program leaves enabled (Pulumi.yaml's
# pulumi:disable-default-providers names aws and kubernetes only).
DEFAULT_PROVIDER_PACKAGES = ("eks",)
SDK_DISTRIBUTIONS = {"aws": "pulumi_aws", "kubernetes": "pulumi_kubernetes", "eks": "pulumi_eks"}
# API groups of the built-in kinds (Kubernetes 1.32): a kind in any other group needs a CRD.
BUILT_IN_GROUPS = frozenset({
    "core", "", "apps", "batch", "autoscaling", "policy", "rbac.authorization.k8s.io", "networking.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "node.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "certificates.k8s.io",
    "flowcontrol.apiserver.k8s.io", "events.k8s.io", "resource.k8s.io", "authentication.k8s.io",
    "authorization.k8s.io", "storagemigration.k8s.io", "internal.apiserver.k8s.io",
})
# pulumi-kubernetes v4.25.0 provider/pkg/provider/helm_release.go: the Release struct's fields that
# Check writes back whatever the program sent (json tags; defaults: zero values).
RELEASE_CHECK_DEFAULTS = frozenset({
    "allowNullValues", "createNamespace", "dependencyUpdate", "description", "devel", "disableCRDHooks",
    "disableOpenapiValidation", "disableWebhooks", "forceUpdate", "keyring", "lint", "postrender",
    "recreatePods", "renderSubchartNotes", "replace", "resetValues", "reuseValues", "skipAwait", "skipCrds",
    "verify", "waitForJobs", "values",
})
ZERO_VALUES = (False, 0, "", None)


def urn_type(urn: str) -> str:
    return urn.split("::")[2].rsplit("$", 1)[-1]


def recorded_graph(plan) -> list[dict[str, Any]]:
    """The recording as the engine's state names things: URNs for parent, provider, dependencies."""
    graph = []
    for resource in plan.recording.resources:
        provider = resource.provider or (resource.providers.get(resource.package) if resource.remote else None)
        graph.append({"urn": resource.urn, "type": resource.type, "parent": resource.parent,
                      "provider": provider, "dependencies": sorted(set(resource.dependencies)),
                      "inputs": resource.inputs, "outputs": resource.outputs, "protect": resource.protect,
                      "custom": resource.custom, "remote": resource.remote})
    return graph


def engine_only(urn: str) -> bool:
    """A resource the engine registers by itself: the root stack, its own ``pulumi`` provider, the
    default provider of a package the program leaves enabled."""
    resource_type, name = urn_type(urn), urn.rsplit("::", 1)[-1]
    if resource_type == STACK_TYPE:
        return True
    if resource_type == "pulumi:providers:pulumi" and name == "default":
        return True
    return (resource_type.startswith("pulumi:providers:") and resource_type.rsplit(":", 1)[-1] in DEFAULT_PROVIDER_PACKAGES
            and (name == "default" or name.startswith("default_")))


def _provider_urn(reference: Optional[str]) -> Optional[str]:
    return reference.rsplit("::", 1)[0] if reference else None


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE


def _blank_secrets(value: Any) -> Any:
    if _is_secret(value):
        return "[secret]"
    if isinstance(value, dict):
        return {key: _blank_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_blank_secrets(item) for item in value]
    return value


def _json_or_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _drop_zero_fields(recorded: Any, real: Any) -> Any:
    """``recorded`` without the fields the provider's typed normalization drops (zero values absent
    from ``real`` at the same place)."""
    if isinstance(recorded, dict) and isinstance(real, dict):
        return {key: _drop_zero_fields(value, real.get(key)) for key, value in recorded.items()
                if key in real or value not in ZERO_VALUES or isinstance(value, (dict, list))}
    if isinstance(recorded, list) and isinstance(real, list) and len(recorded) == len(real):
        return [_drop_zero_fields(a, b) for a, b in zip(recorded, real)]
    return recorded


def _kubeconfig_shape(value: Any) -> Any:
    config = _json_or_value(value)
    if not isinstance(config, dict):
        return config
    clusters = [{"name": c.get("name"), "cluster": {k: v for k, v in (c.get("cluster") or {}).items()
                                                     if k not in ("server", "certificate-authority-data")}}
                for c in config.get("clusters") or []]
    return {**{k: v for k, v in config.items() if k not in ("clusters", "users")}, "clusters": clusters,
            "users": [u.get("name") for u in config.get("users") or []]}


def input_differences(resource: dict[str, Any], real_inputs: dict[str, Any]) -> list[str]:
    urn, resource_type, recorded = resource["urn"], resource["type"], dict(resource["inputs"] or {})
    if resource["remote"]:
        return []
    real = _blank_secrets({k: v for k, v in real_inputs.items() if k not in ("__defaults", "__internal")})
    if resource_type.startswith("pulumi:providers:"):
        package = resource_type.rsplit(":", 1)[-1]
        expected = metadata.version(SDK_DISTRIBUTIONS[package]) if package in SDK_DISTRIBUTIONS else None
        if real.pop("version", None) != expected:
            return [f"{urn}: input version: the engine gave {real_inputs.get('version')!r}, the pinned SDK is {expected!r}"]
        real = {k: _json_or_value(v) for k, v in real.items()}
        recorded = {k: _json_or_value(v) for k, v in recorded.items()}
        if package == "kubernetes" and "kubeconfig" in recorded:
            recorded["kubeconfig"], real["kubeconfig"] = (_kubeconfig_shape(recorded["kubeconfig"]),
                                                         _kubeconfig_shape(real.get("kubeconfig")))
    if resource_type.startswith("aws:"):
        for key in ("name", "bucket"):
            if key not in recorded and key in real and real[key] == (resource.get("outputs") or {}).get(key):
                recorded[key] = real[key]
    if resource_type == RELEASE_TYPE:
        recorded.pop("compat", None)
        for key in RELEASE_CHECK_DEFAULTS - set(recorded):
            if real.get(key, None) in ZERO_VALUES or real.get(key) == {}:
                real.pop(key, None)
    if resource_type == "kubernetes:core/v1:Secret" and "stringData" in recorded:
        if recorded.get("stringData") == "[secret]" and real.get("data") == "[secret]" and "stringData" not in real:
            recorded.pop("stringData")
            recorded.setdefault("data", "[secret]")
    if resource_type.startswith("kubernetes:") and resource_type != RELEASE_TYPE:
        recorded = _drop_zero_fields(recorded, real)
    out = []
    for key in sorted(set(recorded) | set(real)):
        if recorded.get(key, "<absent>") != real.get(key, "<absent>"):
            out.append(f"{urn}: input {key}: recorded {_short(recorded.get(key, '<absent>'))} "
                       f"real {_short(real.get(key, '<absent>'))}")
    return out


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def expected_kustomize_children(directory: dict[str, Any], objects: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """URN -> (type, inputs) of what pulumi-kubernetes' kustomize v2 Directory registers for
    ``objects`` (the overlay built): ``<directory name>:<namespace>/<name>`` (or ``:<name>`` when
    cluster-scoped), type ``kubernetes:<group/version>:<Kind>`` with ``core`` for the core group,
    parent the Directory (provider/pkg/provider/yaml/v2/yaml.go ``Register``)."""
    name = directory["urn"].rsplit("::", 1)[-1]
    prefix = directory["urn"].rsplit("::", 1)[0]
    children = {}
    for obj in objects:
        api_version = obj["apiVersion"] if "/" in obj["apiVersion"] else f"core/{obj['apiVersion']}"
        child_type = f"kubernetes:{api_version}:{obj['kind']}"
        meta = obj.get("metadata") or {}
        child_name = f"{name}:{meta['namespace']}/{meta['name']}" if meta.get("namespace") else f"{name}:{meta['name']}"
        children[f"{prefix}${child_type}::{child_name}"] = {"type": child_type, "inputs": obj}
    return children


def compare_graphs(recorded: list[dict[str, Any]], state: list[dict[str, Any]], *,
                   kustomize: Optional[dict[str, list[dict[str, Any]]]] = None) -> list[str]:
    """Differences, one line each (empty: the graphs agree). ``kustomize``: Directory URN -> the
    objects its overlay builds."""
    real = {r["urn"]: r for r in state if not engine_only(r["urn"])}
    mine = {r["urn"]: r for r in recorded}
    out: list[str] = []
    directories = {r["urn"]: r for r in recorded if r["type"] == KUSTOMIZE_TYPE}
    for urn, directory in directories.items():
        expected = expected_kustomize_children(directory, (kustomize or {}).get(urn, []))
        built = {u: r for u, r in real.items() if r.get("parent") == urn}
        out += [f"{u}: the Directory's overlay builds it, the engine did not register it" for u in sorted(set(expected) - set(built))]
        out += [f"{u}: registered by the Directory, not in its overlay" for u in sorted(set(built) - set(expected))]
        for u in sorted(set(expected) & set(built)):
            child = {"urn": u, "type": expected[u]["type"], "inputs": expected[u]["inputs"], "remote": False}
            if built[u]["type"] != child["type"]:
                out.append(f"{u}: type overlay {child['type']} real {built[u]['type']}")
            out += input_differences(child, built[u].get("inputs") or {})
        for u in built:
            real.pop(u)
    out += [f"{urn}: only in the real engine's state" for urn in sorted(set(real) - set(mine))]
    out += [f"{urn}: only in the recording" for urn in sorted(set(mine) - set(real))]
    for urn in sorted(set(real) & set(mine)):
        a, b = mine[urn], real[urn]
        if a["type"] != b["type"]:
            out.append(f"{urn}: type recorded {a['type']} real {b['type']}")
        parent = b.get("parent")
        if a["parent"] != parent:
            out.append(f"{urn}: parent recorded {a['parent']} real {parent}")
        if b.get("custom") and a["provider"] != _provider_urn(b.get("provider")):
            out.append(f"{urn}: provider recorded {a['provider']} real {_provider_urn(b.get('provider'))}")
        real_deps = sorted(set(b.get("dependencies") or []))
        if real_deps != a["dependencies"]:
            out.append(f"{urn}: dependencies recorded-only {sorted(set(a['dependencies']) - set(real_deps))} "
                       f"real-only {sorted(set(real_deps) - set(a['dependencies']))}")
        if bool(b.get("protect")) != bool(a["protect"]):
            out.append(f"{urn}: protect recorded {a['protect']} real {b.get('protect')}")
        out += input_differences(a, b.get("inputs") or {})
    return out


def dependency_closure(state: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Every resource each one waits for before the engine creates it (dependencies, transitively)."""
    direct = {r["urn"]: set(r.get("dependencies") or []) for r in state}
    closure: dict[str, set[str]] = {}

    def visit(urn: str, seen: frozenset) -> set[str]:
        if urn in closure:
            return closure[urn]
        found: set[str] = set()
        for dep in direct.get(urn, ()):
            if dep not in seen:
                found |= {dep} | visit(dep, seen | {dep})
        closure[urn] = found
        return found

    for urn in direct:
        visit(urn, frozenset({urn}))
    return closure


def crd_owners(engine, state: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(group, kind) -> URNs of what creates that CRD: a CustomResourceDefinition resource of the
    program (a kustomize Directory's included), or the Helm release whose chart ships it (templates:
    Helm's release annotations on the CRD; the chart's crds/ folder, which Helm installs unannotated:
    the chart's files as Helm keeps them in the release record)."""
    owners: dict[tuple[str, str], set[str]] = {}
    for resource in state:
        if resource["type"] == CRD_TYPE:
            spec = (resource.get("inputs") or {}).get("spec") or {}
            owners.setdefault((spec.get("group"), (spec.get("names") or {}).get("kind")), set()).add(resource["urn"])
    releases = {((r.get("inputs") or {}).get("namespace"), (r.get("inputs") or {}).get("name")): r["urn"]
                for r in state if r["type"] == RELEASE_TYPE}
    for crd in json.loads(engine.plane.kubectl("get", "crd", "-o", "json").stdout)["items"]:
        annotations = crd["metadata"].get("annotations") or {}
        key = (annotations.get("meta.helm.sh/release-namespace"), annotations.get("meta.helm.sh/release-name"))
        if key in releases:
            owners.setdefault((crd["spec"]["group"], crd["spec"]["names"]["kind"]), set()).add(releases[key])
    for (namespace, name), urn in releases.items():
        for crd in engine.release_chart_crds(namespace, name):
            owners.setdefault((crd["spec"]["group"], crd["spec"]["names"]["kind"]), set()).add(urn)
    return owners


def custom_resources(state: list[dict[str, Any]], owners: dict[tuple[str, str], set[str]]) -> dict[str, set[str]]:
    """Each custom resource in the state -> the URNs that create its CRD (empty: none found)."""
    found = {}
    for resource in state:
        parts = resource["type"].split(":")
        if parts[0] != "kubernetes" or len(parts) != 3 or "/" not in parts[1]:
            continue
        group, kind = parts[1].split("/")[0], parts[2]
        if group in BUILT_IN_GROUPS or group in ("helm.sh", "kustomize", "yaml"):
            continue
        found[resource["urn"]] = owners.get((group, kind), set())
    return found
