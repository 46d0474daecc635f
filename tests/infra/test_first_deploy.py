"""Issue 20 (deploy correctness 3): each first-`up` finding, tested from its upstream rule.

Every test quotes the upstream source it encodes; the constants under test are the project's,
the rule is upstream's.
"""
from __future__ import annotations

import io
import ipaddress
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from components.argo_workflows import ArgoWorkflowsArgs, helm_values
from components.training import operator_kustomization
from catalog.versions import (
    TRAINING_OPERATOR_INIT_CONTAINER_IMAGE, TRAINING_OPERATOR_OVERLAY_DIR, TRAINING_OPERATOR_VENDOR_DIR,
)
from infra import vendor
from workloads.placement import SYSTEM_NODE_TAINT, system_node_selector


def _argo_values() -> dict:
    return helm_values(ArgoWorkflowsArgs(cluster=None, namespaces=["team-a"]))  # type: ignore[arg-type]


# -- N2: Argo Workflows CRDs without a download -------------------------------------------------
def test_argo_workflows_crds_are_rendered_by_helm_not_downloaded_by_a_hook_job():
    """argoproj/argo-helm charts/argo-workflows (1.0.18, the 1.x values the component follows):

    templates/crds-install-job.yaml: ``{{- if and .Values.crds.install .Values.crds.full }}`` ...
    ``"helm.sh/hook": pre-install,pre-upgrade`` (a Job that downloads the full CRDs from
    raw.githubusercontent.com; argoproj/argo-workflows#16621: "That fails in air-gapped clusters").
    templates/crds.yaml: ``{{- if and .Values.crds.install (not .Values.crds.full) }}`` ranges over
    ``files/crds/minimal/*.yaml``. values.yaml: ``full: true`` is the default.
    """
    crds = _argo_values()["crds"]
    install, full = crds["install"], crds.get("full", True)  # the chart's default when unset
    download_job_rendered = install and full
    minimal_crds_rendered = install and not full
    assert not download_job_rendered
    assert minimal_crds_rendered
    assert crds["keep"] is True  # helm.sh/resource-policy: keep on the minimal CRDs


# -- N3 / N11 / issue 23 item 4: the Training Operator from a verified local overlay ---------------


# kubeflow/trainer@v1.9.4 manifests/base/deployment.yaml, the fields the patch meets (no
# nodeSelector, no tolerations, no args) and upstream's standalone overlay (namespace kubeflow).
UPSTREAM_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: training-operator
  labels:
    control-plane: kubeflow-training-operator
spec:
  selector:
    matchLabels:
      control-plane: kubeflow-training-operator
  replicas: 1
  template:
    metadata:
      labels:
        control-plane: kubeflow-training-operator
    spec:
      containers:
        - command:
            - /manager
          image: ghcr.io/kubeflow/training-v1/training-operator
          name: training-operator
      serviceAccountName: training-operator
"""
UPSTREAM_STANDALONE = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: kubeflow
resources:
  - deployment.yaml
images:
  - name: ghcr.io/kubeflow/training-v1/training-operator
    newTag: v1-93c5489
"""


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' rule (k8s.io/api core/v1 toleration.go ToleratesTaint): the effect matches
    or is empty, the key matches (or is empty with Exists), and Exists ignores the value."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("key", "") not in ("", taint["key"]):
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value") == taint["value"]:
            return True
    return False


def _kustomize_build(overlay: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(overlay)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _operator_overlay(tmp_path):
    """The platform's overlay (kustomization + init-container template) over a copy of upstream's
    standalone manifests, laid out as infra.vendor lays them out."""
    from components.training import INIT_CONTAINER_TEMPLATE, INIT_CONTAINER_TEMPLATE_FILE, NETWORK_POLICY_FILE, network_policy_yaml

    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "deployment.yaml").write_text(UPSTREAM_DEPLOYMENT)
    (upstream / "kustomization.yaml").write_text(UPSTREAM_STANDALONE)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(operator_kustomization("../upstream")))
    (overlay / INIT_CONTAINER_TEMPLATE_FILE).write_text(INIT_CONTAINER_TEMPLATE)
    (overlay / NETWORK_POLICY_FILE).write_text(network_policy_yaml())
    return overlay


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (its built-in kustomize)")
def test_the_operator_is_built_placed_on_the_tainted_system_nodes_with_the_pinned_init_image(tmp_path):
    """Built by kustomize itself (kubectl kustomize) over upstream's Deployment:

    kubeflow/trainer@v1.9.4 manifests/base/deployment.yaml has no nodeSelector and no tolerations,
    and the static nodes carry CriticalAddonsOnly=true:NoSchedule, so the unpatched pod waits for a
    Karpenter node (audit N3). cmd/training-operator.v1/main.go: ``flag.StringVar(&config.Config.
    PyTorchInitContainerImage, "pytorch-init-container-image", config.PyTorchInitContainerImageDefault``
    with pkg/config/config.go ``PyTorchInitContainerImageDefault = "alpine:3.10"`` (Docker Hub).
    """
    (deployment,) = [o for o in _kustomize_build(_operator_overlay(tmp_path)) if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert _tolerates(pod["tolerations"], SYSTEM_NODE_TAINT)
    assert pod["nodeSelector"] == system_node_selector()
    (container,) = pod["containers"]
    assert container["command"] == ["/manager"]  # upstream's entry point kept, flags appended
    assert container["image"] == "ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489"
    (flag,) = [a for a in container["args"] if a.startswith("--pytorch-init-container-image=")]
    image = flag.split("=", 1)[1]
    assert image == TRAINING_OPERATOR_INIT_CONTAINER_IMAGE
    assert "@sha256:" in image and len(image.split("@sha256:")[1]) == 64
    assert not image.startswith(("alpine", "docker.io")) and image.split("/")[0].endswith(
        ("public.ecr.aws", ".amazonaws.com")), "mirrored in ECR or ECR Public, not Docker Hub"


@pytest.mark.skipif(shutil.which("kubectl") is None or not (vendor.ROOT / TRAINING_OPERATOR_VENDOR_DIR).is_dir(),
                    reason="needs kubectl and the vendored tree (python -m infra.vendor)")
def test_the_real_vendored_overlay_builds():
    overlay = vendor.prepare()
    built = _kustomize_build(overlay)
    kinds = {d["kind"] for d in built}
    assert {"CustomResourceDefinition", "Deployment", "ValidatingWebhookConfiguration"} <= kinds
    # Under the CNI's strict enforcement the operator's pod needs a policy: the overlay brings one
    # for every pod of its namespace.
    [deployment] = [d for d in built if d["kind"] == "Deployment"]
    policies = [d for d in built if d["kind"] == "NetworkPolicy"]
    assert any(p["metadata"]["namespace"] == deployment["metadata"]["namespace"] and p["spec"]["podSelector"] == {}
               for p in policies), policies


def test_the_directory_builds_the_local_overlay_after_the_system_nodes_and_coredns(plan):
    """pulumi/pulumi-kubernetes#3036: kustomize v2 Directory children are real resources with
    await logic; apps/v1 Deployment: "If the Deployment has not reached a Ready state after 10
    minutes, it will time out". Remote targets are cloned with the `git` binary (#3036, "Remote
    Targets"): the directory is local, so no git and no movable tag at deploy time."""
    (directory,) = plan.recording.by_type("kubernetes:kustomize/v2:Directory")
    # Relative to the folder the provider runs in (Pulumi.yaml `main`), where vendor writes it.
    assert (vendor.ROOT / "infra" / directory.inputs["directory"]).resolve() == (vendor.ROOT / TRAINING_OPERATOR_OVERLAY_DIR).resolve()
    assert "://" not in directory.inputs["directory"] and "?ref=" not in directory.inputs["directory"]
    node_group = plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    coredns = [r for r in plan.recording.by_type("aws:eks/addon:Addon") if r.inputs.get("addonName") == "coredns"]
    assert node_group.urn in directory.dependencies and coredns[0].urn in directory.dependencies
    # placed at build time: no separate patch racing the Deployment's readiness
    assert plan.recording.by_type("kubernetes:apps/v1:DeploymentPatch") == []


# git's own content addressing is the pin: the tree id must be what `git write-tree` computes.
def _git_tree_of(folder: Path) -> str:
    env = {"GIT_DIR": str(folder / ".git-tmp"), "GIT_WORK_TREE": str(folder), "PATH": "/usr/bin:/bin",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(folder)}
    subprocess.run(["git", "init", "-q"], env=env, check=True)
    subprocess.run(["git", "add", "-A", "--", ":!.git-tmp"], env=env, check=True)
    tree = subprocess.run(["git", "write-tree"], env=env, check=True, capture_output=True, text=True).stdout.strip()
    shutil.rmtree(folder / ".git-tmp")
    return tree


def _sample_tree(root: Path) -> Path:
    (root / "overlays" / "standalone").mkdir(parents=True)
    (root / "overlays" / "standalone" / "kustomization.yaml").write_text("resources: [../../base]\n")
    (root / "base").mkdir()
    (root / "base" / "deployment.yaml").write_text(UPSTREAM_DEPLOYMENT)
    (root / "hack.sh").write_text("#!/bin/sh\n")
    (root / "hack.sh").chmod(0o755)
    (root / "base-x").write_text("sorts after base/ as git does\n")
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_tree_id_is_gits(tmp_path):
    tree = _sample_tree(tmp_path / "manifests")
    assert vendor.tree_id(tree) == _git_tree_of(tree)


def _archive_of(tree: Path, top: str = "trainer-abc") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(tree, arcname=f"{top}/manifests")
        tar.add(tree / "base" / "deployment.yaml", arcname=f"{top}/README-outside-manifests")
    return buffer.getvalue()


def test_a_fetched_tree_is_kept_only_when_its_git_tree_id_is_the_pinned_one(tmp_path):
    tree = _sample_tree(tmp_path / "src" / "manifests")
    pinned = vendor.VendoredTree(archive_url="https://example.invalid/a.tar.gz", subdir="manifests",
                                 tree_id=vendor.tree_id(tree), dest="build/vendor/x/manifests")
    archive = _archive_of(tree)
    root = tmp_path / "project"
    dest = vendor.ensure(pinned, root, download=lambda url: archive)
    assert vendor.tree_id(dest) == pinned.tree_id and not (dest.parent / "README-outside-manifests").exists()
    # already there and intact: nothing fetched
    assert vendor.ensure(pinned, root, download=lambda url: pytest.fail("fetched again")) == dest
    # edited on disk: refused, with the fix
    (dest / "base" / "deployment.yaml").write_text("tampered\n")
    with pytest.raises(vendor.VendorError, match=r"pinned .*FIX: delete build/vendor/x/manifests"):
        vendor.ensure(pinned, root, download=lambda url: archive)


def test_a_tampered_archive_is_refused_and_nothing_is_left_behind(tmp_path):
    tree = _sample_tree(tmp_path / "src" / "manifests")
    pinned = vendor.VendoredTree(archive_url="https://example.invalid/a.tar.gz", subdir="manifests",
                                 tree_id=vendor.tree_id(tree), dest="build/vendor/x/manifests")
    (tree / "base" / "deployment.yaml").write_text(UPSTREAM_DEPLOYMENT.replace("/manager", "/evil"))
    root = tmp_path / "project"
    with pytest.raises(vendor.VendorError, match="refusing it"):
        vendor.ensure(pinned, root, download=lambda url: _archive_of(tree))
    assert not (root / pinned.dest).exists()
    with pytest.raises(vendor.VendorError, match="cannot download .*FIX: run `python -m infra.vendor`"):
        vendor.ensure(pinned, root, download=lambda url: (_ for _ in ()).throw(OSError("no route to host")))


# -- N4: workflow pods in team namespaces reach the API server's Service address ---------------------


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        # LabelSelectorRequirement: In/NotIn compare the value, Exists/DoesNotExist only the key.
        key, operator, values = expr["key"], expr["operator"], expr.get("values", [])
        assert operator in ("Exists", "DoesNotExist", "In", "NotIn"), f"operator {operator} not modelled"
        if operator in ("Exists", "DoesNotExist") and (key in labels) != (operator == "Exists"):
            return False
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def _egress_allowed(policies: list[dict], pod_labels: dict, ip: str, port: int) -> bool:
    """Kubernetes NetworkPolicy semantics (networking.k8s.io/v1): egress is allowed when some
    policy selecting the pod has an egress rule whose peer and port match; an ipBlock peer is the
    only peer that can match a selectorless Service's ClusterIP on the AWS agent
    (pkg/resolvers/endpoints.go: "The current version is limited to tracking the services where the
    service.spec.Selector matches the pod selector in the egress rules")."""
    for policy in policies:
        spec = policy["spec"]
        if not _selects(spec["podSelector"], pod_labels) or "Egress" not in spec.get("policyTypes", []):
            continue
        for rule in spec.get("egress", []):
            peers = [p for p in rule.get("to", []) if "ipBlock" in p]
            hit = any(ipaddress.ip_address(ip) in ipaddress.ip_network(p["ipBlock"]["cidr"]) for p in peers)
            ports = rule.get("ports")
            if hit and (not ports or any(p.get("port") == port and p.get("protocol", "TCP") == "TCP" for p in ports)):
                return True
    return False


def test_workflow_pods_reach_the_kubernetes_service_address_and_nothing_else_opens(plan):
    """From the pod's seat in a team namespace (the policies the plan applies there).

    aws/amazon-network-policy-controller-k8s pkg/resolvers/endpoints.go: "the network agent ...
    attaches the ebpf probes to the TC hook of the pod veth interface and thus unable to see the
    pod IP after the DNAT happens for the clusterIPs"; the `kubernetes` Service has no selector,
    so the VPC CIDR rule never matches 172.20.0.1. Argo's executor and resource steps call it.
    """
    from components.cluster import ClusterArgs

    service_ip = str(ipaddress.ip_network(ClusterArgs.service_ipv4_cidr)[1])  # first address: the kubernetes Service
    team_ns = plan.config.scheduling.teams[0].namespace
    policies = [r.inputs for r in plan.recording.resources
                if r.inputs.get("kind") == "NetworkPolicy" and r.inputs.get("metadata", {}).get("namespace") == team_ns]
    workflow_pod = {"workflows.argoproj.io/workflow": "train-gpt2-x7k2p", "workflows.argoproj.io/completed": "false"}
    trainer_pod = {"training.kubeflow.org/job-name": "gpt2", "training.kubeflow.org/replica-type": "worker"}
    assert _egress_allowed(policies, workflow_pod, service_ip, 443)
    assert not _egress_allowed(policies, trainer_pod, service_ip, 443)
    assert not _egress_allowed(policies, workflow_pod, service_ip, 80)
    other_cluster_ip = str(ipaddress.ip_network(ClusterArgs.service_ipv4_cidr)[10])
    assert not _egress_allowed(policies, workflow_pod, other_cluster_ip, 443)


# -- N9: every namespaced object depends on its namespace ---------------------------------------------
def _namespaces_used(resource) -> set[str]:
    inputs = resource.inputs
    used = {(inputs.get("metadata") or {}).get("namespace"), inputs.get("namespace")}
    # argo-workflows chart templates/controller/workflow-sa.yaml: `{{- range
    # $namespace := .Values.controller.workflowNamespaces }}` creates the ServiceAccount, Role
    # and RoleBinding in each of those namespaces.
    controller = (inputs.get("values") or {}).get("controller") or {}
    used.update(controller.get("workflowNamespaces") or [])
    return {n for n in used if n}


def test_every_namespaced_object_depends_on_the_namespace_the_stack_creates(plan):
    """Kubernetes' NamespaceLifecycle admission plugin refuses an object in a namespace that does
    not exist (`namespaces "x" not found`); pulumi-kubernetes retries creates for a while, which
    only masks a missing `depends_on` (audit N9: team Secrets, FSx claims, the Argo Workflows
    release creating RBAC in team namespaces)."""
    recording = plan.recording
    namespaces = {r.inputs["metadata"]["name"]: r for r in recording.by_type("kubernetes:core/v1:Namespace")}
    assert namespaces, "the plan creates namespaces"
    missing = []
    for resource in recording.resources:
        if not resource.type.startswith("kubernetes:") or resource.is_provider or resource.type == "kubernetes:core/v1:Namespace":
            continue
        for ns in _namespaces_used(resource) & namespaces.keys():
            if not recording.depends_on(resource, namespaces[ns]):
                missing.append(f"{resource.name} -> {ns}")
    assert missing == []


# -- N5: every name fits its service's limit for the longest names the config accepts ---------------
# AWS limits, from each service's API reference / quota page (not the project's constants).
NAME_LIMITS = {
    "aws:iam/role:Role": ("name", 64),                      # IAM quotas: role name 64
    "aws:iam/policy:Policy": ("name", 128),                 # IAM quotas: policy name 128
    "aws:iam/instanceProfile:InstanceProfile": ("name", 128),
    "aws:iam/rolePolicy:RolePolicy": ("name", 128),         # inline policy name 128
    "aws:cloudwatch/eventRule:EventRule": ("name", 64),     # EventBridge PutRule Name 1-64
    "aws:lb/loadBalancer:LoadBalancer": ("name", 32),       # ELBv2 CreateLoadBalancer Name <= 32
    "aws:lb/targetGroup:TargetGroup": ("name", 32),         # ELBv2 CreateTargetGroup Name <= 32
    "aws:lambda/function:Function": ("name", 64),           # Lambda FunctionName 64
    "aws:sqs/queue:Queue": ("name", 80),                    # SQS queue name 80
    "aws:rds/cluster:Cluster": ("clusterIdentifier", 63),   # RDS DBClusterIdentifier 1-63
    "aws:rds/clusterInstance:ClusterInstance": ("identifier", 63),
    "aws:s3/bucket:Bucket": ("bucket", 63),                 # S3 bucket naming rules: 3-63
    "aws:s3/bucketV2:BucketV2": ("bucket", 63),
    "aws:eks/nodeGroup:NodeGroup": ("nodeGroupName", 63),   # EKS CreateNodegroup 1-63
    "aws:eks/cluster:Cluster": ("name", 100),               # EKS CreateCluster name 1-100
    "aws:budgets/budget:Budget": ("name", 100),             # Budgets BudgetName 1-100
    "aws:cloudtrail/trail:Trail": ("name", 128),            # CloudTrail trail name 3-128
    "aws:serverlessrepository/cloudFormationStack:CloudFormationStack": ("name", 128),  # CFN stack name 128
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", 128),  # EC2 LaunchTemplateName 3-128
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("name", 255),
    "aws:ec2/securityGroup:SecurityGroup": ("name", 255),
    "kubernetes:core/v1:Namespace": (None, 63),             # RFC 1123 label
}


def _longest_accepted(raw_for, lengths=range(3, 80)) -> int:
    from infra.config import ConfigError, load_platform_config

    accepted = []
    for n in lengths:
        try:
            load_platform_config(raw_for(n))
        except ConfigError:
            continue
        accepted.append(n)
    assert accepted, "no length accepted"
    return max(accepted)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_name_fits_for_the_longest_platform_and_team_names_the_config_accepts(stack, plan_config):
    """pulumi/pulumi sdk/go/common/resource/resource_id.go refuses an autoname that cannot fit:
    "name '%s' plus %d random chars is longer than maximum length %d" (7 random chars after a
    "-"); pulumi-aws provider/resources.go: ``"name": tfbridge.AutoName("name", 32, "-")`` for
    ``aws_lb_target_group``. Audit N5: a platform name over 8 characters overflowed the
    EventRule autoname, over 9 the ALB, over 10 the target group."""
    from tests.conftest import stack_config

    def with_name(n: int) -> dict:
        raw = stack_config(stack)
        raw["name"] = ("m" + "x" * 80)[:n]
        return raw

    name_len = _longest_accepted(with_name)

    def with_team(n: int) -> dict:
        raw = with_name(name_len)
        renamed = {}
        for i, team in enumerate(raw["scheduling"]["teams"]):
            renamed[team["name"]] = (f"t{i}" + "y" * 80)[:n]
            team["name"] = renamed[team["name"]]
        # Config that names teams elsewhere follows the rename (Argo CD's per-team SSO groups).
        groups = raw.get("gitops", {}).get("sso", {}).get("teamGroups")
        if groups:
            raw["gitops"]["sso"]["teamGroups"] = {renamed.get(t, t): g for t, g in groups.items()}
        return raw

    team_len = _longest_accepted(with_team)
    plan = plan_config(stack, with_team(team_len))
    too_long = []
    for resource in plan.recording.resources:
        if resource.type not in NAME_LIMITS:
            continue
        field, limit = NAME_LIMITS[resource.type]
        explicit = (resource.inputs.get("metadata", {}).get("name") if field is None else resource.inputs.get(field))
        length = len(explicit) if isinstance(explicit, str) else len(resource.name) + 8  # Pulumi's autoname
        if length > limit:
            too_long.append(f"{resource.type} {resource.name}: {length} > {limit}")
    assert name_len >= 20 and team_len >= 20, "the probe found the config's real maxima"
    assert too_long == []


def test_a_fitted_name_is_stable_distinct_and_within_the_limit():
    from components.names import fitted_name

    assert fitted_name("mlp-dev-mlflow-int-alb", 32) is None  # autonaming kept: no rename of a live stack
    a = fitted_name("a" * 24 + "-mlflow-int-alb", 32)
    b = fitted_name("a" * 24 + "-mlflow-ext-alb", 32)
    assert a is not None and b is not None and a != b and len(a) <= 32 and len(b) <= 32
    assert a == fitted_name("a" * 24 + "-mlflow-int-alb", 32) and not a.endswith("-")


# -- N6: the Argo CD secrets that must exist before the first `up` ------------------------------------
def test_a_missing_argocd_secret_is_one_clear_problem_before_any_child(monkeypatch):
    """Secrets Manager GetSecretValue on a missing secret answers ResourceNotFoundException
    ("Secrets Manager can't find the specified secret."); the read happens at preview (audit N6),
    so it must name the secret, its JSON keys and the command that creates it, for every missing
    secret at once, before the component registers any child."""
    import pulumi

    from infra.config import PROJECT
    from infra.plan.mock_engine import RecordingMocks, run_recorded
    from infra.program import main
    from tests.conftest import stack_config, to_values

    import grpc

    class NotFound(grpc.RpcError):
        """What the engine answers when the provider's read fails (a gRPC status with details)."""

        def code(self):
            return grpc.StatusCode.UNKNOWN

        def details(self):
            return ("reading Secrets Manager Secret Version: operation error Secrets Manager: GetSecretValue, "
                    "ResourceNotFoundException: Secrets Manager can't find the specified secret.")

    real_call = RecordingMocks.call

    def call(self, args):
        if args.token == "aws:secretsmanager/getSecretVersion:getSecretVersion":
            raise NotFound()
        return real_call(self, args)

    monkeypatch.setattr(RecordingMocks, "call", call)
    from workloads.problems import InvalidInputError

    with pytest.raises(InvalidInputError) as info:
        run_recorded(main, project=PROJECT, stack="prod", config=to_values(stack_config("prod")))
    message = str(info.value)
    assert "mlp-prod/argocd/repo-credentials" in message and "mlp-prod/argocd/oidc" in message
    assert "ResourceNotFoundException" in message and "aws secretsmanager create-secret --name mlp-prod/argocd/oidc" in message
    assert '"clientSecret"' in message and '"username"' in message
    assert "Traceback" not in message


def test_the_plan_lists_each_prerequisite_secret_with_its_keys(prod_plan):
    prerequisite = [w for w in prod_plan.warnings if "must exist before the first `up`" in w]
    assert any("mlp-prod/argocd/repo-credentials" in w and "username/password" in w for w in prerequisite)
    assert any("mlp-prod/argocd/oidc" in w and "clientSecret" in w for w in prerequisite)


# -- N10: the offline plan names and ARNs things as the real engine and services do -----------------


def test_urns_carry_the_parents_whole_qualified_type_as_the_engine_builds_them():
    """pulumi/pulumi pkg/resource/deploy/source_eval.go (generateURN): "Skip empty parents and
    don't use the root stack type; otherwise, use the full qualified type." and
    sdk/go/common/resource/urn NewURN: ``typ = string(parentType) + URNTypeDelimiter + typ``."""
    import pulumi

    from infra.plan.mock_engine import run_recorded

    def program():
        outer = pulumi.ComponentResource("mlplatform:test:Outer", "outer")
        inner = pulumi.ComponentResource("mlplatform:test:Inner", "outer-inner", None, pulumi.ResourceOptions(parent=outer))
        pulumi.ComponentResource("mlplatform:test:Leaf", "outer-inner-leaf", None, pulumi.ResourceOptions(parent=inner))

    urns = sorted(r.urn for r in run_recorded(program, project="p", stack="s").resources)
    assert urns == [
        "urn:pulumi:s::p::mlplatform:test:Outer$mlplatform:test:Inner$mlplatform:test:Leaf::outer-inner-leaf",
        "urn:pulumi:s::p::mlplatform:test:Outer$mlplatform:test:Inner::outer-inner",
        "urn:pulumi:s::p::mlplatform:test:Outer::outer",
    ]


def test_the_eks_cluster_child_is_named_as_pulumi_eks_names_it(plan):
    """pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts (v4.3.0, unchanged since): ``const eksCluster
    = new aws.eks.Cluster(`${name}-eksCluster`, { name: args.name, ... }, { parent: parent })``,
    ``name`` being the component's name (the physical cluster name is ``args.name``)."""
    component = plan.recording.one("eks:index:Cluster")
    child = plan.recording.one("aws:eks/cluster:Cluster")
    assert child.name == f"{component.name}-eksCluster"
    assert child.urn == component.urn.replace("::" + component.name, "") + "$aws:eks/cluster:Cluster::" + child.name
    assert child.inputs["name"] == component.inputs["name"] != child.name


def test_the_eks_cluster_child_gets_the_service_cidr_as_pulumi_eks_sends_it(plan):
    """cluster.ts: ``if (args.kubernetesServiceIpAddressRange || args.ipFamily) { kubernetesNetworkConfig
    = ... ({ serviceIpv4Cidr: ipFamily === "ipv4" ? serviceIpv4Cidr : undefined, ipFamily }) }``: the
    aws.eks.Cluster child has no kubernetesServiceIpAddressRange input (aws:eks/cluster:Cluster schema)."""
    component = plan.recording.one("eks:index:Cluster")
    child = plan.recording.one("aws:eks/cluster:Cluster")
    assert "kubernetesServiceIpAddressRange" not in child.inputs
    assert child.inputs["kubernetesNetworkConfig"] == {
        "serviceIpv4Cidr": component.inputs["kubernetesServiceIpAddressRange"], "ipFamily": "ipv4"}


# Service Authorization Reference, "Resource types defined by ..." (ARN formats).
ARN_PATTERNS = {
    # Secrets Manager User Guide: the ARN ends with the name, "-" and six random characters.
    "aws:secretsmanager/secret:Secret": r"arn:aws:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}",
    "aws:cloudwatch/eventRule:EventRule": r"arn:aws:events:[a-z0-9-]+:\d{12}:rule/[\w.-]+",
    "aws:lb/targetGroup:TargetGroup": r"arn:aws:elasticloadbalancing:[a-z0-9-]+:\d{12}:targetgroup/[\w-]{1,32}/[0-9a-f]{16}",
    "aws:lb/loadBalancer:LoadBalancer": r"arn:aws:elasticloadbalancing:[a-z0-9-]+:\d{12}:loadbalancer/app/[\w-]{1,32}/[0-9a-f]{16}",
    "aws:iam/role:Role": r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]{1,64}",
    "aws:kms/key:Key": r"arn:aws:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}",
    "aws:sqs/queue:Queue": r"arn:aws:sqs:[a-z0-9-]+:\d{12}:[\w-]{1,80}",
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": r"arn:aws:eks:[a-z0-9-]+:\d{12}:podidentityassociation/[\w-]+/a-\w+",
    "aws:ec2/securityGroup:SecurityGroup": r"arn:aws:ec2:[a-z0-9-]+:\d{12}:security-group/sg-[0-9a-f]+",
}


def test_fabricated_arns_follow_each_services_format(plan):
    wrong = []
    seen = set()
    for resource in plan.recording.resources:
        pattern = ARN_PATTERNS.get(resource.type)
        if pattern is None or not resource.custom:
            continue
        seen.add(resource.type)
        arn = (resource.outputs or {}).get("arn")
        if not isinstance(arn, str) or not re.fullmatch(pattern, arn):
            wrong.append(f"{resource.type} {resource.name}: {arn}")
    assert wrong == []
    assert {"aws:secretsmanager/secret:Secret", "aws:cloudwatch/eventRule:EventRule", "aws:iam/role:Role"} <= seen


# -- N8: the password rotation only after the server's user exists -------------------------------------
def test_rotation_is_created_after_the_service_that_creates_the_user_and_never_without_it(dev_plan, plan_config):
    """AWS RotateSecret (quoted in getmoto/moto#7342): "if you don't immediately rotate the
    secret, Secrets Manager tests the rotation configuration by running the testSecret step";
    testSecret logs in as the user, which only a task's db-bootstrap creates."""
    from tests.conftest import stack_config

    rotation = dev_plan.recording.one("aws:secretsmanager/secretRotation:SecretRotation")
    service = dev_plan.recording.one("aws:ecs/service:Service")
    assert dev_plan.recording.depends_on(rotation, service)
    assert service.inputs["waitForSteadyState"] is True  # healthy tasks: the bootstrap exited 0
    raw = stack_config("dev")
    raw["tracking"].pop("image")
    first_deploy = plan_config("dev", raw)
    assert first_deploy.recording.by_type("aws:ecs/service:Service") == []
    assert first_deploy.recording.by_type("aws:secretsmanager/secretRotation:SecretRotation") == []


# -- item 9: pins no primary source confirms are plan warnings with their check -----------------------
def test_each_unconfirmed_pin_the_plan_deploys_is_a_warning_with_its_confirming_command(plan):
    """Audit 3, "What I could not verify": the FSx CSI build for 1.32, Aurora PostgreSQL 16.6;
    section 2: the pod identity agent and EBS CSI builds rest on fixtures, not AWS documents."""
    from catalog.versions import AURORA_POSTGRESQL_VERSION, EKS_ADDON_VERSIONS

    pins = [w for w in plan.warnings if w.startswith("unconfirmed pin:")]
    region = plan.config.region
    for addon in ("aws-fsx-csi-driver", "eks-pod-identity-agent", "aws-ebs-csi-driver", "aws-mountpoint-s3-csi-driver",
                  "aws-efs-csi-driver"):
        deployed = [r for r in plan.recording.by_type("aws:eks/addon:Addon") if r.inputs.get("addonName") == addon]
        listed = [w for w in pins if f"--addon-name {addon}" in w]
        assert bool(listed) == bool(deployed)
        if deployed:
            assert EKS_ADDON_VERSIONS[addon] in listed[0] and f"--region {region}" in listed[0]
            assert f"--kubernetes-version {plan.config.cluster.version}" in listed[0]
    if plan.recording.by_type("aws:rds/cluster:Cluster"):
        assert any(f"describe-db-engine-versions --region {region} --engine aurora-postgresql "
                   f"--engine-version {AURORA_POSTGRESQL_VERSION}" in w for w in pins)


# -- item 10: strings that reach AWS, Git or a path are checked where they are read ----------------------
REVISIONS = ["main", "v1.4.0", "release/2026-11", "feature/a.b", "main..x", "feature branch", "-rf", "release/",
             "v1.0.lock", "", "a//b", ".hidden", "x/.y", "a@{1}", "ends.", "tab\there", "q?", "x~1", "a:b",
             "0123456789abcdef0123456789abcdef01234567"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("revision", REVISIONS)
def test_a_target_revision_is_refused_exactly_when_git_refuses_the_name(revision):
    """git Documentation/git-check-ref-format.txt: the rules for branch and tag names, as the
    binary applies them (`git check-ref-format --branch`); a full commit id is also accepted."""
    from infra.config.syntax import git_ref_problem

    git_accepts = subprocess.run(["git", "check-ref-format", "--branch", revision], capture_output=True).returncode == 0
    assert (git_ref_problem(revision) is None) == git_accepts
    # rule 9, "They cannot be the single character @" (`--branch` expands "@" to HEAD instead)
    assert git_ref_problem("@") is not None


BAD_VALUES = [
    ("gitops", "targetRevision", "main..x"),
    ("gitops", "renderedPath", "../../etc"),
    ("gitops", "domain", "argocd..example.com"),
    ("gitops", "repoUrl", "https://github.com/org/repo/../other.git"),
    ("gitops.repoCredentials", "secretsManagerSecretId", "bad secret id!"),
    ("tracking", "route53ZoneId", "not-a-zone"),
    ("tracking", "image", "NOT A REF"),
    ("datasets.fsx.dataRepositoryAssociations.0", "prefix", "imagenet/../../checkpoints/"),
]


def test_each_malformed_value_is_refused_at_once_naming_field_value_and_fix():
    """All problems at once (the loader's contract), each with its path and a fix, never a traceback."""
    import copy

    from tests.conftest import problems_of, stack_config

    raw = copy.deepcopy(stack_config("prod"))
    expected = {}
    for section, key, value in BAD_VALUES:
        node = raw
        for part in section.split("."):
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[key] = value
        path = section.replace(".0", "[0]") + "." + key
        expected[path] = value
    problems = problems_of(raw)
    assert set(expected) <= set(problems), sorted(problems)
    for path, value in expected.items():
        (problem,) = problems[path]
        assert problem.value == value and problem.fix, (path, problem)


def test_the_stack_files_pass_the_syntax_checks():
    from infra.config import load_platform_config
    from tests.conftest import stack_config

    for stack in ("dev", "prod"):
        load_platform_config(stack_config(stack))


# -- issue 23 item 4: the operator's init container, hardened and scanned with the job's pods ------------
def test_the_operator_init_container_passes_pod_security_restricted_and_pins_its_image():
    """Pod Security Standards, "restricted" (kubernetes.io/docs/concepts/security/pod-security-standards):
    allowPrivilegeEscalation false; runAsNonRoot true; capabilities drop ["ALL"]; seccompProfile
    RuntimeDefault or Localhost. The template keeps upstream's command, resources and fields
    (pkg/controller.v1/pytorch/initcontainer.go initContainerTemplate)."""
    from components.training import operator_init_containers

    (container,) = operator_init_containers("gpt2-master-0")
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
    # No uid of its own: the worker pod's (the team's) runAsUser applies, as the team admission
    # policy requires of every container (tests/infra/test_tenant_attacks.py).
    assert "runAsUser" not in sc
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    assert container["name"] == "init-pytorch" and "@sha256:" in container["image"]
    assert "nslookup gpt2-master-0" in container["command"][2] and "seq 100" in container["command"][2]
    assert container["resources"] == {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (its built-in kustomize)")
def test_the_template_is_mounted_where_the_operator_reads_it(tmp_path):
    """pkg/config/config.go: ``PyTorchInitContainerTemplateFileDefault = "/etc/config/initContainer.yaml"``."""
    from components.training import INIT_CONTAINER_TEMPLATE, INIT_CONTAINER_TEMPLATE_FILE, NETWORK_POLICY_FILE, network_policy_yaml

    objects = _kustomize_build(_operator_overlay(tmp_path))
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert config_map["metadata"]["namespace"] == deployment["metadata"]["namespace"] == "kubeflow"
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert f"{mount['mountPath']}/{INIT_CONTAINER_TEMPLATE_FILE}" == "/etc/config/initContainer.yaml"
    assert config_map["data"][INIT_CONTAINER_TEMPLATE_FILE] == INIT_CONTAINER_TEMPLATE


def test_the_scan_sees_the_init_container_the_operator_adds_to_workers():
    """initcontainer.go setInitContainer: only when a Master is specified, only for Worker pods."""
    from infra.plan.security_scan import pod_templates, with_operator_init_containers

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "gpt2", "namespace": "team-a"},
           "spec": {"pytorchReplicaSpecs": {
               "Master": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "t@sha256:" + "a" * 64}]}}},
               "Worker": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "t@sha256:" + "a" * 64}]}}}}}}
    seen = {path: with_operator_init_containers(job, path, t) for path, t in pod_templates(job)}
    worker = seen["spec.pytorchReplicaSpecs.Worker.template"]["spec"]
    master = seen["spec.pytorchReplicaSpecs.Master.template"]["spec"]
    assert [c["name"] for c in worker["initContainers"]] == ["init-pytorch"] and "initContainers" not in master
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    alone = dict(pod_templates(job))["spec.pytorchReplicaSpecs.Worker.template"]
    assert "initContainers" not in with_operator_init_containers(job, "spec.pytorchReplicaSpecs.Worker.template", alone)["spec"]


def test_a_read_only_preview_reads_no_secret_and_still_runs_the_program(monkeypatch):
    """aws-readiness-4 R5. The attack: a PR preview runs as <name>-ci-reader-<account>, whose
    inline policy denies secretsmanager:GetSecretValue (components/ci_access.py
    READER_DENIED_ACTIONS), so Secrets Manager answers AccessDeniedException to every read. What
    refuses the failure: in read-only mode Argo CD's secrets are placeholders and are never read
    (the in-cluster Secrets are excluded from that preview anyway)."""
    from infra.ci import READ_ONLY_ENV
    from infra.config import PROJECT
    from infra.plan.mock_engine import RecordingMocks, run_recorded
    from infra.program import main
    from tests.conftest import stack_config, to_values

    import grpc

    class Denied(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNKNOWN

        def details(self):
            return ("reading Secrets Manager Secret Version: operation error Secrets Manager: GetSecretValue, "
                    "AccessDeniedException: ... with an explicit deny in an identity-based policy")

    reads: list[str] = []
    real_call = RecordingMocks.call

    def call(self, args):
        if args.token == "aws:secretsmanager/getSecretVersion:getSecretVersion":
            reads.append(args.args.get("secretId"))
            raise Denied()
        return real_call(self, args)

    monkeypatch.setattr(RecordingMocks, "call", call)
    monkeypatch.setenv(READ_ONLY_ENV, "1")
    recording = run_recorded(main, project=PROJECT, stack="dev", config=to_values(stack_config("dev")))
    assert reads == []
    assert any(r.name == "mlp-dev-argocd-repo-creds" for r in recording.resources)
    # Without read-only mode the same denial is the clear error of audit N6 (the read happens).
    monkeypatch.delenv(READ_ONLY_ENV)
    from workloads.problems import InvalidInputError

    with pytest.raises(InvalidInputError, match="AccessDeniedException"):
        run_recorded(main, project=PROJECT, stack="dev", config=to_values(stack_config("dev")))
    assert reads == ["mlp-dev/argocd/repo-credentials"]


def test_the_reader_roles_may_generate_passwords(dev_plan):
    """The program invokes secretsmanager GetRandomPassword at preview (tracking, training);
    the reader roles are granted it explicitly rather than relying on ReadOnlyAccess."""
    import json

    policies = [json.loads(r.inputs["policy"]) for r in dev_plan.recording.by_type("aws:iam/rolePolicy:RolePolicy")
                if r.name.endswith("-random-password")]
    readers = [r for r in dev_plan.recording.by_type("aws:iam/role:Role") if "-ci-reader-" in str(r.inputs.get("name"))]
    assert readers and len(policies) == len(readers)
    assert all(p["Statement"] == [{"Sid": "GenerateOnly", "Effect": "Allow", "Action": ["secretsmanager:GetRandomPassword"],
                                   "Resource": "*"}] for p in policies)
