"""Argo Workflows: pinned Helm release in its own namespace (Pod Security labels), controller and
server on the system nodes, and the `pipeline-runner` service account + Role in every team
namespace so a pipeline may create and watch its PyTorchJob.

Values keys follow the argo-workflows chart's values.yaml (argoproj/argo-helm
charts/argo-workflows): `images.tag`, `crds.install/keep`, `controller.workflowNamespaces`,
`controller.replicas/pdb/nodeSelector/tolerations`, `server.*`, and `workflow.serviceAccount` /
`workflow.rbac` (a Role and RoleBinding per workflow namespace, plus `workflow.rbac.rules`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects
from workloads.problems import Problem, raise_if_any
from components.charts import ChartSource
from catalog.versions import ARGO_WORKFLOWS, ARGO_WORKFLOWS_APP_VERSION
from workloads.placement import system_node_selector, system_tolerations
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

NAMESPACE = "argo-workflows"
SERVICE_ACCOUNT = "pipeline-runner"
# argo-workflows chart: server port 2746, controller metrics 9090, controller health 6060.
SERVER_PORT = 2746
METRICS_PORT = 9090
HEALTH_PORT = 6060


def namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    # Controller and server run non-root, read-only, no privilege escalation, all capabilities
    # dropped, RuntimeDefault seccomp (helm_values sets it): `restricted` admits them. Workflow
    # pods run in the team namespaces, under those namespaces' policies.
    return SystemNamespaceSpec(
        name=NAMESPACE, pod_security=PodSecurityLevel.RESTRICTED, vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        probe_ports=(SERVER_PORT, HEALTH_PORT), metrics_ports=(METRICS_PORT,),
    )

# What the train step's resource template does with its PyTorchJob (kubectl apply + watch), and
# the evaluate step's output parameter needs nothing beyond the chart's executor rules.
PIPELINE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
     "verbs": ["get", "list", "watch", "create", "patch"]},
)


@dataclass(frozen=True)
class ArgoWorkflowsArgs:
    """Argo Workflows for the training pipelines.

    cluster: the platform cluster (its static nodes run the controller and server).
    namespaces: team namespaces whose workflows this controller runs (they must exist).
    namespace_resources: those namespaces' Namespace objects: the chart creates the
        ``pipeline-runner`` ServiceAccount, Role and RoleBinding in each (templates/controller/workflow-sa.yaml).
    ha: two controllers (leader election) and two servers, each with a PDB.
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    namespaces: Sequence[str]
    ha: bool = False
    namespace_resources: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    charts: ChartSource = ChartSource()


def args_problems(args: ArgoWorkflowsArgs) -> list[Problem]:
    if not args.namespaces:
        return [Problem("namespaces", [], "no namespace would run pipelines", "configure scheduling.teams")]
    return []


def helm_values(args: ArgoWorkflowsArgs) -> dict[str, Any]:
    placement = {"nodeSelector": system_node_selector(), "tolerations": system_tolerations()}
    replicas = 2 if args.ha else 1
    pdb = {"enabled": True, "minAvailable": 1} if args.ha else {"enabled": False}
    security = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        # The chart's appVersion is not trusted blindly: the image tag is the version we validated.
        "images": {"tag": ARGO_WORKFLOWS_APP_VERSION},
        # The chart's default `crds.full: true` installs the CRDs from a pre-install hook Job that
        # downloads them from raw.githubusercontent.com (templates/crds-install-job.yaml); the
        # namespace's NetworkPolicies deny that egress and the hook pod tolerates no system node,
        # so the atomic release would roll back. `full: false` renders the chart's own minimal
        # CRDs (templates/crds.yaml, files/crds/minimal): no Job, no download.
        "crds": {"install": True, "keep": True, "full": False},
        "singleNamespace": False,
        "controller": {"workflowNamespaces": sorted(args.namespaces), "replicas": replicas, "pdb": pdb,
                       "securityContext": security, **placement},
        # `client` auth: the UI/API acts with the caller's own Kubernetes token (no shared identity).
        "server": {"replicas": replicas, "pdb": pdb, "authModes": ["client"], "securityContext": security,
                   **placement},
        # The executor's init/wait containers run in team namespaces, which enforce Pod Security
        # `restricted`: they need these set explicitly (the chart's default is {}). No runAsUser:
        # they take the workflow's pod-level uid, the team's (workloads.tenancy).
        "executor": {"securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                         "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                                         "seccompProfile": {"type": "RuntimeDefault"}}},
        "workflow": {
            "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
            "rbac": {"create": True, "rules": [dict(r) for r in PIPELINE_RULES]},
        },
    }


class ArgoWorkflows(pulumi.ComponentResource):
    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: ArgoWorkflowsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        raise_if_any(f"ArgoWorkflows {name}", args_problems(args))
        super().__init__("mlplatform:argo_workflows:ArgoWorkflows", name, None, opts)
        cluster = args.cluster
        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)
        self.release = helm_addon(
            f"{name}-chart", parent=self, cluster=cluster, release="argo-workflows", chart=ARGO_WORKFLOWS,
            source=args.charts, namespace=NAMESPACE, values=helm_values(args),
            skip_crds=False, depends_on=[self.namespace, *self.network_policies, *args.namespace_resources.values()],
        )
        self.register_outputs({"release_status": self.release.status, "namespaces": sorted(args.namespaces)})
