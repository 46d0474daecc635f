"""The resource graph of the recording engine (``infra.plan``) against the real engine's state.

Compared per URN: the type, the parent, the provider (its URN: the id half of a provider reference
is the provider resource's id, which the recording engine fabricates), the dependencies and the
inputs. Differences inherent to the engine, and only those, are not reported:

- the root stack resource (``pulumi:pulumi:Stack``): the recording engine parents top-level
  resources to the same URN but does not record it as a resource;
- inputs the real provider's ``Check`` adds that the program never sends (``INHERENT_INPUTS``: its
  defaults for a Helm release); the program's own inputs must be equal;
- secret inputs: the state holds them encrypted, the recording as ``"[secret]"``; both must be
  secret at the same paths.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

STACK_TYPE = "pulumi:pulumi:Stack"
SECRET_SIG = "4dabf18193072939515e22adb298388d"
RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
# API groups of the built-in kinds (Kubernetes 1.32): a kind in any other group needs a CRD.
BUILT_IN_GROUPS = frozenset({
    "core", "", "apps", "batch", "autoscaling", "policy", "rbac.authorization.k8s.io", "networking.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "node.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "certificates.k8s.io",
    "flowcontrol.apiserver.k8s.io", "events.k8s.io", "resource.k8s.io", "authentication.k8s.io",
    "authorization.k8s.io", "storagemigration.k8s.io", "internal.apiserver.k8s.io",
})
# What pulumi-kubernetes' Release.Check fills in when the program leaves it out
# (provider/pkg/provider/helm_release.go, v4.25.0: the `Release` struct's defaults).
INHERENT_INPUTS: dict[str, frozenset[str]] = {}


def urn_type(urn: str) -> str:
    return urn.split("::")[2].rsplit("$", 1)[-1]


def recorded_graph(plan) -> list[dict[str, Any]]:
    """The recording as the engine's state names things: URNs for parent, provider, dependencies."""
    graph = []
    for resource in plan.recording.resources:
        provider = resource.provider or (resource.providers.get(resource.package) if resource.remote else None)
        graph.append({"urn": resource.urn, "type": resource.type, "parent": resource.parent,
                      "provider": provider, "dependencies": sorted(set(resource.dependencies)),
                      "inputs": resource.inputs, "protect": resource.protect, "custom": resource.custom,
                      "remote": resource.remote})
    return graph


def _provider_urn(reference: str | None) -> str | None:
    return reference.rsplit("::", 1)[0] if reference else None


def _secret_paths(value: Any, path: str = "") -> Iterable[str]:
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270":
            yield path
            return
        for key, item in value.items():
            yield from _secret_paths(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _secret_paths(item, f"{path}[{index}]")


def _blank_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return "[secret]"
        return {key: _blank_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_blank_secrets(item) for item in value]
    return value


def _input_differences(urn: str, resource_type: str, recorded: dict[str, Any], real: dict[str, Any]) -> list[str]:
    out = []
    real = _blank_secrets(real)
    inherent = INHERENT_INPUTS.get(resource_type, frozenset())
    for key in sorted(set(recorded) | set(real)):
        if key not in recorded and key in inherent:
            continue
        if key.startswith("__"):
            continue  # the engine's bookkeeping (__defaults): not an input the program sends
        if recorded.get(key, "<absent>") != real.get(key, "<absent>"):
            out.append(f"{urn}: input {key}: recorded {_short(recorded.get(key, '<absent>'))} real {_short(real.get(key, '<absent>'))}")
    return out


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def compare_graphs(recorded: list[dict[str, Any]], state: list[dict[str, Any]]) -> list[str]:
    real = {r["urn"]: r for r in state if r["type"] != STACK_TYPE}
    stack_urns = {r["urn"] for r in state if r["type"] == STACK_TYPE}
    mine = {r["urn"]: r for r in recorded}
    out = [f"{urn}: only in the real engine's state" for urn in sorted(set(real) - set(mine))]
    out += [f"{urn}: only in the recording" for urn in sorted(set(mine) - set(real))]
    for urn in sorted(set(real) & set(mine)):
        a, b = mine[urn], real[urn]
        if a["type"] != b["type"]:
            out.append(f"{urn}: type recorded {a['type']} real {b['type']}")
        parent = b.get("parent")
        if a["parent"] != (None if parent in stack_urns else parent) and a["parent"] != parent:
            out.append(f"{urn}: parent recorded {a['parent']} real {parent}")
        if a["provider"] != _provider_urn(b.get("provider")) and b.get("custom", True):
            out.append(f"{urn}: provider recorded {a['provider']} real {_provider_urn(b.get('provider'))}")
        if sorted(set(b.get("dependencies") or [])) != a["dependencies"]:
            out.append(f"{urn}: dependencies recorded-only {sorted(set(a['dependencies']) - set(b.get('dependencies') or []))} "
                       f"real-only {sorted(set(b.get('dependencies') or []) - set(a['dependencies']))}")
        if bool(b.get("protect")) != bool(a["protect"]):
            out.append(f"{urn}: protect recorded {a['protect']} real {b.get('protect')}")
        out += _input_differences(urn, a["type"], a["inputs"] or {}, b.get("inputs") or {})
    return out


def dependency_closure(state: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Every resource each one waits for before the engine creates it (dependencies, transitively)."""
    direct = {r["urn"]: set(r.get("dependencies") or []) for r in state}
    closure: dict[str, set[str]] = {}

    def visit(urn: str, seen: set[str]) -> set[str]:
        if urn in closure:
            return closure[urn]
        found: set[str] = set()
        for dep in direct.get(urn, ()):
            if dep in seen:
                continue
            found |= {dep} | visit(dep, seen | {dep})
        closure[urn] = found
        return found

    for urn in direct:
        visit(urn, {urn})
    return closure


def crd_owners(engine, state: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(group, kind) -> URNs of what creates that CRD: a CustomResourceDefinition resource of the
    program, or the Helm release whose chart ships it (templates: Helm's release annotations on the
    CRD; the chart's crds/ folder, which Helm installs unannotated: the chart's files as Helm keeps
    them in the release record)."""
    owners: dict[tuple[str, str], set[str]] = {}
    for resource in state:
        if resource["type"] == CRD_TYPE:
            spec = (resource.get("inputs") or {}).get("spec") or {}
            owners.setdefault((spec.get("group"), (spec.get("names") or {}).get("kind")), set()).add(resource["urn"])
    releases = {((r.get("inputs") or {}).get("namespace"), (r.get("inputs") or {}).get("name")): r["urn"]
                for r in state if r["type"] == RELEASE_TYPE}
    crds = json.loads(engine.plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
    for crd in crds:
        annotations = crd["metadata"].get("annotations") or {}
        key = (annotations.get("meta.helm.sh/release-namespace"), annotations.get("meta.helm.sh/release-name"))
        if key in releases:
            owners.setdefault((crd["spec"]["group"], crd["spec"]["names"]["kind"]), set()).add(releases[key])
    for (namespace, name), urn in releases.items():
        for crd in engine.release_chart_crds(namespace, name):
            owners.setdefault((crd["spec"]["group"], crd["spec"]["names"]["kind"]), set()).add(urn)
    return owners


def custom_resource_kinds(state: list[dict[str, Any]], owners: dict[tuple[str, str], set[str]]) -> dict[str, set[str]]:
    """Each custom resource of the program -> the URNs that create its CRD (empty: none found)."""
    found = {}
    for resource in state:
        if not resource["type"].startswith("kubernetes:") or resource["type"] in (RELEASE_TYPE,):
            continue
        token = resource["type"].split(":")[1]          # <group>/<version>
        group = token.split("/")[0]
        kind = resource["type"].split(":")[2]
        if group in BUILT_IN_GROUPS or "/" not in token or resource["type"].startswith("kubernetes:yaml") \
                or resource["type"].startswith("kubernetes:kustomize") or resource["type"].startswith("kubernetes:helm"):
            continue
        found[resource["urn"]] = owners.get((group, kind), set())
    return found
