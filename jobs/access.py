"""The way into the cluster for an ML engineer: who the caller is, and the one command that gives
them their team's credentials.

A team member reaches the cluster with a kubeconfig for the team's IAM role (``scheduling.teams[]
.roleArns``): the role's EKS access entry carries the team's Kubernetes group
(``workloads.tenancy.team_group``: ``mlplatform:team-<name>``), which the team's Role in its
namespace is bound to. ``aws eks update-kubeconfig --name <cluster> --region <region> --role-arn
<role>`` writes that kubeconfig (AWS CLI reference, ``eks update-kubeconfig``: ``--role-arn``
"to assume a role for cluster authentication"). Every error about access says that line, filled
in from the stack's facts; the platform's own kubeconfig (the deploy role, cluster admin) is
never the advice.

Who the caller is comes from the API server itself: ``kubectl auth whoami`` (a SelfSubjectReview,
authentication.k8s.io/v1, GA in Kubernetes 1.28, which every authenticated user may create: the
``system:basic-user`` ClusterRole), so ``--team`` can be left out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from workloads.tenancy import team_group

TEAM_GROUP_PREFIX = team_group("team-")  # "mlplatform:team-"


@dataclass(frozen=True)
class Identity:
    """The caller as the API server authenticated them."""

    username: str
    groups: tuple[str, ...]

    @property
    def teams(self) -> tuple[str, ...]:
        """The teams whose group the caller carries (a member of one team carries one)."""
        return tuple(sorted(g[len(TEAM_GROUP_PREFIX):] for g in self.groups if g.startswith(TEAM_GROUP_PREFIX)))


def identity_from_review(review: Any) -> Identity:
    """The ``status.userInfo`` of a SelfSubjectReview (``kubectl auth whoami -o json``)."""
    info = ((review or {}).get("status") or {}).get("userInfo") or {}
    return Identity(str(info.get("username") or ""), tuple(str(g) for g in info.get("groups") or ()))


def team_of_role(facts: Any, username: str) -> Optional[str]:
    """The team whose role the caller assumed, from the username EKS gives a role session
    (``arn:aws:sts::<account>:assumed-role/<role name>/<session>``), when the groups say nothing."""
    if facts is None or "assumed-role/" not in username:
        return None
    role_name = username.split("assumed-role/", 1)[1].split("/", 1)[0]
    for team in facts.teams:
        if any(arn.rsplit("/", 1)[-1] == role_name for arn in team.role_arns):
            return team.name
    return None


def kubeconfig_command(cluster: str, region: str, role_arn: str) -> str:
    return f"aws eks update-kubeconfig --name {cluster} --region {region} --role-arn {role_arn}"


def access_fix(facts: Any, team: Optional[str] = None) -> str:
    """The fix of an access error: the team's ``aws eks update-kubeconfig`` line from the stack's
    facts (``facts`` None: the line with placeholders and how to fill them)."""
    if facts is None or not getattr(facts, "cluster_name", None):
        return ("get your team's kubeconfig: aws eks update-kubeconfig --name <cluster> --region <region> --role-arn "
                "<your team's IAM role ARN> (give --stack STACK and this line names all three)")
    cluster, region, stack = facts.cluster_name, facts.region, facts.stack
    tenant = facts.team(team) if team else None
    if tenant is not None and tenant.role_arns:
        command = kubeconfig_command(cluster, region, tenant.role_arns[0])
        others = f" (or --role-arn {' / '.join(tenant.role_arns[1:])})" if len(tenant.role_arns) > 1 else ""
        return f"get team {team}'s kubeconfig: {command}{others}"
    if tenant is not None:
        return (f"team {team} has no IAM role in stack {stack} (scheduling.teams[].roleArns), so no EKS access entry: "
                f"ask the platform team to add one, then {kubeconfig_command(cluster, region, '<that role ARN>')}")
    with_roles = [t for t in facts.teams if t.role_arns]
    if not with_roles:
        return (f"no team of stack {stack} has an IAM role yet (scheduling.teams[].roleArns): ask the platform team for "
                f"yours, then {kubeconfig_command(cluster, region, '<that role ARN>')}")
    roles = "; ".join(f"{t.name}: {t.role_arns[0]}" for t in with_roles)
    return f"get your team's kubeconfig: {kubeconfig_command(cluster, region, '<your team role>')} ({roles})"


def access_error(reason: str, facts: Any, team: Optional[str] = None, *, forbidden: bool = False,
                 identity: Optional[Identity] = None) -> str:
    """One line: what went wrong, and the fix."""
    if forbidden and identity is not None and team and identity.teams and team not in identity.teams:
        return (f"{reason}. You are {identity.username} of team {', '.join(identity.teams)}: team {team}'s jobs are not "
                f"yours to read. Fix: leave out --team (your own team is used), or {access_fix(facts, team)}")
    return f"{reason}. Fix: {access_fix(facts, team)}"


def team_problem(teams: Sequence[str], username: str) -> str:
    """Why the team could not be taken from the identity."""
    if not teams:
        return (f"--team not given and your identity ({username or 'unknown'}) carries no team group "
                f"({TEAM_GROUP_PREFIX}<team>). Fix: give --team TEAM")
    return f"--team not given and you are in several teams ({', '.join(teams)}). Fix: give --team TEAM"
