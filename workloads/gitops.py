"""Argo CD objects for the app-of-apps over ``workloads/rendered/<stack>`` (pure: spec in, dict out).

Ownership (never both, see README "GitOps"):
- Pulumi owns everything cluster-scoped or tied to AWS: CRD-installing Helm releases, NodePools
  and their IAM roles, namespaces (quota, limits, network policies, Pod Identity), RBAC, and the
  two Argo CD objects below that bootstrap the rest (the AppProjects and the root Application).
- Argo CD owns what teams change often and review as rendered YAML: training jobs, pipeline
  WorkflowTemplates, and the child Applications that point at them, all namespaced.

Layout of one stack's rendered directory (written by ``python -m workloads render``)::

    <rendered_path>/apps/application-<ns>.yaml        child Applications (the root syncs this)
    <rendered_path>/namespaces/<ns>/<kind>-<name>.yaml what each child Application syncs

Checked against the Argo CD v3.5.1 CRDs (argoproj/argo-cd manifests/crds) and the declarative
setup docs (https://argo-cd.readthedocs.io/en/stable/operator-manual/declarative-setup/).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence

from workloads.problems import accepts_enum_values

ARGOCD_NAMESPACE = "argocd"
# The in-cluster destination Argo CD registers by default.
IN_CLUSTER = "https://kubernetes.default.svc"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

# Namespaced kinds Argo CD may create in team namespaces: the kinds `render` writes. Nothing
# cluster-scoped: those belong to Pulumi.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("argoproj.io", "WorkflowTemplate"),
    ("kubeflow.org", "PyTorchJob"),
    ("trainer.kubeflow.org", "TrainJob"),
)

# Argo CD directory sources apply *.yaml, *.yml and *.json; the renderer writes *.yaml only, so
# that is all Argo CD reads (and `render --check` compares all three kinds).
RENDERED_GLOB = "*.yaml"

# Kueue suspends a job on admission control and un-suspends it when admitted; self-heal would
# fight it without these (https://kueue.sigs.k8s.io/docs/tasks/run/kubeflow/pytorchjobs/).
KUEUE_MUTATED_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("kubeflow.org", "PyTorchJob", "/spec/runPolicy/suspend"),
    ("trainer.kubeflow.org", "TrainJob", "/spec/suspend"),
)


# Kueue 0.19.2 keeps its admission-time pod-template edits of a TrainJob in a runtime patch of
# its own (pkg/controller/jobs/trainjob/trainjob_webhook.go Default appends a patch with manager
# "kueue.x-k8s.io/manager"; trainjob_controller.go RunWithPodSetsInfo fills it with the flavor's
# nodeSelector and tolerations). That list entry is not in Git: without this, the live list
# differs from the desired one and self-heal would try to remove it.
KUEUE_RUNTIME_PATCH_MANAGER = "kueue.x-k8s.io/manager"
KUEUE_MUTATED_JQ: tuple[tuple[str, str, str], ...] = (
    ("trainer.kubeflow.org", "TrainJob",
     f'.spec.runtimePatches[] | select(.manager == "{KUEUE_RUNTIME_PATCH_MANAGER}")'),
)


def kueue_ignore_differences() -> list[dict[str, Any]]:
    """The child Applications' ignoreDifferences: every field Kueue changes on a job it admits.

    PyTorchJob pod templates need none: Kueue merges the flavor's nodeLabels and tolerations
    into them (pkg/podset/podset.go Merge: map keys copied, a toleration appended only when no
    equal one is there), and the renderer already sets both, so admission changes nothing
    there (tests/workloads/test_kueue_drift.py).
    """
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    for group, kind, pointer in KUEUE_MUTATED_FIELDS:
        entries.setdefault((group, kind), {"group": group, "kind": kind}).setdefault("jsonPointers", []).append(pointer)
    for group, kind, expression in KUEUE_MUTATED_JQ:
        entries.setdefault((group, kind), {"group": group, "kind": kind}).setdefault("jqPathExpressions", []).append(expression)
    return list(entries.values())


class SyncMode(str, Enum):
    AUTOMATED = "automated"
    MANUAL = "manual"


class WindowKind(str, Enum):
    ALLOW = "allow"
    DENY = "deny"


@accepts_enum_values
@dataclass(frozen=True)
class SyncWindowSpec:
    """An AppProject sync window: cron ``schedule`` (when it opens) for ``duration`` (e.g. 2h)."""

    kind: WindowKind
    schedule: str
    duration: str
    time_zone: str = "UTC"
    # Whether a person may still sync by hand while the window forbids it.
    manual_sync: bool = True


@accepts_enum_values
@dataclass(frozen=True)
class GitOpsSpec:
    """What Argo CD needs to know about one stack.

    platform: the platform name (object name prefix).
    repo_url: this repository, the only source the projects admit.
    target_revision: branch (or tag) Argo CD follows.
    rendered_path: the stack's rendered directory inside the repository.
    namespaces: team namespaces Argo CD may deploy into.
    sync_mode: automated (prune + self-heal) or manual.
    sync_windows: windows of the workloads project (prod: when syncs may happen).
    viewer_groups: team namespace -> SSO groups that see that team's Applications and pod logs
        (a ``viewer`` role of the team's project), and no other team's.
    """

    platform: str
    repo_url: str
    target_revision: str
    rendered_path: str
    namespaces: Sequence[str]
    sync_mode: SyncMode = SyncMode.MANUAL
    sync_windows: Sequence[SyncWindowSpec] = field(default_factory=tuple)
    argocd_namespace: str = ARGOCD_NAMESPACE
    viewer_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @property
    def apps_path(self) -> str:
        return f"{self.rendered_path}/apps"

    def namespace_path(self, namespace: str) -> str:
        return f"{self.rendered_path}/namespaces/{namespace}"

    @property
    def bootstrap_project_name(self) -> str:
        return f"{self.platform}-bootstrap"

    @property
    def root_application_name(self) -> str:
        return f"{self.platform}-root"

    def child_application_name(self, namespace: str) -> str:
        return f"{self.platform}-{namespace}"

    def team_project_name(self, namespace: str) -> str:
        """One AppProject per team namespace: its Applications can deploy there and nowhere else."""
        return f"{self.platform}-{namespace}"


def _labels(spec: GitOpsSpec) -> dict[str, str]:
    return {"mlplatform.io/platform": spec.platform}


def _sync_policy(spec: GitOpsSpec, *, prune_last: bool = True) -> dict[str, Any]:
    # PruneLast: deletions go after every other change of a sync has applied and is healthy.
    # Not for the jobs' Applications: a renamed (edited) TrainJob would keep running until its
    # successor is healthy, i.e. finished (workloads/gitops_jobs.py).
    policy: dict[str, Any] = {
        "syncOptions": [*(["PruneLast=true"] if prune_last else []), "RespectIgnoreDifferences=true"],
        "retry": {"limit": 5, "backoff": {"duration": "10s", "factor": 2, "maxDuration": "5m"}},
    }
    if spec.sync_mode is SyncMode.AUTOMATED:
        # allowEmpty false: an accidentally empty directory must not prune everything.
        policy["automated"] = {"enabled": True, "prune": True, "selfHeal": True, "allowEmpty": False}
    return policy


def _window(window: SyncWindowSpec) -> dict[str, Any]:
    return {
        "kind": window.kind.value,
        "schedule": window.schedule,
        "duration": window.duration,
        "timeZone": window.time_zone,
        "manualSync": window.manual_sync,
        "applications": ["*"],
    }


def bootstrap_project(spec: GitOpsSpec) -> dict[str, Any]:
    """The root Application's project: it may only create Applications in Argo CD's namespace."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": spec.bootstrap_project_name, "namespace": spec.argocd_namespace, "labels": _labels(spec)},
        "spec": {
            "description": f"{spec.platform}: the root Application and the child Applications it syncs",
            "sourceRepos": [spec.repo_url],
            "destinations": [{"server": IN_CLUSTER, "namespace": spec.argocd_namespace}],
            "clusterResourceWhitelist": [],
            "namespaceResourceWhitelist": [{"group": "argoproj.io", "kind": "Application"}],
            "orphanedResources": {"warn": True},
            "syncWindows": [_window(w) for w in spec.sync_windows],
        },
    }


def team_project(spec: GitOpsSpec, namespace: str) -> dict[str, Any]:
    """One team's workloads: this repository only, the team's namespace only, the rendered kinds
    only. A manifest under ``namespaces/team-a/`` that names ``metadata.namespace: team-b`` is
    refused by Argo CD: team-b is not a destination of team-a's project (Argo CD docs, "Projects")."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": spec.team_project_name(namespace), "namespace": spec.argocd_namespace,
                     "labels": {**_labels(spec), "mlplatform.io/namespace": namespace}},
        "spec": {
            "description": f"{spec.platform}: {namespace}'s training jobs and pipelines rendered from this repository",
            "sourceRepos": [spec.repo_url],
            "destinations": [{"server": IN_CLUSTER, "namespace": namespace}],
            # An empty whitelist admits no cluster-scoped kind at all.
            "clusterResourceWhitelist": [],
            "namespaceResourceWhitelist": [{"group": g, "kind": k} for g, k in MANAGED_KINDS],
            "orphanedResources": {"warn": True},
            "syncWindows": [_window(w) for w in spec.sync_windows],
            "roles": [viewer_role(spec, namespace)],
        },
    }


VIEWER_ROLE = "viewer"


def viewer_role(spec: GitOpsSpec, namespace: str) -> dict[str, Any]:
    """Read-only access to one team's Applications and their pods' logs (security-4 N4): the
    built-in ``role:readonly`` grants ``applications, get, */*`` and ``logs, get, */*`` (argo-cd
    assets/builtin-policy.csv), every team's. A project role's policies may only name the
    project's own Applications (``<project>/*``); ``logs`` is a project-role resource (Argo CD
    docs, "argocd proj role add-policy": ``-r logs``). No groups: nobody holds the role."""
    project = spec.team_project_name(namespace)
    subject = f"proj:{project}:{VIEWER_ROLE}"
    return {
        "name": VIEWER_ROLE,
        "description": f"{namespace}: read its Applications and pod logs",
        "policies": [f"p, {subject}, applications, get, {project}/*, allow",
                     f"p, {subject}, logs, get, {project}/*, allow"],
        "groups": list(spec.viewer_groups.get(namespace, ())),
    }


def team_projects(spec: GitOpsSpec) -> list[dict[str, Any]]:
    return [team_project(spec, ns) for ns in sorted(spec.namespaces)]


def default_project_lockdown(spec: GitOpsSpec) -> dict[str, Any]:
    """Argo CD's built-in ``default`` project admits every repository, destination and kind; an
    Application that names it would escape the team projects. Locked as the Argo CD docs
    ("Projects", "The Default Project") describe: no sources, no destinations, every kind denied."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": "default", "namespace": spec.argocd_namespace, "labels": _labels(spec)},
        "spec": {
            "description": "locked: every Application names its team's project",
            "sourceRepos": [],
            "sourceNamespaces": [],
            "destinations": [],
            "clusterResourceWhitelist": [],
            "namespaceResourceBlacklist": [{"group": "*", "kind": "*"}],
        },
    }


def application_policy(spec: GitOpsSpec) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy on Argo CD Applications: the root names the bootstrap project;
    every other Application names the project of the namespace it deploys to, and that is a team
    namespace. The root's children are files anyone may propose in a PR: Argo CD itself would let
    a child name any project (the default one included)."""
    name = f"{spec.platform}-argocd-applications"
    teams = "[" + ", ".join(f"'{ns}'" for ns in sorted(spec.namespaces)) + "]"
    rule = (f"object.metadata.name == '{spec.root_application_name}' ? "
            f"object.spec.project == '{spec.bootstrap_project_name}' : "
            f"(has(object.spec.destination.namespace) && object.spec.destination.namespace in {teams} && "
            f"object.spec.project == '{spec.platform}-' + object.spec.destination.namespace)")
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["argoproj.io"], "apiVersions": ["*"],
                                                          "resources": ["applications"], "operations": ["CREATE", "UPDATE"]}]},
                  "validations": [{"expression": rule, "reason": "Forbidden",
                                   "message": (f"an Application deploys to one team namespace with that team's project "
                                               f"({spec.platform}-<namespace>); only {spec.root_application_name} uses "
                                               f"{spec.bootstrap_project_name}")}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny", "Audit"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": spec.argocd_namespace}}}}},
    ]


def root_application(spec: GitOpsSpec) -> dict[str, Any]:
    """App of apps: syncs the child Applications under ``<rendered_path>/apps``."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": spec.root_application_name,
            "namespace": spec.argocd_namespace,
            "labels": _labels(spec),
            # Deleting the root deletes the children (and their workloads) in the foreground.
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": spec.bootstrap_project_name,
            "source": {"repoURL": spec.repo_url, "targetRevision": spec.target_revision, "path": spec.apps_path,
                       "directory": {"recurse": False, "include": RENDERED_GLOB}},
            "destination": {"server": IN_CLUSTER, "namespace": spec.argocd_namespace},
            "syncPolicy": _sync_policy(spec),
            "revisionHistoryLimit": 10,
        },
    }


def child_application(spec: GitOpsSpec, namespace: str) -> dict[str, Any]:
    """One team namespace's jobs and pipelines."""
    if namespace not in spec.namespaces:
        raise ValueError(f"namespace {namespace!r} is not one of the platform's team namespaces {sorted(spec.namespaces)}")
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": spec.child_application_name(namespace),
            "namespace": spec.argocd_namespace,
            "labels": {**_labels(spec), "mlplatform.io/namespace": namespace},
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": spec.team_project_name(namespace),
            "source": {"repoURL": spec.repo_url, "targetRevision": spec.target_revision,
                       "path": spec.namespace_path(namespace), "directory": {"recurse": False, "include": RENDERED_GLOB}},
            "destination": {"server": IN_CLUSTER, "namespace": namespace},
            "syncPolicy": _sync_policy(spec, prune_last=False),
            "ignoreDifferences": kueue_ignore_differences(),
            "revisionHistoryLimit": 10,
        },
    }


def is_managed_kind(obj: Mapping[str, Any]) -> bool:
    group = obj.get("apiVersion", "").rpartition("/")[0]
    return (group, obj.get("kind")) in MANAGED_KINDS
