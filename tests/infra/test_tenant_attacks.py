"""Tenant isolation from the attacker's seat: one row per attack by team A on team B.

Each row is an attack from the isolation table of the security review (and the escalation
attempts of its section 3.2) that the cluster-side controls must refuse: the attack is a
request (a Pod, a Job, a Service, an Argo CD Application, a verb on a resource) or a layout
fact, and the control is asserted on the objects the platform renders and applies:

- ValidatingAdmissionPolicies are evaluated with a CEL library (cel-python, plus Kubernetes'
  quantity functions: tests/support/kube_cel.py) the way the API server does (Kubernetes docs,
  "Validating Admission Policy"): the request matches the policy's ``matchConstraints``
  resource rules and its binding's namespace selector, then every ``matchConditions``
  expression must be true, then any ``validations`` expression that is false refuses the request. Variables: ``object``, ``namespaceObject``, ``request``.
- RBAC is evaluated per verb and resource with the RBAC rule match (``workloads.tenancy.rbac_allows``).

A control only a real cluster can confirm says so in the row's name (``..._cluster_confirms``);
docs/runbooks/tenant-isolation.md has the one-line command for each.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest

celpy = pytest.importorskip("celpy", reason="cel-python is in the dev extra (pyproject.toml)")

from components.datasets import ROOT_SQUASH
from components.training import team_directory_metadata
from infra.config import load_platform_config
from infra.gpu_capacity import team_specs
from tests.conftest import stack_config
from tests.support import kube_cel
from workloads import gitops, kueue, scheduling, tenancy
from workloads.fsx import (
    CLAIM_NAME, DATASETS_CLAIM_NAME, fsx_persistent_volume, fsx_persistent_volume_claim, team_pod_volumes,
    team_volume_mounts, team_volume_specs,
)
from workloads.trainingjob import container_security_context, pod_security_context

# -- the cluster as rendered ---------------------------------------------------------------------
CONFIG = load_platform_config(stack_config("prod"))
SPECS = {ns.namespace: (ns, queue) for ns, queue in team_specs(CONFIG)}
A, B = sorted(SPECS)[:2]  # attacker, victim
NAMESPACES = {ns: scheduling.namespace(spec) for ns, (spec, _) in SPECS.items()}
UID = {ns: int(obj["metadata"]["labels"][tenancy.POSIX_ID_LABEL]) for ns, obj in NAMESPACES.items()}
POLICIES = tenancy.admission_policies(gpu_pools=[p.name for p in CONFIG.gpu_pools])
TEAM_USER = {"username": "arn:aws:sts::444455556666:assumed-role/a-ml/alice", "groups": [tenancy.team_group(A), "system:authenticated"]}
JOB_CONTROLLER = {"username": "system:serviceaccount:kube-system:job-controller", "groups": ["system:serviceaccounts"]}
OPERATOR = {"username": "system:serviceaccount:kubeflow:training-operator", "groups": ["system:serviceaccounts"]}
ARGOCD = {"username": "system:serviceaccount:argocd:argocd-application-controller", "groups": ["system:serviceaccounts"]}
ARGOCD_NS = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd", "labels": {"kubernetes.io/metadata.name": "argocd"}}}
GITOPS = gitops.GitOpsSpec(platform="mlp-prod", repo_url="https://github.com/example/platform.git", target_revision="main",
                           rendered_path="workloads/rendered/prod", namespaces=tuple(sorted(SPECS)))
RESOURCES = {"Pod": ("", "v1", "pods"), "Job": ("batch", "v1", "jobs"), "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
             "Service": ("", "v1", "services"), "Secret": ("", "v1", "secrets"), "Application": ("argoproj.io", "v1alpha1", "applications"),
             "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
             "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets")}


def _ns_labels(namespace: dict[str, Any]) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace["metadata"]["name"], **namespace["metadata"].get("labels", {})}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] == "Exists" and expr["key"] not in labels:
            return False
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def admit(obj: dict[str, Any], namespace: dict[str, Any], user: dict[str, Any], policies=POLICIES,
          operation: str = "CREATE", old: Optional[dict[str, Any]] = None) -> list[str]:
    """The refusals the bound policies give this request ([] = admitted). ``old``: the stored
    object of an UPDATE (``oldObject``; null on CREATE, as the API server passes it)."""
    group, version, resource = RESOURCES[obj["kind"]]
    bindings = {b["spec"]["policyName"]: b for b in policies if b["kind"] == "ValidatingAdmissionPolicyBinding"}
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                  "namespaceObject": celpy.json_to_cel(namespace),
                  "request": celpy.json_to_cel({"userInfo": user, "operation": operation,
                                                "namespace": namespace["metadata"]["name"]})}
    refusals = []
    for policy in (p for p in policies if p["kind"] == "ValidatingAdmissionPolicy"):
        spec = policy["spec"]
        if not any((group in r["apiGroups"] or "*" in r["apiGroups"]) and resource in r["resources"]
                   and operation in r["operations"] for r in spec["matchConstraints"]["resourceRules"]):
            continue
        binding = bindings[policy["metadata"]["name"]]
        if not _selects(binding["spec"]["matchResources"]["namespaceSelector"], _ns_labels(namespace)):
            continue
        matched = [kube_cel.evaluate(env, c["expression"], activation) for c in spec.get("matchConditions", [])]
        if any(isinstance(m, Exception) for m in matched):  # an error in a match condition: failurePolicy Fail refuses
            refusals.append(f"{policy['metadata']['name']}: match condition error {matched}")
            continue
        if not all(matched):
            continue
        for v in spec["validations"]:
            result = kube_cel.evaluate(env, v["expression"], activation)
            if isinstance(result, Exception):  # an evaluation error: failurePolicy Fail refuses
                assert spec["failurePolicy"] == "Fail"
                refusals.append(f"{policy['metadata']['name']}: error {result}")
            elif not result:
                refusals.append(f"{policy['metadata']['name']}: {v.get('message') or v.get('messageExpression')}")
    return refusals


# -- sample objects: what the platform renders, then the attacker's change ------------------------
def pod(namespace: str = A, *, gpus: int = 0, **spec_changes: Any) -> dict[str, Any]:
    uid = UID[namespace]
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    if gpus:
        for part in resources.values():
            part["nvidia.com/gpu"] = str(gpus)
    spec = {"priorityClassName": scheduling.priority_class_name(scheduling.Priority.DEFAULT),
            "securityContext": pod_security_context(uid),
            "containers": [{"name": "main", "image": "trainer:1", "resources": resources,
                            "securityContext": container_security_context(uid), "volumeMounts": team_volume_mounts(namespace)}],
            "volumes": team_pod_volumes()}
    spec.update(spec_changes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}


def job(kind: str = "PyTorchJob", namespace: str = A, *, label: Optional[str] = kueue.LOCAL_QUEUE_NAME,
        priority: str = "training-default") -> dict[str, Any]:
    template = {"spec": {**pod(namespace)["spec"], "priorityClassName": priority}}
    labels = {kueue.QUEUE_LABEL: label} if label is not None else {}
    if kind == "Job":
        spec = {"template": template}
        api = "batch/v1"
    else:
        spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}}
        api = "kubeflow.org/v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "j", "namespace": namespace, "labels": labels}, "spec": spec}


def service(type_: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": A},
            "spec": {"type": type_, "ports": [{"port": 80}]}}


def application(name: str, project: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": name, "namespace": "argocd"},
            "spec": {"project": project, "destination": {"server": gitops.IN_CLUSTER, "namespace": namespace},
                     "source": {"repoURL": GITOPS.repo_url, "path": "x"}}}


def team_rules() -> list[dict[str, Any]]:
    return tenancy.team_role(A)["rules"]


# -- the legitimate requests pass (otherwise every refusal below would be trivially true) ----------
def test_platform_rendered_requests_are_admitted():
    assert admit(pod(), NAMESPACES[A], TEAM_USER) == []
    assert admit(pod(gpus=8), NAMESPACES[A], JOB_CONTROLLER) == []
    assert admit(pod(gpus=8), NAMESPACES[A], OPERATOR) == []
    assert admit(job(), NAMESPACES[A], TEAM_USER) == []
    assert admit(job("Job"), NAMESPACES[A], TEAM_USER) == []
    assert admit(service("ClusterIP"), NAMESPACES[A], TEAM_USER) == []
    apps = gitops.application_policy(GITOPS)
    assert admit(gitops.root_application(GITOPS), ARGOCD_NS, ARGOCD, apps) == []
    assert admit(gitops.child_application(GITOPS, A), ARGOCD_NS, ARGOCD, apps) == []


# -- the attack table ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attack:
    row: str  # the review's row (section 2 number, or "3.2 ..." for escalations)
    attack: str
    refused: Callable[[], Any]  # asserts the control refuses it


def _refused(obj: dict[str, Any], user=TEAM_USER, namespace=A, policies=POLICIES, expect: str = "") -> None:
    refusals = admit(obj, NAMESPACES.get(namespace, ARGOCD_NS), user, policies)
    assert refusals, f"admitted: {obj}"
    assert any(expect in r for r in refusals), refusals


def _root_pod():
    attack = pod()
    attack["spec"]["securityContext"] = {"runAsUser": 0, "runAsNonRoot": False}
    _refused(attack, expect="pod-identity")
    # and PSA restricted is enforced on every team namespace (runAsNonRoot, no added capabilities)
    assert all(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted" for ns in NAMESPACES.values())
    # and root on any Lustre client is squashed to nobody
    assert ROOT_SQUASH == "65534:65534"


def _as_other_team():
    # Run as team B's uid to own B's files.
    attack = pod(A)
    attack["spec"]["securityContext"] = pod_security_context(UID[B])
    attack["spec"]["containers"][0]["securityContext"] = container_security_context(UID[B])
    _refused(attack, expect="pod-identity")
    # A container-level override alone is refused too.
    attack = pod(A)
    attack["spec"]["containers"][0]["securityContext"] = container_security_context(UID[B])
    _refused(attack, expect="pod-identity")
    # A supplemental group of B's gid as well.
    attack = pod(A, securityContext={**pod_security_context(UID[A]), "supplementalGroups": [UID[B]]})
    _refused(attack, expect="pod-identity")
    assert UID[A] != UID[B]


def _fsx_subtree():
    # The attacker's volumes are its own subtree and the datasets read-only: B's directory is
    # not in A's mount namespace at all, whatever uid A runs as.
    volumes = team_volume_specs(file_system_id="fs-0123456789abcdef0", dns_name="fs.example", mount_name="abcdefgh",
                                storage_capacity_gib=1200, namespace=A)
    pvs = [fsx_persistent_volume(v) for v in volumes]
    sources = {pv["spec"]["claimRef"]["name"]: pv["spec"]["csi"]["volumeAttributes"]["mountname"] for pv in pvs}
    assert sources == {CLAIM_NAME: f"abcdefgh/checkpoints/{A}", DATASETS_CLAIM_NAME: "abcdefgh/datasets"}
    assert all(pv["spec"]["claimRef"]["namespace"] == A for pv in pvs)
    (datasets,) = [pv for pv in pvs if pv["spec"]["claimRef"]["name"] == DATASETS_CLAIM_NAME]
    assert datasets["spec"]["csi"]["readOnly"] is True and datasets["spec"]["accessModes"] == ["ReadOnlyMany"]
    # The team directory belongs to the team's uid, 0750: other uids cannot enter it.
    meta = team_directory_metadata(UID[B])
    assert meta["file-owner"] == str(UID[B]) and int(meta["file-permissions"], 8) & 0o007 == 0


def _datasets_read_only():
    claims = [fsx_persistent_volume_claim(v) for v in team_volume_specs(
        file_system_id="fs-0123456789abcdef0", dns_name="d", mount_name="m", storage_capacity_gib=1200, namespace=A)]
    (ds,) = [c for c in claims if c["metadata"]["name"] == DATASETS_CLAIM_NAME]
    assert ds["spec"]["accessModes"] == ["ReadOnlyMany"]
    mounts = {m["mountPath"]: m for m in team_volume_mounts(A)}
    assert mounts["/fsx/datasets"]["readOnly"] is True
    _root_pod()  # root would not help: refused, and squashed


def _pipelines_per_team():
    # Pipeline work directories live in the team's own subtree (its only writable volume).
    mounts = [m for m in team_volume_mounts(A) if not m.get("readOnly")]
    assert [m["mountPath"] for m in mounts] == [f"/fsx/checkpoints/{A}"]


def _bind_b_pv():
    specs = team_volume_specs(file_system_id="fs-0123456789abcdef0", dns_name="d", mount_name="m",
                              storage_capacity_gib=1200, namespace=B)
    assert all(fsx_persistent_volume(s)["spec"]["claimRef"]["namespace"] == B for s in specs)
    assert not tenancy.rbac_allows(team_rules(), verb="create", group="", resource="persistentvolumeclaims")
    assert not tenancy.rbac_allows(team_rules(), verb="create", group="", resource="persistentvolumes")


def _bypass_kueue_pod():
    # A bare pod asking for 8 H100s, created by the team itself.
    _refused(pod(gpus=8, nodeSelector={"karpenter.k8s.aws/instance-gpu-name": "h100"}), expect="gpu-pods")


def _bypass_kueue_job():
    _refused(job("Job", label=None), expect="queue-label")
    _refused(job("PyTorchJob", label=None), expect="queue-label")
    # Naming another queue (B's, or one A made up) is refused too: only the namespace's own.
    _refused(job("PyTorchJob", label="someone-elses"), expect="queue-label")
    config = kueue.manager_config()
    assert config["manageJobsWithoutQueueName"] is True
    assert config["managedJobsNamespaceSelector"]["matchExpressions"] == [
        {"key": "mlplatform.io/team", "operator": "Exists"}]


def _gpu_type_quota():
    # Every GPU pod comes from a Kueue-admitted job (above); Kueue's quota is per flavor (GPU type):
    # a team with no H100 quota has nominalQuota 0 on the h100 flavor.
    flavors = [kueue.FlavorSpec(name=n, node_labels={"pool": n}, max_gpus=64, gpus_per_node=8) for n in ("h100", "l40s")]
    cq = kueue.cluster_queue(kueue.TeamQueueSpec(team="applied", namespace=A, gpu_quota={"l40s": 8}), flavors)
    quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    assert quota["gpu-h100"]["nvidia.com/gpu"] == "0" and quota["gpu-l40s"]["nvidia.com/gpu"] == "8"
    _bypass_kueue_pod()


def _top_priority():
    entitled = NAMESPACES[A]["metadata"]["annotations"][tenancy.ALLOWED_PRIORITIES_ANNOTATION].split(",")
    above = [c for c in scheduling.all_priority_class_names() if c not in entitled]
    assert above, "the attacker team must have a class above its entitlement for this row to mean anything"
    _refused(pod(priorityClassName=above[0]), expect="pod-placement")
    _refused(job(priority=above[0]), expect="queue-label")


def _system_nodes():
    _refused(pod(tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]), expect="pod-placement")
    _refused(pod(tolerations=[{"operator": "Exists"}]), expect="pod-placement")  # tolerate everything
    _refused(pod(nodeSelector={"node.mlplatform.io/role": "system"}), expect="pod-placement")
    _refused(pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node.mlplatform.io/role", "operator": "In", "values": ["system"]}]}]}}}),
        expect="pod-placement")


def _network_policies():
    for verb in ("create", "update", "patch", "delete"):
        assert not tenancy.rbac_allows(team_rules(), verb=verb, group="networking.k8s.io", resource="networkpolicies")


def _load_balancer():
    for verb in ("create", "update", "patch"):
        assert not tenancy.rbac_allows(team_rules(), verb=verb, group="", resource="services")
    # and whoever creates it in a team namespace (Argo CD, an operator) is refused by policy
    _refused(service("LoadBalancer"), user=ARGOCD, expect="services")
    _refused(service("NodePort"), user=ARGOCD, expect="services")


def _impersonate():
    for resource in ("serviceaccounts", "users", "groups"):
        assert not tenancy.rbac_allows(team_rules(), verb="impersonate", group="", resource=resource)
    for resource in ("roles", "rolebindings"):
        assert not tenancy.rbac_allows(team_rules(), verb="create", group="rbac.authorization.k8s.io", resource=resource)
    assert not tenancy.rbac_allows(team_rules(), verb="create", group="", resource="serviceaccounts/token")


def _read_b_secret():
    # The Role is namespaced and bound in A's namespace to A's group only.
    binding = tenancy.team_role_binding(A)
    assert binding["metadata"]["namespace"] == A
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": tenancy.team_group(A)}]
    assert tenancy.team_role(A)["kind"] == "Role"  # never a ClusterRole


def _argocd_other_namespace():
    # A manifest under namespaces/team-a/ with metadata.namespace: team-b: team-a's project has no such destination.
    project = gitops.team_project(GITOPS, A)
    assert project["spec"]["destinations"] == [{"server": gitops.IN_CLUSTER, "namespace": A}]
    child = gitops.child_application(GITOPS, A)
    assert child["spec"]["project"] == project["metadata"]["name"]
    apps = gitops.application_policy(GITOPS)
    # A child Application (a file in a PR) naming the default project, B's project, or B's namespace.
    _refused(application(f"mlp-prod-{A}", "default", A), user=ARGOCD, namespace="argocd", policies=apps)
    _refused(application(f"mlp-prod-{A}", GITOPS.team_project_name(B), A), user=ARGOCD, namespace="argocd", policies=apps)
    _refused(application(f"mlp-prod-{A}", GITOPS.team_project_name(A), B), user=ARGOCD, namespace="argocd", policies=apps)
    _refused(application("sneaky", GITOPS.bootstrap_project_name, "argocd"), user=ARGOCD, namespace="argocd", policies=apps)
    # and the default project admits nothing
    default = gitops.default_project_lockdown(GITOPS)
    assert default["metadata"]["name"] == "default"
    assert default["spec"]["sourceRepos"] == [] and default["spec"]["destinations"] == []
    assert default["spec"]["namespaceResourceBlacklist"] == [{"group": "*", "kind": "*"}]


def _b_network():
    # B's ingress: default deny plus same-namespace only, in B's namespace, which A cannot edit.
    policies = scheduling.network_policies(SPECS[B][0])
    allow = [p for p in policies if p["metadata"]["name"] == "allow-same-namespace"]
    assert allow[0]["spec"]["ingress"] == [{"from": [{"podSelector": {}}]}]
    _network_policies()


def _system_ports():
    # Kueue's webhook 9443, visibility 8082, metrics 8443 from a team pod.
    from components.scheduling import kueue_namespace_spec
    from workloads.system_namespaces import network_policies as system_policies

    team_spec = SPECS[A][0]
    egress = [(peer, port) for p in scheduling.network_policies(team_spec) for rule in p["spec"].get("egress", [])
              for peer in rule["to"] for port in rule.get("ports", [])]
    to_vpc = {(port["port"], port.get("endPort", port["port"])) for peer, port in egress
              if peer.get("ipBlock", {}).get("cidr") == team_spec.vpc_cidr}
    for target in (9443, 8082, 8443):
        assert not any(low <= target <= high for low, high in to_vpc), target
    kueue_ingress = {p["metadata"]["name"]: p for p in system_policies(kueue_namespace_spec(team_spec.vpc_cidr, "172.20.0.0/16"))}
    (scrapers,) = kueue_ingress["allow-metrics-scrapers"]["spec"]["ingress"]
    assert [p["port"] for p in scrapers["ports"]] == [8443] and "ipBlock" not in scrapers["from"][0]
    _network_policies()  # and the team cannot open that egress itself


def _file_system_protocols():
    """security-4 N8: a user-space Lustre or NFS client in a team pod talks to the FSx/EFS servers
    with a uid it chooses. Team pods have no egress to the Lustre (988, 1018-1023) or NFS (2049)
    ports anywhere: the kernel clients on the node mount the file systems, outside pod policy."""
    egress = [(peer, port) for p in scheduling.network_policies(SPECS[A][0]) for rule in p["spec"].get("egress", [])
              for peer in rule["to"] for port in rule.get("ports", [])]
    assert egress, "the team has some egress (DNS, 443): otherwise the check below is empty"
    for target in (988, 1018, 1021, 1023, 2049):
        opened = [(peer, port) for peer, port in egress if port["port"] <= target <= port.get("endPort", port["port"])]
        assert not opened, (target, opened)
    _network_policies()  # and the team cannot open that egress itself


ATTACKS = [
    Attack("2", "read/overwrite/delete B's checkpoints on FSx (mount root, same uid, root)", lambda: (_fsx_subtree(), _as_other_team(), _root_pod())),
    Attack("3", "poison the shared datasets as root", _datasets_read_only),
    Attack("4", "tamper with B's pipeline intermediates", lambda: (_pipelines_per_team(), _fsx_subtree())),
    Attack("6", "bind a PVC in A to B's PV", _bind_b_pv),
    Attack("7", "create a PV or PVC of its own", _bind_b_pv),
    Attack("12", "bypass Kueue with an unlabelled Job/PyTorchJob or a bare GPU pod", lambda: (_bypass_kueue_job(), _bypass_kueue_pod())),
    Attack("12b", "run H100s with only L40S quota", _gpu_type_quota),
    Attack("13", "use the top PriorityClass", _top_priority),
    Attack("14", "read B's Secrets", _read_b_secret),
    Attack("15", "impersonate a service account (B's, or pipeline-runner)", _impersonate),
    Attack("16", "deploy into B's namespace through Argo CD", _argocd_other_namespace),
    Attack("18", "talk to B's pods / open own egress", _b_network),
    Attack("3.2 root", "root pod with default capabilities", _root_pod),
    Attack("3.2 system nodes", "schedule onto the system nodes", _system_nodes),
    Attack("3.2 egress", "edit its own NetworkPolicies", _network_policies),
    Attack("3.2 system ports", "reach Kueue/Argo CD/Argo Workflows ports from a team pod (M6)", _system_ports),
    Attack("N8", "reach FSx (Lustre) or EFS (NFS) with a user-space client from a pod", _file_system_protocols),
    Attack("3.2 LoadBalancer", "publish a pod with a LoadBalancer/NodePort Service", _load_balancer),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: f"row-{a.row}")
def test_attack_is_refused(attack: Attack):
    attack.refused()


# -- RBAC: the documented paths work with exactly the team's rights -------------------------------
SUBMIT_PATH = [  # `workloads submit` (kubectl apply of a PyTorchJob / TrainJob) and follow-up
    ("get", "kubeflow.org", "pytorchjobs"), ("create", "kubeflow.org", "pytorchjobs"), ("patch", "kubeflow.org", "pytorchjobs"),
    ("create", "trainer.kubeflow.org", "trainjobs"), ("get", "kueue.x-k8s.io", "workloads"), ("list", "kueue.x-k8s.io", "localqueues"),
    ("get", "", "pods"), ("get", "", "pods/log"), ("list", "", "events"),
]
ARGO_PATH = [  # `argo submit --from workflowtemplate/<name>`, `argo watch`, `argo logs`
    ("get", "argoproj.io", "workflowtemplates"), ("create", "argoproj.io", "workflows"), ("watch", "argoproj.io", "workflows"),
    ("list", "", "pods"), ("get", "", "pods/log"),
]


@pytest.mark.parametrize("verb,group,resource", SUBMIT_PATH + ARGO_PATH)
def test_documented_paths_are_allowed(verb, group, resource):
    assert tenancy.rbac_allows(team_rules(), verb=verb, group=group, resource=resource)


def test_the_team_role_grants_nothing_beyond_its_table():
    granted = {(g, r) for rule in team_rules() for g in rule["apiGroups"] for r in rule["resources"]}
    assert not any("*" in (g, r) for g, r in granted)
    assert all("*" not in rule["verbs"] and "impersonate" not in rule["verbs"] and "escalate" not in rule["verbs"]
               and "bind" not in rule["verbs"] for rule in team_rules())
    assert ("networking.k8s.io", "networkpolicies") not in granted


def test_breaking_a_policy_makes_its_row_fail():
    """The evaluator really evaluates: drop the uid check and the root pod is admitted."""
    broken = copy.deepcopy(POLICIES)
    for p in broken:
        if p["metadata"]["name"].endswith("pod-identity") and p["kind"] == "ValidatingAdmissionPolicy":
            p["spec"]["validations"] = [{"expression": "true", "message": "x"}]
    attack = pod()
    attack["spec"]["securityContext"] = {"runAsUser": 0}
    assert not any("pod-identity" in r for r in admit(attack, NAMESPACES[A], TEAM_USER, broken))


def test_namespace_quota_agrees_with_kueue_borrowing():
    """A team that may borrow gets a namespace GPU quota as large as what Kueue can admit (the
    cohort's GPUs); one that may not, its own GPUs. Otherwise Kueue admits a borrowing job whose
    pods the ResourceQuota refuses."""
    # Whole GPUs only: a shared pool's quota counts slices, backed by its own slice resource
    # (tests/workloads/test_gpu_sharing.py).
    whole = {p.name for p in CONFIG.gpu_pools if p.sharing.value == "none"}

    def gpus(team):
        return sum(n for pool, n in team.gpu_quota.items() if pool in whole)

    cohort = sum(gpus(t) for t in CONFIG.scheduling.teams)
    for team in CONFIG.scheduling.teams:
        quota = scheduling.resource_quota(SPECS[team.namespace][0])["spec"]["hard"]["requests.nvidia.com/gpu"]
        assert int(quota) == (cohort if team.borrowing else gpus(team))


def test_rules_only_a_cluster_confirms_are_listed_in_the_runbook_cluster_confirms():
    """Lustre subdirectory mounts, root squash on a client, the DRA import of the team directory
    and the API server's CEL: confirmed on a real cluster with the runbook's one-liners."""
    from pathlib import Path

    runbook = (Path(__file__).resolve().parents[2] / "docs/runbooks/tenant-isolation.md").read_text()
    for probe in ("kubectl auth can-i", "root squash", "ValidatingAdmissionPolicy", "mountname", "posix-id"):
        assert probe in runbook, probe


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_rendered_job_is_admitted_in_its_namespace(stack):
    """The committed GitOps tree passes the policies it will meet (Argo CD applies it)."""
    from pathlib import Path

    import yaml

    config = load_platform_config(stack_config(stack))
    namespaces = {spec.namespace: scheduling.namespace(spec) for spec, _ in team_specs(config)}
    rendered = Path(__file__).resolve().parents[2] / "workloads" / "rendered" / stack / "namespaces"
    docs = [yaml.safe_load(path.read_text()) for path in sorted(rendered.rglob("*.yaml"))]
    assert docs
    for doc in (d for d in docs if d["kind"] == "WorkflowTemplate"):
        # Argo's step pods take the workflow's pod security context: the team's uid/gid.
        uid = int(namespaces[doc["metadata"]["namespace"]]["metadata"]["labels"][tenancy.POSIX_ID_LABEL])
        context = doc["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, uid, uid)
    for doc in (d for d in docs if d["kind"] in ("PyTorchJob", "Job")):
        assert admit(doc, namespaces[doc["metadata"]["namespace"]], ARGOCD) == [], doc["metadata"]["name"]
        for replica in doc["spec"].get("pytorchReplicaSpecs", {}).values():
            pod_ = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": doc["metadata"]["namespace"]},
                    "spec": replica["template"]["spec"]}
            assert admit(pod_, namespaces[doc["metadata"]["namespace"]], OPERATOR) == []


def test_training_operator_init_container_template_passes_restricted_and_the_policies():
    """Multi-node PyTorchJob workers get the operator's init container: with upstream's template
    (no securityContext) Pod Security `restricted` refuses them; the platform's template complies
    (kubernetes-validate has no PSA: the restricted fields are asserted one by one, per the Pod
    Security Standards page) and the admission policies admit the resulting worker pod."""
    import yaml

    rendered = (tenancy.PYTORCH_INIT_CONTAINER_TEMPLATE.replace("{{.InitContainerImage}}", "alpine:3.20")
                .replace("{{.MaxTries}}", "100").replace("{{.MasterAddr}}", "j-master-0"))
    (init,) = yaml.safe_load(rendered)
    sc = init["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert "runAsUser" not in sc  # the pod's (team's) uid applies
    worker = pod(gpus=8)
    worker["spec"]["initContainers"] = [init]
    assert admit(worker, NAMESPACES[A], OPERATOR) == []


def test_compiler_caches_and_dumps_live_in_the_team_tree():
    """The image points Inductor/Triton caches at /fsx/cache (once the shared root): a cache
    another team can write is code it runs. Jobs point them into the team's own subtree."""
    from workloads.fsx import team_subtree_path
    from workloads.trainingjob import team_runtime_env

    env = {e["name"]: e["value"] for e in team_runtime_env(A)}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"):
        assert env[name].startswith(team_subtree_path(A) + "/"), name


def test_every_tenancy_object_validates_against_kubernetes_1_32():
    from tests.support.validation import validate_core

    objects = [*POLICIES, *gitops.application_policy(GITOPS), tenancy.team_role(A), tenancy.team_role_binding(A),
               *NAMESPACES.values()]
    for obj in objects:
        assert validate_core(obj) == [], (obj["kind"], obj["metadata"]["name"])
