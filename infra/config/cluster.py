"""The ``cluster`` section: EKS control plane, access entries, the static node group; its rules."""
from __future__ import annotations

import re
from typing import Annotated, Any, Iterator, Optional

from pydantic import Field, field_validator

from components.cluster import UpgradePolicy
from components.cluster import ClusterArgs, NodeGroupArgs
from workloads.problems import Problem
from catalog.versions import DEFAULT_EKS_VERSION, EKS_VERSIONS, addon_versions
from catalog import limits
from infra.config.accounts import AccountConfig
from infra.config.common import (
    check_log_retention, CapacityType, Cidr, Environment, RoleArn, _Model, _exposure, prod_retention_rule,
)
from infra.config.engine import Rule, invalid
from infra.config.common import at_most


class NodeGroupConfig(_Model):
    """Static CPU managed node group that runs the cluster's controllers."""

    instance_types: list[str] = Field(min_length=1, description="e.g. [m7i.xlarge]")
    capacity_type: CapacityType = CapacityType(NodeGroupArgs.capacity_type)
    min_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=0)
    max_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=1)
    desired_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=0)
    disk_size_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(NodeGroupArgs.disk_size_gib, ge=20)
    release_version: Optional[str] = Field(None, description=(
        "EKS AL2023 AMI release of the group, <Kubernetes patch>-<YYYYMMDD> (e.g. 1.32.9-20251023): monthly AMI "
        "patches between minor upgrades. Read it with `aws ssm get-parameter --name /aws/service/eks/optimized-ami/"
        "<minor>/amazon-linux-2023/x86_64/standard/recommended/release_version`. Unset: the release EKS picks at "
        "creation, never patched (the plan warns)."))

    @field_validator("release_version")
    @classmethod
    def _release(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"^1\.\d+\.\d+-20\d{6}$", value):
            raise invalid(f"{value!r} is not an EKS AMI release version",
                          "use <Kubernetes patch>-<YYYYMMDD>, e.g. 1.32.9-20251023 (the SSM release_version parameter)")
        return value

    @field_validator("instance_types")
    @classmethod
    def _types(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not re.match(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$", t)]
        if bad:
            raise invalid(f"{bad} are not EC2 instance types", "use names such as m7i.xlarge")
        return value

    def args(self) -> NodeGroupArgs:
        return self.copy_into(NodeGroupArgs)


class ClusterConfig(_Model):
    """EKS control plane, access and the static CPU node group."""

    version: str = Field(DEFAULT_EKS_VERSION, description=f"One of {sorted(EKS_VERSIONS)}.")
    upgrade_policy: UpgradePolicy = Field(description="Required: pulumi-eks would silently default to EXTENDED.")
    public_access_cidrs: list[Cidr] = Field(
        default_factory=list, description="Empty = private endpoint only. Never allowed in prod."
    )
    admin_role_arns: list[RoleArn] = Field(default_factory=list, description="Roles given cluster-admin access entries.")
    deploy_role_arn: Optional[RoleArn] = Field(None, description="CI role given a cluster-admin access entry.")
    log_retention_days: int = Field(ClusterArgs.log_retention_days, description="Control-plane log retention in CloudWatch; prod: 365 or more.")
    deletion_protection: Optional[bool] = Field(None, description="Defaults to true in prod.")
    system_node_group: NodeGroupConfig

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in EKS_VERSIONS:
            raise invalid("is not a known EKS version", f"use one of {sorted(EKS_VERSIONS)}")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return check_log_retention(value)

    def args(self, *, is_prod: bool, **wiring: Any) -> ClusterArgs:
        """The control plane's Args: the deploy role joins the admins, deletion protection defaults
        to on in prod, and the add-on builds are those of this Kubernetes minor (dev upgrades first)."""
        return self.copy_into(
            ClusterArgs, system_node_group=self.system_node_group.args(), addon_versions=addon_versions(self.version),
            admin_role_arns=list(self.admin_role_arns) + ([self.deploy_role_arn] if self.deploy_role_arn else []),
            deletion_protection=self.deletion_protection if self.deletion_protection is not None else is_prod,
            **wiring)


def _node_group_sizes(min_size: int, max_size: int, desired_size: int) -> Iterator[Problem]:
    path = "cluster.systemNodeGroup"
    if min_size > max_size:
        yield Problem(f"{path}.minSize", min_size, f"minSize is greater than maxSize ({max_size})",
                      "set minSize <= desiredSize <= maxSize")
    elif not min_size <= desired_size <= max_size:
        yield Problem(f"{path}.desiredSize", desired_size,
                      f"desiredSize is outside [minSize={min_size}, maxSize={max_size}]",
                      "set minSize <= desiredSize <= maxSize")
    if min_size < 2:
        # Karpenter, CoreDNS and the other controllers run only here.
        yield Problem(f"{path}.minSize", min_size, "controllers need 2 nodes to survive the loss of one",
                      "set minSize to 2 or more")


def _endpoint_and_protection(environment: Environment, public_access_cidrs, deletion_protection) -> Iterator[Problem]:
    exposed = _exposure("cluster.publicAccessCidrs", list(public_access_cidrs))
    if exposed:
        at, value, what = exposed
        yield Problem(
            at, value, f"opens the Kubernetes API to {what}",
            "list your VPN or office egress CIDRs, or leave publicAccessCidrs empty for a private endpoint",
        )
    if environment is not Environment.PROD:
        return
    if public_access_cidrs:
        yield Problem(
            "cluster.publicAccessCidrs", [str(c) for c in public_access_cidrs],
            "prod clusters have a private API endpoint only",
            "remove cluster.publicAccessCidrs and reach the API from inside the VPC (CI runner, VPN, SSM)",
        )
    if deletion_protection is False:
        yield Problem(
            "cluster.deletionProtection", False, "prod clusters must be protected from deletion",
            "remove cluster.deletionProtection (it defaults to true in prod)",
        )


def _access_entries(workload: AccountConfig, admin_role_arns, deploy_role_arn, teams) -> Iterator[Problem]:
    arns = list(admin_role_arns) + ([deploy_role_arn] if deploy_role_arn else [])
    seen: set[str] = set()
    for arn in arns:
        if arn in seen:
            yield Problem(
                "cluster.adminRoleArns", arn, "the same role is listed twice (EKS rejects duplicate access entries)",
                "list each role once, in adminRoleArns or deployRoleArn",
            )
        seen.add(arn)
    if workload.role_arn in seen:
        yield Problem(
            "cluster.adminRoleArns", workload.role_arn,
            "the workload deploy role (accounts.workload.roleArn) gets its own access entry; a second one fails",
            "remove it from adminRoleArns/deployRoleArn",
        )
    for index, team in enumerate(teams):
        for arn in team.role_arns:
            if arn in seen or arn == workload.role_arn:
                yield Problem(
                    f"scheduling.teams[{index}].roleArns", arn,
                    "the role already has cluster-wide access (admin or deploy role); EKS allows one access entry per role",
                    "give teams their own roles",
                )


# Listed in the order the loader runs them (infra.config.platform.RULES).
def _release_matches_version(version: str, release: Optional[str]) -> Iterator[Problem]:
    if release is not None and not release.startswith(f"{version}."):
        yield Problem("cluster.systemNodeGroup.releaseVersion", release,
                      f"is an AMI release for Kubernetes {release.rsplit('.', 1)[0]}, the cluster runs {version}",
                      f"use a {version}.x release (or unset it when changing cluster.version)")


RULES: tuple[Rule, ...] = (
    prod_retention_rule("cluster.logRetentionDays"),
    Rule(("cluster.version", "cluster.systemNodeGroup.releaseVersion"), _release_matches_version),
    Rule(("cluster.systemNodeGroup.minSize", "cluster.systemNodeGroup.maxSize", "cluster.systemNodeGroup.desiredSize"), _node_group_sizes),
    Rule(("environment", "cluster.publicAccessCidrs", "cluster.deletionProtection"), _endpoint_and_protection),
    Rule(("accounts.workload", "cluster.adminRoleArns", "cluster.deployRoleArn", "scheduling.teams"), _access_entries),
)
