"""Who may speak to a stack's cluster, read from the plan's EKS access entries.

An EKS access entry maps an IAM principal to a Kubernetes user and groups; the cluster tests give
that user and those groups a client certificate (CN = user, O = groups: kube-apiserver's x509
authenticator reads them that way). Read from the recorded plan's
``aws:eks/accessEntry:AccessEntry`` inputs, never from the helper that builds them, so a drift
between the entries and the RoleBindings they must meet is caught:

- the user is EKS's default for an IAM role when the entry names none: "If you don't specify a
  username for an IAM role access entry, the username is
  ``arn:aws:sts::<account>:assumed-role/<role-name>/{{SessionName}}``" (EKS User Guide, "Create
  access entries"); the session name here is ``alice``;
- the groups are the entry's ``kubernetesGroups``; an entry associated with
  ``AmazonEKSClusterAdminPolicy`` is authorized by EKS's own authorizer as cluster-admin, which the
  stand-in gives as the ``system:masters`` group (RBAC alone decides for the other entries, as
  "If you associate any access policies, the principalARN has all permissions assigned in the
  associated access policies and all permissions in any Kubernetes Role or ClusterRole objects
  that the group names are bound to" implies for the team entries, which carry none).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

SESSION = "alice"
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
_ROLE = re.compile(r"^arn:(?P<partition>[^:]+):iam::(?P<account>\d{12}):role/(?:.*/)?(?P<name>[^/]+)$")


@dataclass(frozen=True)
class Identity:
    principal_arn: str
    user: str
    groups: tuple[str, ...]


def username(principal_arn: str, entry_username: Optional[str] = None) -> str:
    if entry_username:
        return entry_username.replace("{{SessionName}}", SESSION)
    match = _ROLE.match(principal_arn)
    if not match:
        return principal_arn
    return f"arn:{match['partition']}:sts::{match['account']}:assumed-role/{match['name']}/{SESSION}"


def identities(cluster) -> list[Identity]:
    """Every STANDARD access entry of the stack's plan as the user and groups EKS gives it."""
    admins = {a["principalArn"] for a in cluster.layer.access_policies
              if str(a.get("policyArn", "")).endswith(f"/{CLUSTER_ADMIN_POLICY}")}
    found = []
    for entry in cluster.layer.access_entries:
        if entry.get("type", "STANDARD") != "STANDARD":
            continue
        groups = tuple(entry.get("kubernetesGroups") or ())
        if entry["principalArn"] in admins:
            groups += ("system:masters",)
        found.append(Identity(entry["principalArn"], username(entry["principalArn"], entry.get("userName")), groups))
    return found


def bound_groups(cluster, namespace: str) -> set[str]:
    """The groups the namespace's RoleBindings grant (what an access entry must carry to act there)."""
    return {s["name"] for b in cluster.layer.of_kind("RoleBinding") if b["metadata"].get("namespace") == namespace
            for s in b.get("subjects") or [] if s.get("kind") == "Group"}


def team_identity(cluster, namespace: str) -> Optional[Identity]:
    """The access entry whose groups the team namespace's RoleBindings bind, if the plan has one."""
    wanted = bound_groups(cluster, namespace)
    return next((i for i in identities(cluster) if set(i.groups) & wanted and "system:masters" not in i.groups), None)


def admin_identity(cluster) -> Identity:
    return next(i for i in identities(cluster) if "system:masters" in i.groups)


def submitter(cluster, namespace: str) -> Identity:
    """Who submits a team's jobs: the team's own entry, or, in a stack that gives teams none
    (dev: ``scheduling.teams[].roleArns`` is empty, so members "could only use an admin's
    kubeconfig"), the admin entry."""
    return team_identity(cluster, namespace) or admin_identity(cluster)


def kubeconfig(cluster, identity: Identity):
    return cluster.plane.kubeconfig(identity.user, list(identity.groups))


def member(cluster, namespace: str) -> Identity:
    """A team member: the team's own access entry, or, in a stack that gives teams none (dev), a
    user in the group the team namespace's RoleBindings bind (what such an entry would carry)."""
    from workloads.tenancy import team_group

    return team_identity(cluster, namespace) or Identity("", f"alice@{namespace}", (team_group(namespace),))


def job_client(cluster, team: str, store=None, identity: Optional[Identity] = None, facts=None):
    """``facts``: the stack's facts as given (default: the stack's own, read when first needed)."""
    from jobs.client import JobClient
    from jobs.kube import KubectlApi
    from tools.cluster.paths import tool_path

    path = kubeconfig(cluster, identity or submitter(cluster, f"team-{team}"))
    kube = KubectlApi(kubectl=str(tool_path("kubectl")),
                      # HOME: kubectl keeps its discovery cache under $HOME/.kube (here, the plane's dir).
                      environ={"KUBECONFIG": str(path), "PATH": os.environ.get("PATH", ""),
                               "HOME": str(cluster.plane.workdir)})
    return JobClient(cluster.stack, kube=kube, store=store, facts=facts)
