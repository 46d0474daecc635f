"""The platform's in-cluster layer, taken from the program's own output, for a real API server.

What a stack deploys into Kubernetes comes from three places, and each is read from where the
program itself produces it, never from a copy:

- the recorded plan (``infra.plan.build_plan``): every ``kubernetes:<group>/<version>:<Kind>``
  resource's inputs are the object Pulumi would send;
- the Training Operator's kustomize Directory: the platform's overlay (``infra.vendor``) over the
  upstream ``manifests/`` tree, built with kubectl's kustomize. The tree comes from the Go module
  ``github.com/kubeflow/training-operator@v1.9.4`` and is refused unless its git tree id is the
  one ``catalog.versions`` pins (the same check ``python -m infra.vendor`` makes);
- the GitOps render (``workloads/rendered/<stack>/``), what Argo CD would sync.

CRDs come from the pinned copies in the schemas cache and, for the groups it does not carry,
from the pinned controllers' Go modules (verified by Go's checksum database).

Helm releases are not applied: their charts live in registries this machine cannot reach. What
they install is run instead as the real controller binaries (``tools.cluster.controllers``), or
named as not applied in ``Layer.skipped`` with the reason.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]

# CRDs the repository pins (tools/schemas.py, verified by SHA-256), by directory of the cache.
PINNED_CRD_DIRS = ("karpenter-1.14.1", "kueue-0.19.2", "training-operator-1.9.4", "trainer-2.3.0",
                   "argo-cd-3.5.1", "argo-workflows-4.1.2")


@dataclass(frozen=True)
class ModuleCrds:
    """CRD files inside a Go module at a pinned version (the module proxy's zip, checksummed)."""

    module: str
    version: str
    directory: str


# Groups the pinned schema copies do not carry: Kueue's Workload (its controller needs it),
# JobSet (TrainJob runs on it), the Prometheus operator's monitors (kube-prometheus-stack 88.5.3
# ships operator v0.93.1: catalog/versions.py).
MODULE_CRDS = (
    ModuleCrds("sigs.k8s.io/kueue", "v0.19.2", "config/components/crd/bases"),
    ModuleCrds("sigs.k8s.io/jobset", "v0.12.0", "config/components/crd/bases"),
    ModuleCrds("github.com/prometheus-operator/prometheus-operator", "v0.93.1", "example/prometheus-operator-crd"),
)

TRAINING_OPERATOR_MODULE = ("github.com/kubeflow/training-operator", "v1.9.4")

# Chart-installed objects that other objects of the layer need to exist: the namespace a Helm
# release would create (``create_namespace``). Everything else a chart installs is a controller
# run from its binary, or recorded as skipped.
SECRET_PLACEHOLDER = {"placeholder": "cluster-test"}


class LayerError(RuntimeError):
    pass


def go_module_dir(module: str, version: str) -> Path:
    """The module's source in Go's module cache (downloaded if absent; Go verifies its checksum)."""
    result = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                            capture_output=True, text=True, cwd=ROOT / "tools" / "cluster")
    if result.returncode != 0:
        raise LayerError(f"go mod download {module}@{version} failed: {result.stderr.strip() or result.stdout.strip()}")
    return Path(json.loads(result.stdout)["Dir"])


class _CrdLoader(yaml.SafeLoader):
    """YAML 1.1's ``=`` (the "value" type) appears as a plain enum member in some CRDs (Argo
    Workflows' operators); kubectl's YAML 1.2 parser reads it as the string "="."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_CrdLoader) if isinstance(d, dict)]


def crd_documents(schemas: Path) -> list[dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {}
    for directory in PINNED_CRD_DIRS:
        for path in sorted((schemas / "crds" / directory).glob("*.yaml")):
            for doc in _yaml_docs(path):
                if doc.get("kind") == "CustomResourceDefinition":
                    by_name[doc["metadata"]["name"]] = doc
    for source in MODULE_CRDS:
        for path in sorted((go_module_dir(source.module, source.version) / source.directory).glob("*.yaml")):
            for doc in _yaml_docs(path):
                if doc.get("kind") == "CustomResourceDefinition":
                    by_name.setdefault(doc["metadata"]["name"], doc)
    return list(by_name.values())


@dataclass
class Layer:
    stack: str
    crds: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    # (what, why) for every declared piece that is not applied.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # EKS add-ons the stack installs (their node plugins own startup taints: tools/cluster/standins.py).
    addons: list[str] = field(default_factory=list)
    # Each Helm release's values as the program sends them (release name -> values): the
    # controllers run from their binaries are configured from these (tools/cluster/controllers.py).
    helm_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Objects not applied because they call a Service (``calls_a_service``), kept so that a
    # controller run here can register them with a loopback URL instead.
    service_callers: list[dict[str, Any]] = field(default_factory=list)

    def find(self, kind: str, name: str, namespace: Optional[str] = None) -> dict[str, Any]:
        for obj in self.namespaces + self.objects:
            meta = obj.get("metadata", {})
            if obj.get("kind") == kind and meta.get("name") == name and meta.get("namespace") == namespace:
                return obj
        raise KeyError(f"{kind} {namespace}/{name} not in the {self.stack} layer")

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.namespaces + self.objects if o.get("kind") == kind]


def _object_from_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(inputs)
    if obj.get("kind") == "Secret":
        # The recording redacts secret values (a whole map, or each value); keep the keys so
        # what reads them finds them, with placeholder values.
        keys: dict[str, str] = {}
        for field_name in ("stringData", "data"):
            value = obj.pop(field_name, None)
            if isinstance(value, dict):
                keys.update({k: "cluster-test" for k in value})
            elif value is not None:
                keys.update(SECRET_PLACEHOLDER)
        if keys:
            obj["stringData"] = keys
    return obj


@dataclass
class PlanObjects:
    objects: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kustomize_dir: Optional[str] = None
    addons: list[str] = field(default_factory=list)
    helm_values: dict[str, dict[str, Any]] = field(default_factory=dict)


def plan_objects(stack: str, plan=None) -> PlanObjects:
    """The Kubernetes objects a stack's recorded plan sends, what it leaves to charts, the
    kustomize directory it builds (relative to the project root, as the program declares it) and
    the EKS add-ons it installs."""
    from infra.plan import build_plan, resource_graph

    plan = plan or build_plan(stack, ROOT)
    found = PlanObjects()
    objects, skipped = found.objects, found.skipped
    for resource in resource_graph(plan.recording, plan.config):
        kind = resource["type"]
        if kind == "aws:eks/addon:Addon":
            found.addons.append(resource["inputs"]["addonName"])
            continue
        if not kind.startswith("kubernetes:"):
            continue
        if kind == "kubernetes:helm.sh/v3:Release":
            inputs = resource["inputs"]
            found.helm_values[inputs.get("name")] = copy.deepcopy(inputs.get("values") or {})
            skipped.append((f"helm release {inputs.get('name')} ({inputs.get('chart')} {inputs.get('version')})",
                            "chart registry not reachable here; its controller runs from its binary where the "
                            "platform relies on it (docs/testing.md)"))
            continue
        if kind == "kubernetes:kustomize/v2:Directory":
            found.kustomize_dir = resource["inputs"]["directory"]
            continue
        if "apiVersion" not in resource["inputs"]:
            skipped.append((f"{kind} {resource['name']}", "not a plain object"))
            continue
        objects.append(_object_from_inputs(resource["inputs"]))
    return found


def training_operator_objects(kustomize_dir: str) -> list[dict[str, Any]]:
    """Build the platform's overlay over the verified upstream tree (seeded from the Go module)."""
    from catalog.versions import TRAINING_OPERATOR_VENDOR_DIR
    from infra import vendor

    vendored = ROOT / TRAINING_OPERATOR_VENDOR_DIR
    if not vendored.is_dir():
        source = go_module_dir(*TRAINING_OPERATOR_MODULE) / "manifests"
        shutil.copytree(source, vendored)
        for path in [vendored, *vendored.rglob("*")]:
            # The module cache is read-only; keep git's executable bit as it was.
            path.chmod(path.stat().st_mode | 0o200)
    vendor.prepare(ROOT)  # refuses the tree unless its git tree id is the pinned one
    from tools.cluster.controlplane import tool_path

    # The provider builds the directory in the program's working directory (Pulumi.yaml main).
    directory = (program_working_dir() / kustomize_dir).resolve()
    built = subprocess.run([str(tool_path("kubectl")), "kustomize", str(directory)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise LayerError(f"kubectl kustomize {kustomize_dir}: {built.stderr.strip()}")
    return [d for d in yaml.safe_load_all(built.stdout) if isinstance(d, dict)]


def calls_a_service(obj: dict[str, Any]) -> bool:
    """Objects that make kube-apiserver dial ``<service>.<namespace>.svc``: webhook configurations
    and APIServices backed by a Service. With no cluster network here the name would be resolved
    by the host's DNS, so such objects are never applied (no traffic leaves loopback)."""
    if obj.get("kind") in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        return True
    if obj.get("kind") == "CustomResourceDefinition":
        return bool(obj.get("spec", {}).get("conversion", {}).get("webhook", {}).get("clientConfig", {}).get("service"))
    return obj.get("kind") == "APIService" and bool(obj.get("spec", {}).get("service"))


def program_working_dir() -> Path:
    try:
        from infra.plan import read_project
    except ImportError:  # a tree from before the engine knew `main` (used to replay old code)
        return ROOT
    return read_project(ROOT).working_dir


def gitops_objects(stack: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "workloads" / "rendered" / stack).rglob("*.yaml")):
        docs.extend(_yaml_docs(path))
    return docs


def stack_layer(stack: str, schemas: Path, plan=None) -> Layer:
    """``plan``: the stack's recorded plan when the caller has one (``infra.plan.build_plan``)."""
    planned = plan_objects(stack, plan)
    objects, skipped = planned.objects, planned.skipped
    if planned.kustomize_dir:
        objects.extend(training_operator_objects(planned.kustomize_dir))
    objects.extend(gitops_objects(stack))
    crds = crd_documents(schemas)
    crds += [o for o in objects if o.get("kind") == "CustomResourceDefinition"]
    converted = sorted(c["metadata"]["name"] for c in crds if calls_a_service(c))
    if converted:
        raise LayerError(f"CRDs with a conversion webhook would make the API server dial a Service: {converted}")
    rest, service_callers = [], []
    for obj in objects:
        if obj.get("kind") == "CustomResourceDefinition":
            continue
        if calls_a_service(obj):
            service_callers.append(obj)
            skipped.append((f"{obj['kind']} {obj['metadata']['name']}",
                            "the API server would call a Service this control plane has no network for "
                            "(a webhook or aggregated API); its controller's webhooks are tested where the "
                            "controller runs (tools/cluster/smoke.sh wires them to loopback URLs)"))
            continue
        rest.append(obj)
    namespaces = [o for o in rest if o.get("kind") == "Namespace"]
    others = [o for o in rest if o.get("kind") != "Namespace"]
    declared = {n["metadata"]["name"] for n in namespaces}
    # Namespaces a Helm release creates (create_namespace) that plan objects live in.
    for missing in sorted({o["metadata"].get("namespace") for o in others} - declared - {None, "default", "kube-system"}):
        namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": missing}})
        skipped.append((f"namespace {missing}", "created by a Helm release (create_namespace); created bare here"))
    return Layer(stack, crds=crds, namespaces=namespaces, objects=others, skipped=skipped, addons=planned.addons,
                 helm_values=planned.helm_values, service_callers=service_callers)


def apply(plane, documents: Iterable[dict[str, Any]], what: str) -> None:
    docs = list(documents)
    if not docs:
        return
    text = yaml.safe_dump_all(docs, sort_keys=False)
    plane.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=pulumi-kubernetes",
                  "-f", "-", input=text, timeout_s=600)


def install(plane, layer: Layer) -> None:
    """CRDs (then wait until established), namespaces, then every other object."""
    apply(plane, layer.crds, "CRDs")
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all", timeout_s=90)
    apply(plane, layer.namespaces, "namespaces")
    apply(plane, layer.objects, "objects")
