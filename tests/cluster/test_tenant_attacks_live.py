"""Team A against team B and the platform, refused by the real API server.

Each stack's layer is installed from the program's own output; the attacker holds a kubeconfig
with the identity the plan's EKS access entry gives a member of team A (user + the entry's
``kubernetesGroups``: tests/cluster/identities.py), so a drift between the entries and the team
RoleBindings shows up as a refused control. A stack that gives its teams no access entry (dev: no
``roleArns``) is attacked with the group the team's RoleBinding names, the identity an entry
would need; ``test_each_team_access_entry_carries_exactly_its_namespaces_group`` checks the
mapping where entries exist. Every attack has a control: the same request made legitimately is
admitted, so a refusal is about the attacked property and not a broken fixture.

What refuses is asserted too: RBAC answers ``Forbidden: User ... cannot``; an admission policy
answers ``ValidatingAdmissionPolicy '<name>' ... denied request`` (k8s.io/apiserver
pkg/admission/plugin/policy/validating/dispatcher.go: ``fmt.Sprintf("ValidatingAdmissionPolicy
'%s' with binding '%s' denied request: %s", ...)``); Pod Security answers ``violates
PodSecurity``.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import yaml

from tests.cluster.identities import Identity, bound_groups, identities, kubeconfig, team_identity
from workloads.tenancy import TEAM_LABEL


def team_namespaces(layer) -> list[dict[str, Any]]:
    return [n for n in layer.namespaces if TEAM_LABEL in n["metadata"].get("labels", {})]


@dataclass(frozen=True)
class Teams:
    a: str
    b: str
    posix_a: int
    queue_a: str
    allowed_priorities_a: tuple[str, ...]
    kubeconfig_a: Any
    group_a: str


@pytest.fixture(scope="module")
def teams(stack_cluster) -> Teams:
    # The attacker is the least entitled team, so that "a priority above the team's" exists.
    namespaces = sorted(team_namespaces(stack_cluster.layer), key=lambda n: (
        len(n["metadata"]["annotations"]["mlplatform.io/allowed-priority-classes"].split(",")), n["metadata"]["name"]))
    assert len(namespaces) >= 2, f"{stack_cluster.stack}: needs two teams to attack one from the other"
    a, b = namespaces[0]["metadata"], namespaces[1]["metadata"]
    identity = team_identity(stack_cluster, a["name"])
    if identity is None:  # no access entry for the team: the group its RoleBinding names
        groups = sorted(bound_groups(stack_cluster, a["name"]))
        assert groups, f"{stack_cluster.stack}: no RoleBinding in {a['name']} grants a group"
        identity = Identity("", f"alice@{a['name']}", tuple(groups))
    allowed = tuple(a["annotations"]["mlplatform.io/allowed-priority-classes"].split(","))
    return Teams(a["name"], b["name"], int(a["labels"]["mlplatform.io/posix-id"]),
                 a["labels"]["mlplatform.io/local-queue"], allowed, kubeconfig(stack_cluster, identity),
                 identity.groups[0])


def test_each_team_access_entry_carries_exactly_its_namespaces_group(stack_cluster):
    """Every access entry with Kubernetes groups maps to one team: its groups are the ones that
    team's namespace binds, and no other team namespace binds them (else a member of one team
    would act in another's). Entries with an access policy (admins, deploy) carry no team group."""
    cluster = stack_cluster
    teams = [n["metadata"]["name"] for n in team_namespaces(cluster.layer)]
    bound = {t: bound_groups(cluster, t) for t in teams}
    problems = []
    for identity in identities(cluster):
        groups = set(identity.groups) - {"system:masters"}
        if not groups:
            continue
        owners = [t for t in teams if groups & bound[t]]
        if "system:masters" in identity.groups:
            problems.append(f"{identity.principal_arn}: an admin entry also carries team groups {sorted(groups)}")
        elif len(owners) != 1 or not groups <= bound[owners[0]]:
            problems.append(f"{identity.principal_arn} ({identity.user}) carries {sorted(groups)}, bound in {owners}")
    assert not problems, "\n".join(problems)


def compliant_pod(name: str, namespace: str, posix_id: int) -> dict[str, Any]:
    """A CPU pod a team member may create in their namespace (restricted Pod Security, the
    team's uid/gid): the control every pod attack starts from."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": posix_id, "runAsGroup": posix_id,
                                "fsGroup": posix_id, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": "public.ecr.aws/docker/library/busybox:1.37.0", "command": ["true"],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True},
            }],
        },
    }


def create(stack_cluster, obj: dict[str, Any], kubeconfig, dry_run: bool = True):
    args = ["create", "-f", "-", "-o", "name"] + (["--dry-run=server"] if dry_run else [])
    return stack_cluster.kubectl(*args, kubeconfig=kubeconfig, input=yaml.safe_dump(obj), check=False)


def assert_refused(result, by: str, detail: str = "") -> None:
    text = (result.stderr + result.stdout)
    assert result.returncode != 0, f"the API server admitted the attack:\n{text}"
    markers = {"rbac": "Forbidden", "admission": "ValidatingAdmissionPolicy", "pod-security": "violates PodSecurity"}
    assert markers[by] in text, f"refused, but not by {by}:\n{text}"
    if by == "rbac":
        assert "cannot" in text, text
    if detail:
        assert detail in text, f"refused by {by}, but not for {detail!r}:\n{text}"


# --- reading and changing another team's things (RBAC) ------------------------------------------

@pytest.mark.parametrize("args", [
    ("get", "pods"), ("get", "secrets"), ("get", "configmaps"), ("get", "pytorchjobs.kubeflow.org"),
    ("get", "jobs.batch"), ("get", "events"),
], ids=lambda a: a[1])
def test_team_a_cannot_read_team_b(stack_cluster, teams, args):
    control = stack_cluster.kubectl(*args, "-n", teams.a, kubeconfig=teams.kubeconfig_a, check=False)
    assert control.returncode == 0, f"control: team A cannot {args} in its own namespace: {control.stderr}"
    attack = stack_cluster.kubectl(*args, "-n", teams.b, kubeconfig=teams.kubeconfig_a, check=False)
    assert_refused(attack, "rbac")


def test_team_a_cannot_read_team_b_logs(stack_cluster, teams):
    attack = stack_cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{teams.b}/pods/anything/log",
                                   kubeconfig=teams.kubeconfig_a, check=False)
    assert_refused(attack, "rbac")


def test_team_a_cannot_create_pods_in_team_b(stack_cluster, teams):
    pod = compliant_pod("intruder", teams.b, teams.posix_a)
    assert_refused(create(stack_cluster, pod, teams.kubeconfig_a), "rbac")


def test_team_a_cannot_edit_network_policies(stack_cluster, teams):
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "allow-all", "namespace": teams.a},
              "spec": {"podSelector": {}, "ingress": [{}], "egress": [{}], "policyTypes": ["Ingress", "Egress"]}}
    assert_refused(create(stack_cluster, policy, teams.kubeconfig_a), "rbac")
    existing = stack_cluster.kubectl("get", "networkpolicies", "-n", teams.a, "-o", "name")
    assert existing.stdout.strip(), f"{teams.a} has no NetworkPolicy to attack"
    first = existing.stdout.split()[0]
    attack = stack_cluster.kubectl("delete", first, "-n", teams.a, "--dry-run=server",
                                   kubeconfig=teams.kubeconfig_a, check=False)
    assert_refused(attack, "rbac")


def test_team_a_cannot_publish_a_load_balancer(stack_cluster, teams):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "exposed", "namespace": teams.a},
               "spec": {"type": "LoadBalancer", "selector": {"app": "x"}, "ports": [{"port": 443}]}}
    assert_refused(create(stack_cluster, service, teams.kubeconfig_a), "rbac")
    # Even with the right to create Services (a future role change), admission refuses it.
    admin = create(stack_cluster, service, None)
    assert_refused(admin, "admission", "LoadBalancer")


def test_team_a_cannot_escalate_through_rbac(stack_cluster, teams):
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "grab", "namespace": teams.a},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"kind": "Group", "name": teams.group_a, "apiGroup": "rbac.authorization.k8s.io"}]}
    assert_refused(create(stack_cluster, binding, teams.kubeconfig_a), "rbac")


# --- pods that reach what they must not (admission) ---------------------------------------------

def test_the_compliant_pod_is_admitted(stack_cluster, teams):
    """The control for every pod attack below."""
    result = create(stack_cluster, compliant_pod("control", teams.a, teams.posix_a), teams.kubeconfig_a)
    assert result.returncode == 0, result.stderr


def _gpu_pool_taint(stack_cluster) -> dict[str, Any]:
    for pool in stack_cluster.layer.of_kind("NodePool"):
        for taint in pool["spec"]["template"]["spec"].get("taints", []):
            if taint["key"] == "nvidia.com/gpu":
                return taint
    raise AssertionError(f"{stack_cluster.stack}: no GPU NodePool with the nvidia.com/gpu taint")


def _gpu_pool_labels(stack_cluster) -> dict[str, str]:
    for pool in stack_cluster.layer.of_kind("NodePool"):
        labels = pool["spec"]["template"].get("metadata", {}).get("labels", {})
        if any(t["key"] == "nvidia.com/gpu" for t in pool["spec"]["template"]["spec"].get("taints", [])):
            return labels
    raise AssertionError("no GPU pool")


POD_ATTACKS: dict[str, Callable[[dict, Any], None]] = {}


def pod_attack(name: str):
    def register(mutate):
        POD_ATTACKS[name] = mutate
        return mutate
    return register


@pod_attack("gpu-less pod tolerating the GPU taint (N2)")
def _(pod, cluster):
    taint = _gpu_pool_taint(cluster)
    pod["spec"]["tolerations"] = [{"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}]


@pod_attack("gpu-less pod selecting a GPU pool (N2)")
def _(pod, cluster):
    labels = _gpu_pool_labels(cluster)
    key = "mlplatform.io/pool" if "mlplatform.io/pool" in labels else sorted(labels)[0]
    pod["spec"]["nodeSelector"] = {key: labels[key]}


@pod_attack("gpu-less pod with affinity to GPU nodes (N2)")
def _(pod, cluster):
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Exists"}]}]}}}


@pod_attack("spec.nodeName set to a chosen node (N3)")
def _(pod, cluster):
    pod["spec"]["nodeName"] = "ip-10-0-1-23.ec2.internal"


@pod_attack("tolerating every taint")
def _(pod, cluster):
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]


@pod_attack("selecting the system nodes")
def _(pod, cluster):
    pod["spec"]["nodeSelector"] = {"node.mlplatform.io/role": "system"}


@pod_attack("a priority class above the team's")
def _(pod, cluster):
    pod["spec"]["priorityClassName"] = "training-production"


@pod_attack("running as another team's uid")
def _(pod, cluster):
    pod["spec"]["securityContext"]["runAsUser"] = pod["spec"]["securityContext"]["runAsUser"] + 1


@pod_attack("a GPU pod outside Kueue")
def _(pod, cluster):
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}


@pod_attack("a privileged container")
def _(pod, cluster):
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}


@pytest.mark.parametrize("attack", sorted(POD_ATTACKS))
def test_pod_attacks_are_refused(stack_cluster, teams, attack):
    pod = compliant_pod("attack", teams.a, teams.posix_a)
    if attack == "a priority class above the team's" and "training-production" in teams.allowed_priorities_a:
        pytest.fail(f"{teams.a} is entitled to training-production: pick a team that is not")
    POD_ATTACKS[attack](pod, stack_cluster)
    result = create(stack_cluster, pod, teams.kubeconfig_a)
    assert result.returncode != 0, f"{attack}: the API server admitted it:\n{yaml.safe_dump(pod['spec'])}"
    text = result.stderr + result.stdout
    refusals = ["ValidatingAdmissionPolicy", "violates PodSecurity"]
    if attack == "spec.nodeName set to a chosen node (N3)":
        # Kueue's pod webhook gates every pod of a team namespace (the pod integration) before
        # validation, and the API server refuses a nodeName on a gated pod (core validation,
        # ValidatePodCreate: "cannot be set until all schedulingGates have been cleared"), ahead
        # of the placement policy, which refuses it where no gate is set (admission_cases.py).
        refusals.append("spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared")
    assert any(m in text for m in refusals), text


def test_pod_attacks_by_update_are_refused(stack_cluster, teams):
    """N3: a policy that checks CREATE only is bypassed by creating a compliant pod and then
    changing it; the fields that place a pod are immutable once scheduled, but tolerations can be
    added to a running pod (core validation allows appending tolerations)."""
    pod = compliant_pod("updated", teams.a, teams.posix_a)
    created = create(stack_cluster, pod, teams.kubeconfig_a, dry_run=False)
    assert created.returncode == 0, created.stderr
    try:
        taint = _gpu_pool_taint(stack_cluster)
        patch = json.dumps({"spec": {"tolerations": [{"key": taint["key"], "operator": "Exists",
                                                      "effect": taint["effect"]}]}})
        attack = stack_cluster.kubectl("patch", "pod", "updated", "-n", teams.a, "--type=strategic",
                                       "-p", patch, "--dry-run=server", kubeconfig=teams.kubeconfig_a, check=False)
        assert_refused(attack, "admission")
    finally:
        stack_cluster.kubectl("delete", "pod", "updated", "-n", teams.a, "--wait=false", check=False)


def test_jobs_must_go_through_kueue(stack_cluster, teams):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sneaky", "namespace": teams.a},
           "spec": {"template": compliant_pod("x", teams.a, teams.posix_a) | {}}}
    job["spec"]["template"] = {"spec": {**compliant_pod("x", teams.a, teams.posix_a)["spec"], "restartPolicy": "Never"}}
    assert_refused(create(stack_cluster, job, teams.kubeconfig_a), "admission")
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": teams.queue_a}
    control = create(stack_cluster, job, teams.kubeconfig_a)
    assert control.returncode == 0, f"control: a Job with the team's queue label: {control.stderr}"


# --- a node agent changing another node ---------------------------------------------------------

def test_a_node_agent_changes_only_its_own_node(stack_cluster):
    """The readiness agent's ClusterRole may patch every Node (RBAC cannot say "my node"); its
    admission policy admits a change only to the Node its pod-bound token names. The token comes
    from the real TokenRequest API bound to a pod on node-a; kube-apiserver 1.32 puts the node's
    name into the token (ServiceAccountTokenPodNodeInfo, GA in 1.32) and the authenticator exposes
    it as the user extra ``authentication.kubernetes.io/node-name``."""
    cluster = stack_cluster
    try:
        _agent_attack(cluster)
    finally:
        namespace = next(d for d in cluster.layer.of_kind("DaemonSet")
                         if d["metadata"]["name"] == "gpu-node-health")["metadata"]["namespace"]
        cluster.api.delete(f"/api/v1/namespaces/{namespace}/pods/agent-on-a", {"gracePeriodSeconds": 0})
        for node in ("agent-node-a", "agent-node-b"):
            cluster.api.delete(f"/api/v1/nodes/{node}")


def _agent_attack(cluster) -> None:
    agent = next(d for d in cluster.layer.of_kind("DaemonSet") if d["metadata"]["name"] == "gpu-node-health")
    namespace = agent["metadata"]["namespace"]
    account = agent["spec"]["template"]["spec"]["serviceAccountName"]
    for node in ("agent-node-a", "agent-node-b"):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-on-a", "namespace": namespace},
           "spec": {"nodeName": "agent-node-a", "serviceAccountName": account,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "agent:test"}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    uid = cluster.kubectl("get", "pod", "agent-on-a", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--bound-object-kind=Pod",
                            "--bound-object-name=agent-on-a", f"--bound-object-uid={uid}").stdout.strip()
    kubeconfig = cluster.plane.token_kubeconfig("gpu-node-health", token)
    lift = json.dumps({"metadata": {"labels": {"mlplatform.io/attacked": "true"}}})
    control = cluster.kubectl("patch", "node", "agent-node-a", "-p", lift, "--dry-run=server",
                              kubeconfig=kubeconfig, check=False)
    assert control.returncode == 0, f"control: the agent cannot patch its own node: {control.stderr}"
    attack = cluster.kubectl("patch", "node", "agent-node-b", "-p", lift, "--dry-run=server",
                             kubeconfig=kubeconfig, check=False)
    assert_refused(attack, "admission")
