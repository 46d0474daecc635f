"""Node agents from the attacker's seat: a compromised readiness agent or MIG gate pod holds a
token whose ClusterRole may patch every Node. The attack is a PATCH of another node (lift the
readiness taint of a broken GPU node, cordon the cluster, relabel a node to draw jobs); what
refuses it is the own-node-only ValidatingAdmissionPolicy each agent ships with.

The policy is evaluated with cel-python the way the API server does (Kubernetes docs,
"Validating Admission Policy"): the request must match ``matchConstraints`` (resource, operation),
then every ``matchConditions`` expression must be true, then a false ``validations`` expression
refuses it. A pod-bound token carries its node in the user extra (k8s.io/apiserver
pkg/authentication/serviceaccount: ``NodeNameKey = "authentication.kubernetes.io/node-name"``, a
``[]string``), set by the API server itself, so the attacker cannot choose it.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest

celpy = pytest.importorskip("celpy", reason="cel-python is in the dev extra (pyproject.toml)")

from workloads import gpu_sharing, node_agents, node_health


GPU_NAMESPACE = node_health.NAMESPACE  # components.gpu_enablement installs both agents there
MIG_OBJECTS = gpu_sharing.mig_gate_objects(GPU_NAMESPACE, "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0", [])
AGENT_OBJECTS = node_health.node_health_objects(image="registry.example/gpu-node-health:1")
AGENTS = {
    "readiness agent": (node_health.NAMESPACE, node_health.NAME, AGENT_OBJECTS),
    "MIG gate": (GPU_NAMESPACE, gpu_sharing.MIG_GATE_NAME, MIG_OBJECTS),
}


def _node(name: str, taints: Optional[list] = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}, "spec": {"taints": taints or []}}


def _token_user(namespace: str, account: str, node: Optional[str]) -> dict[str, Any]:
    user: dict[str, Any] = {"username": node_agents.service_account_user(namespace, account),
                            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]}
    if node is not None:
        user["extra"] = {node_agents.NODE_NAME_EXTRA: [node], "authentication.kubernetes.io/pod-name": [f"{account}-x1"]}
    return user


def admit(objects: list[dict], user: dict[str, Any], old: dict, new: Optional[dict], *,
          resource: str = "nodes", operation: str = "UPDATE") -> list[str]:
    """The refusals of the rendered policies for this request ([] = admitted)."""
    env = celpy.Environment()
    request = {"userInfo": user, "operation": operation, "resource": {"group": "", "version": "v1", "resource": "nodes"},
               "subResource": resource.partition("/")[2], "name": old["metadata"]["name"]}
    activation = {"request": celpy.json_to_cel(request), "oldObject": celpy.json_to_cel(old),
                  "object": celpy.json_to_cel(new) if new is not None else None}
    bound = {b["spec"]["policyName"] for b in objects if b["kind"] == "ValidatingAdmissionPolicyBinding"}
    refusals = []
    for policy in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"):
        spec = policy["spec"]
        assert policy["metadata"]["name"] in bound, "a policy without a binding refuses nothing"
        if not any(resource in r["resources"] and operation in r["operations"] and "" in r["apiGroups"]
                   for r in spec["matchConstraints"]["resourceRules"]):
            continue
        if not all(env.program(env.compile(c["expression"])).evaluate(activation) for c in spec.get("matchConditions", [])):
            continue
        for validation in spec["validations"]:
            result = env.program(env.compile(validation["expression"])).evaluate(activation)
            if isinstance(result, Exception) or not result:  # an error refuses too (failurePolicy Fail)
                assert spec["failurePolicy"] == "Fail"
                refusals.append(validation["message"])
    return refusals


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_an_agent_cannot_lift_the_readiness_taint_of_another_node(agent):
    namespace, account, objects = AGENTS[agent]
    broken = _node("ip-10-0-9-9.ec2.internal", taints=[{"key": "node.mlplatform.io/gpu-readiness", "effect": "NoSchedule"}])
    lifted = {**broken, "spec": {"taints": []}}
    attacker = _token_user(namespace, account, node="ip-10-0-1-1.ec2.internal")
    assert admit(objects, attacker, broken, lifted) == [node_agents.REFUSAL]
    assert admit(objects, attacker, broken, lifted, resource="nodes/status") == [node_agents.REFUSAL]
    # The same change on the agent's own node is its job.
    own = _node("ip-10-0-1-1.ec2.internal", taints=broken["spec"]["taints"])
    assert admit(objects, attacker, own, {**own, "spec": {"taints": []}}) == []


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_a_token_not_bound_to_a_pod_on_a_node_is_refused(agent):
    namespace, account, objects = AGENTS[agent]
    node = _node("ip-10-0-1-1.ec2.internal")
    # A Secret-based or hand-requested token has no node extra: nothing proves where it runs.
    assert admit(objects, _token_user(namespace, account, node=None), node, node) == [node_agents.REFUSAL]


def test_other_callers_are_not_this_policys_business():
    """The kubelet (NodeRestriction), Karpenter and operators keep their own rules."""
    node = _node("ip-10-0-1-1.ec2.internal")
    objects = AGENT_OBJECTS + MIG_OBJECTS
    karpenter = {"username": "system:serviceaccount:karpenter:karpenter", "groups": ["system:serviceaccounts"]}
    kubelet = {"username": "system:node:ip-10-0-2-2.ec2.internal", "groups": ["system:nodes"]}
    assert admit(objects, karpenter, node, node) == [] and admit(objects, kubelet, node, node) == []
    # The readiness agent's policy does not name the MIG gate and the other way round.
    gate = _token_user(GPU_NAMESPACE, gpu_sharing.MIG_GATE_NAME, node="ip-10-0-2-2.ec2.internal")
    assert admit(AGENT_OBJECTS, gate, node, node) == []


def test_every_account_that_may_patch_nodes_is_held_by_a_policy():
    """Whoever a rendered ClusterRole lets patch Nodes is named by a rendered own-node policy."""
    for agent, (_, _, objects) in AGENTS.items():
        roles = {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"
                 and any("patch" in r["verbs"] and {"nodes", "nodes/status"} & set(r["resources"]) for r in o["rules"])}
        patchers = {(s["namespace"], s["name"]) for o in objects if o["kind"] == "ClusterRoleBinding"
                    and o["roleRef"]["name"] in roles for s in o["subjects"]}
        assert patchers, agent
        for namespace, account in patchers:
            user = _token_user(namespace, account, node="ip-10-0-1-1.ec2.internal")
            assert admit(objects, user, _node("ip-10-0-9-9.ec2.internal"), _node("ip-10-0-9-9.ec2.internal")), (agent, account)
