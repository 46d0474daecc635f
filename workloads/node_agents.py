"""Node agents (the GPU readiness agent, the MIG gate) change only the node their pod runs on.

RBAC cannot scope a verb to "the caller's own node": each agent's ClusterRole grants patch on
every Node, so one compromised agent pod could lift the readiness taint of a broken node, cordon
the whole cluster or relabel nodes to draw jobs onto its own. The kubelet has the NodeRestriction
admission plugin for this; a service account does not. This ValidatingAdmissionPolicy adds it:
an update (a PATCH is an UPDATE in admission) of a Node or its status by one of the agents'
service accounts is admitted only for the node its token is bound to.

The API server puts that node's name in the caller's user extra ``authentication.kubernetes.io/
node-name`` for every pod-bound service account token (k8s.io/apiserver
pkg/authentication/serviceaccount ``NodeNameKey``; feature ServiceAccountTokenPodNodeInfo: beta
and on by default since 1.30, GA and locked on in 1.32, pkg/features/kube_features.go). A token
without it (a long-lived Secret token, a TokenRequest not bound to a pod) is refused. In CEL,
``request.userInfo.extra`` is an optional ``map(string, list(string))`` (k8s.io/apiserver
pkg/admission/plugin/cel/compile.go, ``buildRequestType``), hence the ``has()`` first.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

VAP_API = "admissionregistration.k8s.io/v1"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
REFUSAL = "a node agent may change only the node its pod runs on"


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def own_node_only_policy(name: str, service_accounts: Sequence[tuple[str, str]],
                         labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The policy and its cluster-wide binding for ``service_accounts`` ((namespace, name) pairs)."""
    users = sorted(service_account_user(ns, sa) for ns, sa in service_accounts)
    extra = "request.userInfo.extra"

    def metadata() -> dict[str, Any]:
        return {"name": name, **({"labels": dict(labels)} if labels else {})}

    spec = {
        # Fail closed: an evaluation error refuses the request.
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes", "nodes/status"],
            "operations": ["UPDATE", "DELETE"]}]},
        "matchConditions": [{"name": "node-agent", "expression": f"request.userInfo.username in {json.dumps(users)}"}],
        "validations": [{
            # DELETE has no object, only oldObject; the name is the same on both for an UPDATE.
            "expression": (f"has({extra}) && '{NODE_NAME_EXTRA}' in {extra} && "
                           f"{extra}['{NODE_NAME_EXTRA}'] == [oldObject.metadata.name]"),
            "message": REFUSAL, "reason": "Forbidden"}],
    }
    return [
        {"apiVersion": VAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": metadata(), "spec": spec},
        {"apiVersion": VAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": metadata(),
         "spec": {"policyName": name, "validationActions": ["Deny", "Audit"]}},
    ]
