"""The platform's in-cluster layer, taken from the program's own output, for a real API server.

What a stack deploys into Kubernetes comes from four places, and each is read from where the
program itself produces it, never from a copy:

- the recorded plan (``infra.plan.build_plan``): every ``kubernetes:<group>/<version>:<Kind>``
  resource's inputs are the object Pulumi would send;
- its Helm releases, rendered by the real Helm from the pinned chart archives with the values the
  plan sends (tools/cluster/charts.py);
- the Training Operator's kustomize Directory: the platform's overlay (``infra.vendor``) over the
  upstream ``manifests/`` tree, built with kubectl's kustomize. The tree comes from the Go module
  ``github.com/kubeflow/training-operator@v1.9.4`` and is refused unless its git tree id is the
  one ``catalog.versions`` pins (the same check ``python -m infra.vendor`` makes);
- the GitOps render (``workloads/rendered/<stack>/``), what Argo CD would sync.

CRDs come from the releases that install them, then the pinned copies in the schemas cache, then,
for the groups neither carries, the pinned controllers' Go modules (checked by Go's checksum
database).

Webhooks, aggregated APIs and conversion webhooks are applied as declared (through their
Service: the API server runs with ``--enable-aggregator-routing``) when a container this machine
runs backs that Service on the named port; the others are set aside with the reason
(``Layer.set_aside``), since the API server would call a Service nobody serves.
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

from tools.cluster import charts
from tools.cluster.charts import yaml_documents

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


# Groups neither the releases nor the pinned copies carry: JobSet (TrainJob runs on it), the
# Prometheus operator's (kube-prometheus-stack 88.5.3 ships operator v0.93.1: catalog/versions.py),
# Kueue's Workload (where no release renders Kueue's chart).
MODULE_CRDS = (
    ModuleCrds("sigs.k8s.io/kueue", "v0.19.2", "config/components/crd/bases"),
    ModuleCrds("sigs.k8s.io/jobset", "v0.12.0", "config/components/crd/bases"),
    ModuleCrds("github.com/prometheus-operator/prometheus-operator", "v0.93.1", "example/prometheus-operator-crd"),
)

TRAINING_OPERATOR_MODULE = ("github.com/kubeflow/training-operator", "v1.9.4")
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job")

# Keys a Secret's recorded inputs hide: kept with a placeholder value, so what reads them finds them.
SECRET_PLACEHOLDER = "cluster-test"

# Helm 3's install order (pkg/releaseutil/kind_sorter.go InstallOrder): what a release applies first.
HELM_INSTALL_ORDER = (
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
    "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
    "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
)


class LayerError(RuntimeError):
    pass


def go_module_dir(module: str, version: str) -> Path:
    """The module's source in Go's module cache (downloaded if absent; Go verifies its checksum)."""
    import os
    import tempfile

    # Outside any module or workspace, so no go.mod or go.work around interferes.
    with tempfile.TemporaryDirectory(prefix="cluster-go-") as cwd:
        result = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True,
                                text=True, cwd=cwd, env={**os.environ, "GOWORK": "off"})
    if result.returncode != 0:
        raise LayerError(f"go mod download {module}@{version} failed: {result.stderr.strip() or result.stdout.strip()}")
    return Path(json.loads(result.stdout)["Dir"])


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml_documents(path.read_text()) if isinstance(d, dict)]


def crd_documents(schemas: Path) -> list[dict[str, Any]]:
    missing = [d for d in PINNED_CRD_DIRS if not (schemas / "crds" / d).is_dir()]
    if missing:
        raise LayerError(f"the pinned CRDs are not laid out in {schemas / 'crds'} (missing: {', '.join(missing)}); "
                         "run `make schemas` (python -m tools.schemas fetch) first")
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
    # Applied after the releases, in this order: the plan's objects, the Training Operator's
    # overlay, the GitOps render.
    plan_objects: list[dict[str, Any]] = field(default_factory=list)
    overlay_objects: list[dict[str, Any]] = field(default_factory=list)
    gitops_objects: list[dict[str, Any]] = field(default_factory=list)
    releases: list[charts.Release] = field(default_factory=list)
    # (what, why) for every declared piece that is not applied.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Webhooks, APIServices and conversion webhooks nothing here serves: (object, why).
    set_aside: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # EKS add-ons the stack installs: name -> configurationValues (parsed).
    addon_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each Helm release's values as the program sends them (release name -> values).
    helm_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The plan's aws:eks/accessEntry:AccessEntry inputs and managed node groups.
    access_entries: list[dict[str, Any]] = field(default_factory=list)
    access_policies: list[dict[str, Any]] = field(default_factory=list)
    node_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def addons(self) -> list[str]:
        return list(self.addon_config)

    @property
    def release_objects(self) -> list[dict[str, Any]]:
        return [o for r in self.releases for o in r.objects if o.get("kind") != "CustomResourceDefinition"]

    @property
    def objects(self) -> list[dict[str, Any]]:
        """Every object applied (CRDs and namespaces aside)."""
        return self.release_objects + self.plan_objects + self.overlay_objects + self.gitops_objects

    def find(self, kind: str, name: str, namespace: Optional[str] = None) -> dict[str, Any]:
        for obj in self.namespaces + self.objects:
            meta = obj.get("metadata", {})
            if obj.get("kind") == kind and meta.get("name") == name and meta.get("namespace") == namespace:
                return obj
        raise KeyError(f"{kind} {namespace}/{name} not in the {self.stack} layer")

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.namespaces + self.objects if o.get("kind") == kind]

    def release(self, name: str) -> charts.Release:
        for release in self.releases:
            if release.name == name:
                return release
        raise KeyError(f"release {name} not rendered in the {self.stack} layer")


def _object_from_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(inputs)
    if obj.get("kind") == "Secret":
        # The recording redacts secret values (a whole map, or each value); keep the keys so
        # what reads them finds them, with placeholder values.
        keys: dict[str, str] = {}
        for field_name in ("stringData", "data"):
            value = obj.pop(field_name, None)
            if isinstance(value, dict):
                keys.update({k: SECRET_PLACEHOLDER for k in value})
            elif value is not None:
                keys["placeholder"] = SECRET_PLACEHOLDER
        if keys:
            obj["stringData"] = keys
    return obj


@dataclass
class PlanObjects:
    objects: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kustomize_dir: Optional[str] = None
    addon_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    releases: list[dict[str, Any]] = field(default_factory=list)
    access_entries: list[dict[str, Any]] = field(default_factory=list)
    access_policies: list[dict[str, Any]] = field(default_factory=list)
    node_groups: list[dict[str, Any]] = field(default_factory=list)


def plan_objects(stack: str, plan=None) -> PlanObjects:
    """The Kubernetes objects a stack's recorded plan sends, its Helm releases' inputs, the
    kustomize directory it builds (relative to the project root, as the program declares it), the
    EKS add-ons it installs, its access entries and managed node groups."""
    from infra.plan import build_plan, resource_graph

    plan = plan or build_plan(stack, ROOT)
    found = PlanObjects()
    for resource in resource_graph(plan.recording, plan.config):
        kind, inputs = resource["type"], resource["inputs"]
        if kind == "aws:eks/addon:Addon":
            raw = inputs.get("configurationValues")
            found.addon_config[inputs["addonName"]] = json.loads(raw) if isinstance(raw, str) and raw else {}
        elif kind == "aws:eks/accessEntry:AccessEntry":
            found.access_entries.append(copy.deepcopy(inputs))
        elif kind == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation":
            found.access_policies.append(copy.deepcopy(inputs))
        elif kind == "aws:eks/nodeGroup:NodeGroup":
            found.node_groups.append({"name": resource["name"], "inputs": copy.deepcopy(inputs)})
        elif not kind.startswith("kubernetes:"):
            continue
        elif kind == "kubernetes:helm.sh/v3:Release":
            found.releases.append(copy.deepcopy(inputs))
        elif kind == "kubernetes:kustomize/v2:Directory":
            found.kustomize_dir = inputs["directory"]
        elif "apiVersion" not in inputs:
            found.skipped.append((f"{kind} {resource['name']}", "not a plain object"))
        else:
            found.objects.append(_object_from_inputs(inputs))
    return found


def seed_training_operator_tree() -> None:
    """The Training Operator's upstream tree, where the program's entry point (``infra.vendor``)
    looks for it, copied from the Go module instead of fetched (no egress here), then the overlay;
    ``vendor.prepare`` refuses the tree unless its git tree id is the pinned one."""
    from catalog.versions import TRAINING_OPERATOR_VENDOR_DIR
    from infra import vendor

    import fcntl

    vendored = ROOT / TRAINING_OPERATOR_VENDOR_DIR
    vendored.parent.mkdir(parents=True, exist_ok=True)
    # Several test processes (each stack's cluster, the engine tests) seed it at once on a fresh
    # clone: one at a time, and the tree appears whole or not at all.
    with open(vendored.parent / ".seed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not vendored.is_dir():
            source = go_module_dir(*TRAINING_OPERATOR_MODULE) / "manifests"
            partial = vendored.with_name(vendored.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
            for path in [partial, *partial.rglob("*")]:
                # The module cache is read-only; keep git's executable bit as it was.
                path.chmod(path.stat().st_mode | 0o200)
            partial.rename(vendored)
        vendor.prepare(ROOT)  # refuses the tree unless its git tree id is the pinned one


def training_operator_objects(kustomize_dir: str) -> list[dict[str, Any]]:
    """Build the platform's overlay over the verified upstream tree (seeded from the Go module)."""
    from infra.plan import read_project
    from tools.cluster.paths import tool_path

    seed_training_operator_tree()
    # The provider builds the directory in the program's working directory (Pulumi.yaml main).
    directory = (read_project(ROOT).working_dir / kustomize_dir).resolve()
    built = subprocess.run([str(tool_path("kubectl")), "kustomize", str(directory)], capture_output=True, text=True)
    if built.returncode != 0:
        raise LayerError(f"kubectl kustomize {kustomize_dir}: {built.stderr.strip()}")
    return [d for d in yaml.safe_load_all(built.stdout) if isinstance(d, dict)]


def gitops_objects(stack: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "workloads" / "rendered" / stack).rglob("*.yaml")):
        docs.extend(_yaml_docs(path))
    return docs


# -- what calls a Service, and whether anything here answers ----------------------------------------

def service_calls(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(what, clientConfig.service or APIService.spec.service) for each call the API server makes
    for ``obj``: admission webhooks, an aggregated API, a CRD's conversion webhook."""
    kind = obj.get("kind")
    if kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        return [(f"webhook {w['name']}", w["clientConfig"].get("service") or {"url": w["clientConfig"].get("url")})
                for w in obj.get("webhooks") or []]
    if kind == "APIService" and obj.get("spec", {}).get("service"):
        return [(f"APIService {obj['metadata']['name']}", obj["spec"]["service"])]
    if kind == "CustomResourceDefinition":
        webhook = obj.get("spec", {}).get("conversion", {}).get("webhook") or {}
        service = (webhook.get("clientConfig") or {}).get("service")
        if service:
            return [(f"conversion of {obj['metadata']['name']}", service)]
    return []


def calls_a_service(obj: dict[str, Any]) -> bool:
    return bool(service_calls(obj))


def image_repository(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name.rsplit(":", 1)[0]
    return name.removeprefix("docker.io/")


def _selected(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def serving_container(service_ref: dict[str, Any], objects: list[dict[str, Any]],
                      runnable: Iterable[str]) -> tuple[Optional[str], str]:
    """(the image that answers, "") when a workload of ``objects`` backs the Service on the
    called port with a container whose image this machine runs; else (None, why not)."""
    if "url" in service_ref:
        return None, f"a URL ({service_ref['url']}), outside the cluster"
    namespace, name = service_ref.get("namespace"), service_ref.get("name")
    port = int(service_ref.get("port") or 443)
    service = next((o for o in objects if o.get("kind") == "Service" and o["metadata"]["name"] == name
                    and o["metadata"].get("namespace") == namespace), None)
    if service is None:
        return None, f"Service {namespace}/{name} is not in the layer"
    spec_port = next((p for p in service["spec"].get("ports", []) if int(p["port"]) == port), None)
    if spec_port is None:
        return None, f"Service {namespace}/{name} has no port {port}"
    target = spec_port.get("targetPort", port)
    selector = service["spec"].get("selector") or {}
    runnable = set(runnable)
    images = []
    for workload in objects:
        if workload.get("kind") not in WORKLOAD_KINDS or workload["metadata"].get("namespace") != namespace:
            continue
        template = workload["spec"].get("template", {})
        if not _selected(selector, (template.get("metadata") or {}).get("labels") or {}):
            continue
        for container in template.get("spec", {}).get("containers", []):
            ports = container.get("ports", [])
            listens = any(p.get("name") == target or p.get("containerPort") == target for p in ports) \
                or isinstance(target, int)
            if not listens:
                continue
            images.append(container.get("image", ""))
            if image_repository(container.get("image", "")) in runnable:
                return container["image"], ""
    if not images:
        return None, f"no workload of the layer backs Service {namespace}/{name} (selector {selector}) on {target}"
    return None, (f"Service {namespace}/{name} is backed by {', '.join(sorted(set(images)))}, whose controller is "
                  "not built here")


def set_aside(layer: Layer, runnable: Iterable[str]) -> None:
    """Move each object that makes the API server call a Service nobody here serves out of the
    layer (into ``layer.set_aside``, with the reason); the rest are applied as declared."""
    runnable = set(runnable)
    everything = layer.objects

    def unserved(obj: dict[str, Any]) -> list[str]:
        reasons = []
        for what, ref in service_calls(obj):
            image, why = serving_container(ref, everything, runnable)
            if image is None:
                reasons.append(f"{what}: {why}")
        return reasons

    for release in layer.releases:
        keep = []
        for obj in release.objects:
            reasons = unserved(obj)
            if reasons:
                layer.set_aside.append((obj, f"release {release.name}: " + "; ".join(reasons)))
            else:
                keep.append(obj)
        release.objects = keep
    for attribute in ("plan_objects", "overlay_objects", "gitops_objects"):
        keep = []
        for obj in getattr(layer, attribute):
            reasons = unserved(obj)
            if reasons:
                layer.set_aside.append((obj, "; ".join(reasons)))
            else:
                keep.append(obj)
        setattr(layer, attribute, keep)
    crds = []
    for crd in layer.crds:
        reasons = unserved(crd)
        if reasons:
            # The pinned copy without its conversion webhook: storage and reads in one version work.
            crd = copy.deepcopy(crd)
            crd["spec"]["conversion"] = {"strategy": "None"}
            layer.skipped.append((f"conversion webhook of CRD {crd['metadata']['name']}", "; ".join(reasons)))
        crds.append(crd)
    layer.crds = crds


def stack_layer(stack: str, schemas: Path, plan=None, runnable: Optional[Iterable[str]] = None) -> Layer:
    """``plan``: the stack's recorded plan when the caller has one (``infra.plan.build_plan``);
    ``runnable``: the image repositories whose controllers run here (tools/cluster/nodes.py)."""
    from tools.cluster.nodes import runnable_images

    planned = plan_objects(stack, plan)
    layer = Layer(stack, skipped=list(planned.skipped), addon_config=planned.addon_config,
                  access_entries=planned.access_entries, access_policies=planned.access_policies,
                  node_groups=planned.node_groups)
    crds = {c["metadata"]["name"]: c for c in crd_documents(schemas)}
    api_versions = _api_versions(crds.values())
    for inputs in planned.releases:
        layer.helm_values[inputs.get("name")] = copy.deepcopy(inputs.get("values") or {})
        release = charts.Release.from_inputs(inputs)
        try:
            charts.render(release, api_versions)
        except charts.ChartError as exc:
            layer.skipped.append((f"helm release {release.name} ({inputs.get('chart')} {release.version})", str(exc)))
            continue
        for crd in (o for o in release.objects if o.get("kind") == "CustomResourceDefinition"):
            crds[crd["metadata"]["name"]] = crd  # what the release installs wins over a pinned copy
        release.objects.sort(key=_install_rank)
        layer.releases.append(release)
        for hook in release.hooks:
            layer.skipped.append((f"{hook['kind']} {hook['metadata']['name']} (release {release.name})",
                                  f"a Helm hook ({hook['metadata']['annotations'][charts.HOOK_ANNOTATION]}): "
                                  "run by Helm at install time, not part of the release's manifest"))
    layer.crds = list(crds.values())
    layer.plan_objects = [o for o in planned.objects if o.get("kind") != "CustomResourceDefinition"]
    layer.crds += [o for o in planned.objects if o.get("kind") == "CustomResourceDefinition"]
    if planned.kustomize_dir:
        layer.overlay_objects = training_operator_objects(planned.kustomize_dir)
    layer.gitops_objects = gitops_objects(stack)
    set_aside(layer, runnable if runnable is not None else runnable_images())
    _split_namespaces(layer)
    return layer


def _api_versions(crds: Iterable[dict[str, Any]]) -> list[str]:
    versions = []
    for crd in crds:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            versions += [f"{group}/{version['name']}", f"{group}/{version['name']}/{kind}"]
    return versions


def _install_rank(obj: dict[str, Any]) -> int:
    kind = obj.get("kind")
    return HELM_INSTALL_ORDER.index(kind) if kind in HELM_INSTALL_ORDER else len(HELM_INSTALL_ORDER)


def _split_namespaces(layer: Layer) -> None:
    everything = layer.release_objects + layer.plan_objects + layer.overlay_objects + layer.gitops_objects
    declared = {o["metadata"]["name"]: o for o in everything if o.get("kind") == "Namespace"}
    for attribute in ("plan_objects", "overlay_objects", "gitops_objects"):
        setattr(layer, attribute, [o for o in getattr(layer, attribute) if o.get("kind") != "Namespace"])
    for release in layer.releases:
        release.objects = [o for o in release.objects if o.get("kind") != "Namespace"]
    namespaces = list(declared.values())
    # Namespaces a Helm release creates (create_namespace, or the chart's own release namespace).
    wanted = {o["metadata"].get("namespace") for o in everything if o.get("kind") != "Namespace"}
    wanted |= {r.namespace for r in layer.releases}
    for missing in sorted(wanted - set(declared) - {None, "default", "kube-system"}):
        namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": missing}})
        layer.skipped.append((f"namespace {missing}", "created by a Helm release (create_namespace); created bare here"))
    layer.namespaces = namespaces


def apply(plane, documents: Iterable[dict[str, Any]], manager: str = "pulumi-kubernetes", timeout_s: float = 600) -> None:
    docs = list(documents)
    if not docs:
        return
    plane.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={manager}",
                  "-f", "-", input=yaml.safe_dump_all(docs, sort_keys=False), timeout_s=timeout_s)
