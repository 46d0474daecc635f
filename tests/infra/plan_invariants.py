"""Cross-part invariants over a recorded plan (issue 33 item 3): pure functions, each returns every
problem it finds as a sentence naming the object and what is missing; an empty list is a pass.

- ``unlifted_startup_taints``: every startup taint of every NodePool is lifted by something the
  stack deploys (the CSI driver or agent that owns the key), and that lifter tolerates it.
- ``images_without_source``: every image the stack runs comes from an ECR repository the stack
  creates (and, being ours, has a build in this repository) or is a pinned public image.
- ``unmatched_monitor_selectors``: every ServiceMonitor selects, in its namespaces, a Service
  the stack installs in its mode, with the named port.
- ``roles_not_trusting_their_callers`` (over the runbook, not the plan, in
  test_plan_invariants.py): every role the workflow or a runbook has someone assume trusts them.

Objects a Helm chart or an EKS add-on installs are not in the plan (a release is one resource):
``CHART_SERVICES`` and ``TAINT_LIFTERS`` state them, each from the upstream source at the pinned
version, keyed by what the plan does record (the release's chart and version, the add-on's name).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from infra.recording import Recording, RecordedResource
from workloads.karpenter import STARTUP_TAINT_OWNERS, StartupTaintOwner

ROOT = Path(__file__).resolve().parents[2]

POD_KINDS = ("Pod", "Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "ReplicaSet")


def k8s_objects(recording: Recording, kind: Optional[str] = None) -> Iterator[tuple[RecordedResource, dict[str, Any]]]:
    for resource in recording.resources:
        if resource.type.startswith("kubernetes:") and "kind" in resource.inputs and "apiVersion" in resource.inputs:
            if kind is None or resource.inputs["kind"] == kind:
                yield resource, resource.inputs


def helm_releases(recording: Recording) -> list[RecordedResource]:
    return [r for r in recording.resources if r.type.startswith("kubernetes:helm.sh/")]


def addon_names(recording: Recording) -> set[str]:
    return {r.inputs.get("addonName") for r in recording.by_type("aws:eks/addon:Addon")}


def _chart_name(release: RecordedResource) -> str:
    return str(release.inputs.get("chart", "")).rsplit("/", 1)[-1]


def _tolerates(tolerations: list[dict[str, Any]], taint: Mapping[str, str]) -> bool:
    # k8s.io/api/core/v1 Toleration.ToleratesTaint: an empty key with Exists matches every taint;
    # an empty effect matches every effect; Exists matches any value.
    for t in tolerations:
        if t.get("operator") == "Exists" and not t.get("key"):
            if t.get("effect") in (None, "", taint["effect"]):
                return True
        if t.get("key") == taint["key"] and t.get("effect") in (None, "", taint["effect"]) and (
                t.get("operator") == "Exists" or t.get("value") == taint.get("value")):
            return True
    return False


def _pod_spec(obj: dict[str, Any]) -> Optional[dict[str, Any]]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "CronJob":
        return ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec")
    return (spec.get("template") or {}).get("spec")


# -- 1. startup taints ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TaintLifter:
    """What removes a startup taint, and how to find it in a plan."""

    what: str
    present: Callable[[Recording], bool]
    # The DaemonSet the plan records (our own agents): its tolerations are checked too. Add-on
    # node plugins tolerate every taint by their chart defaults (cited below).
    daemon_set: Optional[str] = None


def _addon(name: str) -> Callable[[Recording], bool]:
    return lambda recording: name in addon_names(recording)


def _daemon_set(name: str) -> Callable[[Recording], bool]:
    return lambda recording: any(obj["metadata"]["name"] == name for _, obj in k8s_objects(recording, "DaemonSet"))


def _lifter(owner: StartupTaintOwner) -> TaintLifter:
    if owner.addon is not None:
        return TaintLifter(f"the {owner.addon} add-on", _addon(owner.addon))
    _, name = owner.daemonset
    return TaintLifter(f"the {name} DaemonSet", _daemon_set(name), daemon_set=name)


# One table of who removes each startup taint, with its upstream source, for this plan check and
# the cluster tests' node agents alike (workloads/karpenter.py STARTUP_TAINT_OWNERS).
TAINT_LIFTERS: dict[str, TaintLifter] = {key: _lifter(owner) for key, owner in STARTUP_TAINT_OWNERS.items()}


def unlifted_startup_taints(recording: Recording) -> list[str]:
    problems: list[str] = []
    daemon_sets = {obj["metadata"]["name"]: obj for _, obj in k8s_objects(recording, "DaemonSet")}
    for _, pool in k8s_objects(recording, "NodePool"):
        name = pool["metadata"]["name"]
        for taint in pool["spec"]["template"]["spec"].get("startupTaints", []):
            lifter = TAINT_LIFTERS.get(taint["key"])
            if lifter is None:
                problems.append(f"NodePool {name}: startup taint {taint['key']} has no known lifter")
            elif not lifter.present(recording):
                problems.append(f"NodePool {name}: startup taint {taint['key']} is lifted only by {lifter.what}, "
                                "which this stack does not deploy")
            elif lifter.daemon_set and not _tolerates(_pod_spec(daemon_sets[lifter.daemon_set]).get("tolerations", []),
                                                       taint):
                problems.append(f"NodePool {name}: {lifter.what} does not tolerate {taint['key']}, so it never runs there")
            # Every taint the pool starts with must also be tolerated by the lifters of the others
            # (the readiness agent must run beside the CSI taints), checked for our DaemonSets.
            for other in pool["spec"]["template"]["spec"].get("startupTaints", []) + pool["spec"]["template"]["spec"].get("taints", []):
                if lifter and lifter.daemon_set and lifter.daemon_set in daemon_sets and not _tolerates(
                        _pod_spec(daemon_sets[lifter.daemon_set]).get("tolerations", []), other):
                    problems.append(f"NodePool {name}: {lifter.what} does not tolerate {other['key']}")
    return sorted(set(problems))


# -- 2. images -----------------------------------------------------------------------------------
# Our images: ECR repository key (infra/tracking.py image_repository_names) -> its build.
OUR_BUILDS = {"mlflow": "docker/mlflow/Dockerfile", "trainer": "trainer/Dockerfile",
              "node-health": "docker/node-health/Dockerfile"}
PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/(?P<repo>[^:@]+)")


def _container_images(obj: dict[str, Any]) -> list[str]:
    spec = _pod_spec(obj) or {}
    return [c["image"] for key in ("initContainers", "containers") for c in spec.get(key, []) if "image" in c]


def _values_images(values: Any) -> Iterator[str]:
    """Images our Helm values set explicitly (``image: "<ref>"`` or ``{repository, tag|version|digest}``)."""
    if isinstance(values, dict):
        for key, value in values.items():
            if key == "image" and isinstance(value, str) and ("/" in value or ":" in value):
                yield value
            elif key == "image" and isinstance(value, dict) and value.get("repository"):
                ref = str(value["repository"])
                if value.get("registry"):
                    ref = f"{value['registry']}/{ref}"
                pin = value.get("digest") or value.get("tag") or value.get("version")
                yield f"{ref}@{pin}" if str(pin or "").startswith("sha256:") else f"{ref}:{pin or ''}"
            else:
                yield from _values_images(value)
    elif isinstance(values, list):
        for item in values:
            yield from _values_images(item)


def stack_images(recording: Recording) -> dict[str, list[str]]:
    """image -> the objects that run it (Kubernetes pod specs, Helm values, ECS task definitions)."""
    found: dict[str, list[str]] = {}
    for resource, obj in k8s_objects(recording):
        if obj.get("kind") in POD_KINDS:
            for image in _container_images(obj):
                found.setdefault(image, []).append(resource.name)
    for release in helm_releases(recording):
        for image in _values_images(release.inputs.get("values") or {}):
            found.setdefault(image, []).append(release.name)
    for task in recording.by_type("aws:ecs/taskDefinition:TaskDefinition"):
        definitions = task.inputs.get("containerDefinitions")
        for container in json.loads(definitions) if isinstance(definitions, str) else (definitions or []):
            if isinstance(container.get("image"), str):
                found.setdefault(container["image"], []).append(task.name)
    return found


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and not last.endswith((":", ":latest"))


def images_without_source(recording: Recording, root: Path = ROOT) -> list[str]:
    repositories = {r.inputs.get("name"): r for r in recording.by_type("aws:ecr/repository:Repository")}
    policies = {r.parent for r in recording.by_type("aws:ecr/repositoryPolicy:RepositoryPolicy")}
    problems: list[str] = []
    for image, users in sorted(stack_images(recording).items()):
        where = ", ".join(sorted(set(users)))
        private = PRIVATE_ECR.match(image)
        if private:
            repo = private.group("repo")
            resource = repositories.get(repo)
            if resource is None:
                problems.append(f"{image} ({where}): no ECR repository {repo} in this stack")
                continue
            if resource.urn not in policies:
                problems.append(f"{image} ({where}): repository {repo} has no pull policy for the workload account")
            key = repo.rsplit("/", 1)[-1]
            build = OUR_BUILDS.get(key)
            if build is None or not (root / build).is_file():
                problems.append(f"{image} ({where}): repository {repo} has no build in this repository")
        elif not _pinned(image):
            problems.append(f"{image} ({where}): a public image without a pinned tag or digest")
    return problems


# -- 3. selectors --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChartService:
    namespace_of: str  # "release" (the release's namespace)
    labels: Mapping[str, str]
    ports: tuple[str, ...]


# Services charts install, by (chart, version), from each chart's templates at that version.
CHART_SERVICES: dict[tuple[str, str], list[ChartService]] = {
    # NVIDIA/dcgm-exporter chart 4.1.1 deployment/templates/service.yaml + _helpers.tpl
    # (selectorLabels app.kubernetes.io/name), port "metrics".
    ("dcgm-exporter", "4.1.1"): [ChartService("release", {"app.kubernetes.io/name": "dcgm-exporter"}, ("metrics",))],
    # NVIDIA/gpu-operator v25.3.0 assets/state-dcgm-exporter/0600_service.yaml: Service
    # nvidia-dcgm-exporter in the operator's namespace, labels app=nvidia-dcgm-exporter, port gpu-metrics.
    ("gpu-operator", "v25.3.0"): [ChartService("release", {"app": "nvidia-dcgm-exporter"}, ("gpu-metrics",))],
    # aws/karpenter-provider-aws 1.14.1 charts/karpenter/templates/service.yaml: labels from
    # karpenter.labels (app.kubernetes.io/name karpenter), port http-metrics.
    ("karpenter", "1.14.1"): [ChartService("release", {"app.kubernetes.io/name": "karpenter"}, ("http-metrics",))],
    # kubernetes-sigs/kueue chart 0.19.2 templates/manager/metrics-service (kueue.metricsService.labels).
    ("kueue", "0.19.2"): [ChartService("release", {"app.kubernetes.io/name": "kueue",
                                                    "app.kubernetes.io/component": "metrics-service"}, ("https",))],
}


def _training_operator_services() -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    # kubeflow/trainer v1.9.4 manifests/base/service.yaml (the vendored tree): Service
    # training-operator in kubeflow, labels app=training-operator, ports monitoring-port and webhook-server.
    return [("kubeflow", {"app": "training-operator"}, ("monitoring-port", "webhook-server"))]


def stack_services(recording: Recording) -> list[tuple[str, dict[str, str], tuple[str, ...], str]]:
    """(namespace, labels, port names, what installs it) of every Service the stack installs."""
    services = []
    for resource, obj in k8s_objects(recording, "Service"):
        services.append((obj["metadata"].get("namespace", "default"), dict(obj["metadata"].get("labels") or {}),
                         tuple(p.get("name", "") for p in obj.get("spec", {}).get("ports", [])), resource.name))
    for release in helm_releases(recording):
        for svc in CHART_SERVICES.get((_chart_name(release), str(release.inputs.get("version"))), []):
            services.append((release.inputs.get("namespace", "default"), dict(svc.labels), svc.ports, release.name))
    if any("training-operator" in r.name for r in recording.resources if r.type.startswith("kubernetes:kustomize")):
        for ns, labels, ports in _training_operator_services():
            services.append((ns, labels, ports, "training-operator"))
    return services


def unmatched_monitor_selectors(recording: Recording) -> list[str]:
    services = stack_services(recording)
    problems = []
    for resource, monitor in k8s_objects(recording, "ServiceMonitor"):
        selector = monitor["spec"]["selector"].get("matchLabels", {})
        namespaces = monitor["spec"].get("namespaceSelector", {}).get("matchNames") or [monitor["metadata"]["namespace"]]
        ports = [e.get("port") for e in monitor["spec"].get("endpoints", [])]
        matched = [s for s in services if s[0] in namespaces and all(s[1].get(k) == v for k, v in selector.items())]
        if not matched:
            problems.append(f"ServiceMonitor {monitor['metadata']['name']}: no Service in {namespaces} has labels "
                            f"{selector} in this stack")
        elif not any(all(p in s[2] for p in ports) for s in matched):
            problems.append(f"ServiceMonitor {monitor['metadata']['name']}: the Service(s) it selects "
                            f"({', '.join(s[3] for s in matched)}) have no port {ports}")
    return problems


def _pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod template in a manifest: a mapping with metadata.labels and spec.containers."""
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list) and isinstance(node.get("metadata"), dict):
            yield node
        for value in node.values():
            yield from _pod_templates(value)
    elif isinstance(node, list):
        for item in node:
            yield from _pod_templates(item)
    elif isinstance(node, str) and "containers:" in node and "kind:" in node:
        # An Argo Workflows resource template carries its manifest as a YAML string.
        import yaml

        try:
            yield from _pod_templates(yaml.safe_load(node))
        except yaml.YAMLError:
            return


def rendered_pod_templates(stack: str, root: Path = ROOT) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod template) of every job the stack's GitOps tree declares (workloads render)."""
    import yaml

    found = []
    for path in sorted((root / "workloads" / "rendered" / stack / "namespaces").glob("*/*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            for template in _pod_templates(document):
                found.append((path.parent.name, template))
    return found


def unmatched_pod_monitors(recording: Recording, templates: list[tuple[str, dict[str, Any]]],
                           controller_labels: frozenset[str] = frozenset({"batch.kubernetes.io/job-completion-index"})) -> list[str]:
    """Each PodMonitor's selector and port against the pod templates the stack's jobs render, in
    any team namespace (a namespace without a declared job has nothing to match yet). Labels a
    controller adds at run time (``controller_labels``) cannot be in a template: a selector using
    one is checked on its other labels, and only against templates that could carry it."""
    problems = []
    for _, monitor in k8s_objects(recording, "PodMonitor"):
        selector = monitor["spec"]["selector"].get("matchLabels", {})
        static = {k: v for k, v in selector.items() if k not in controller_labels}
        ports = [e.get("port") for e in monitor["spec"].get("podMetricsEndpoints", []) if e.get("port")]
        candidates = [t for _, t in templates if all((t["metadata"].get("labels") or {}).get(k) == v for k, v in static.items())]
        if static == selector and ports and not any(
                all(any(p.get("name") == port for c in t["spec"]["containers"] for p in c.get("ports", [])) for port in ports)
                for t in candidates) and any(True for _ in templates):
            problems.append(f"PodMonitor {monitor['metadata']['namespace']}/{monitor['metadata']['name']}: no job the stack "
                            f"renders has a pod labelled {selector} with a port named {ports}")
    return problems


# -- 4. roles ------------------------------------------------------------------------------------
ACCOUNT_KEYS = ("automation", "workload", "logging")


def assumed_account_roles(recording: Recording, ci_deploy_role: str) -> set[str]:
    """The role ARNs CI's deploy role may assume (its inline policies in the plan)."""
    role = next((r for r in recording.by_type("aws:iam/role:Role") if r.inputs.get("name") == ci_deploy_role), None)
    if role is None:
        return set()
    arns: set[str] = set()
    for policy in [*(role.inputs.get("inlinePolicies") or []),
                   *[p.inputs for p in recording.by_type("aws:iam/rolePolicy:RolePolicy")
                     if p.inputs.get("role") in {role.inputs.get("name"), role.outputs.get("id"), role.outputs.get("name")}]]:
        document = policy.get("policy")
        document = json.loads(document) if isinstance(document, str) else (document or {})
        for statement in document.get("Statement", []):
            actions = statement.get("Action", [])
            if "sts:AssumeRole" in ([actions] if isinstance(actions, str) else actions):
                resources = statement.get("Resource", [])
                arns |= set([resources] if isinstance(resources, str) else resources)
    return arns


def runbook_trust_lists(text: str) -> list[tuple[str, list[str]]]:
    """Each ``"Principal": {"AWS": [...]}`` list of the runbook with the paragraph before it."""
    found = []
    for match in re.finditer(r'"Principal":\s*\{"AWS":\s*(\[[^\]]*\]|"[^"]*")', text):
        value = match.group(1)
        principals = re.findall(r'"([^"]+)"', value)
        fence = text.rfind("```", 0, match.start())
        end = len(text[:fence].rstrip())
        paragraph = text[max(0, text.rfind("\n\n", 0, end)):end]
        found.append((paragraph, principals))
    return found


def roles_not_trusting_ci(runbook: str, stack_role_prefix: str = "mlp-<stack>") -> list[str]:
    """The account roles are made by hand (first-deploy.md step 1); CI's deploy role assumes all
    three directly (components/ci_access.py, infra/accounts.py): the runbook must have them trust it."""
    ci = f"role/{stack_role_prefix}-ci-deploy"
    lists = [(para, p) for para, p in runbook_trust_lists(runbook) if any(x.endswith(ci) for x in p)]
    if not lists:
        return [f"no trust policy in the runbook lists {ci}: CI's assume-role into the account roles is refused"]
    covered = {key for para, _ in lists for key in ACCOUNT_KEYS if key in para.lower()}
    return [f"the runbook's trust policy for the {key} role does not list {ci}" for key in ACCOUNT_KEYS
            if key not in covered]
