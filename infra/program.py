"""The platform program: config in, every component wired to the account it belongs to.

``main`` is what ``pulumi up`` runs (through ``infra/__main__.py``) and what the offline plan
runs under the recording engine. Later capabilities are functions of ``Platform`` listed in
``CAPABILITIES``: they receive the built foundation and add their components to it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi

from components.bucket import AccessLogBucket, AccessLogBucketArgs
from components.cluster import Cluster, ClusterArgs, NodeGroupArgs, control_plane_log_group_name
from components.kms import LogGroupKey, LogGroupKeyArgs
from components.log_archive import (
    FLOW_LOGS_PREFIX,
    AuditTrail,
    AuditTrailArgs,
    AuditTrailSources,
    LogArchive,
    LogArchiveArgs,
)
from components.network import Network, NetworkArgs
from infra.accounts import AccountProviders, create_account_providers
from infra.config import PROJECT, AuditTrailMode, PlatformConfig, load_platform_config
from infra import datasets_tracking
from infra import gpu_capacity
from infra import costs, policy_gate  # noqa: F401  (register the cost report and the policy pack with the offline plan)
from infra import operations, training
from infra.mock_engine import Recording
from infra.plan import plan_section, plan_warning
from infra import gitops as gitops_capability


@dataclass
class Platform:
    """The foundation every capability builds on."""

    config: PlatformConfig
    providers: AccountProviders
    log_archive: LogArchive
    network: Network
    cluster: Cluster
    # Components a capability built that a later one uses (e.g. "datasets", "scheduling").
    components: dict[str, Any] = field(default_factory=dict)
    log_group_key: Optional[LogGroupKey] = None
    audit_trails: list[AuditTrail] = field(default_factory=list)
    # S3 server access log targets by account key; see ``access_log_bucket``.
    access_log_buckets: dict[str, AccessLogBucket] = field(default_factory=dict)

    def access_log_bucket(self, account: str) -> AccessLogBucket:
        """The S3 server access log bucket of ``account`` (automation / workload / logging).

        S3 delivers access logs only to a bucket in the source bucket's own account, so each
        account that has buckets gets one, created on first use.
        """
        if account not in self.access_log_buckets:
            self.access_log_buckets[account] = _access_log_bucket(self.config, self.providers, account)
        return self.access_log_buckets[account]

    def seal_access_logs(self) -> None:
        """Write each access-log bucket's policy for the buckets registered with it and turn
        their logging on; call once every capability has created its buckets."""
        for bucket in self.access_log_buckets.values():
            bucket.seal()

    def workload_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for an AWS component in the workload account."""
        return pulumi.ResourceOptions(providers={"aws": self.providers.workload}, **kwargs)

    def kubernetes_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for a component that deploys into the cluster (and may touch AWS)."""
        return pulumi.ResourceOptions(
            providers={"aws": self.providers.workload, "kubernetes": self.cluster.k8s_provider}, **kwargs
        )


def raw_stack_config() -> tuple[dict[str, Any], list[str]]:
    """The project's config values, JSON objects decoded, and the keys stored as secrets.

    Values are read through ``pulumi.Config`` (the engine's decrypted values, with its notion of
    which keys are secret); only the key *names* come from the config store, so that unknown
    keys can be reported. Fields typed ``SecretStr`` reach resources as secret Outputs.
    """
    names = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    config = pulumi.Config(PROJECT)
    raw: dict[str, Any] = {}
    secret_keys: list[str] = []
    prefix = f"{PROJECT}:"
    for full_key in names:
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        raw[key] = _decode(config.get(key))
        if pulumi.runtime.is_config_secret(full_key):
            secret_keys.append(key)
    return raw, secret_keys


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    # Only structured values are JSON-encoded by the CLI; "123" stays a string.
    return decoded if isinstance(decoded, (dict, list, bool)) else value


def read_config() -> PlatformConfig:
    stack = pulumi.get_stack()
    raw, secret_keys = raw_stack_config()
    return load_platform_config(raw, source=f"stack '{stack}' (Pulumi.{stack}.yaml)", secret_paths=secret_keys)


def _access_log_bucket(config: PlatformConfig, providers: AccountProviders, account: str) -> AccessLogBucket:
    return AccessLogBucket(
        f"{config.name}-{account}-access-logs",
        AccessLogBucketArgs(expiration_days=config.log_archive.access_log_expiration_days,
                            protect=config.protect_stateful, tags=config.resource_tags),
        opts=pulumi.ResourceOptions(providers={"aws": getattr(providers, account)}),
    )


def audit_trail_name(config: PlatformConfig) -> str:
    return f"{config.name}-audit"


def _trail_sources(config: PlatformConfig) -> AuditTrailSources:
    trail = config.log_archive.audit_trail
    if trail.mode is AuditTrailMode.ORGANIZATION:
        return AuditTrailSources(audit_trail_name(config), organization_id=trail.organization_id,
                                 management_account_id=trail.management_account_id)
    return AuditTrailSources(audit_trail_name(config),
                             account_ids=[config.accounts.workload.id, config.accounts.automation.id])


def _audit_trails(config: PlatformConfig, providers: AccountProviders, archive: LogArchive) -> list[AuditTrail]:
    tags = config.resource_tags
    if config.log_archive.audit_trail.mode is AuditTrailMode.ORGANIZATION:
        # Created by the logging account as CloudTrail delegated administrator (README).
        return [AuditTrail(f"{config.name}-audit-organization",
                           AuditTrailArgs(archive=archive, trail_name=audit_trail_name(config), organization=True, tags=tags),
                           opts=pulumi.ResourceOptions(providers={"aws": providers.logging}))]
    trails, seen = [], set()
    for key in ("workload", "automation"):
        account_id = getattr(config.accounts, key).id
        if account_id in seen:  # one trail per account, whatever roles it plays
            continue
        seen.add(account_id)
        trails.append(AuditTrail(f"{config.name}-audit-{key}",
                                 AuditTrailArgs(archive=archive, trail_name=audit_trail_name(config), tags=tags),
                                 opts=pulumi.ResourceOptions(providers={"aws": getattr(providers, key)})))
    return trails


def log_group_names(config: PlatformConfig) -> list[str]:
    """Every CloudWatch log group of the workload account the platform creates."""
    return [control_plane_log_group_name(config.cluster_name), *datasets_tracking.log_group_names(config)]


def build_platform(config: PlatformConfig) -> Platform:
    providers = create_account_providers(config)
    tags = config.resource_tags

    archive_access_logs = _access_log_bucket(config, providers, "logging")
    log_archive = LogArchive(
        f"{config.name}-log-archive",
        LogArchiveArgs(
            flow_log_account_ids=[config.accounts.workload.id],
            audit_trail=_trail_sources(config),
            transition_to_infrequent_access_days=config.log_archive.transition_to_infrequent_access_days,
            transition_to_glacier_days=config.log_archive.transition_to_glacier_days,
            expiration_days=config.log_archive.expiration_days,
            noncurrent_version_expiration_days=config.log_archive.noncurrent_version_expiration_days,
            object_lock_retention_days=config.object_lock_retention_days,
            access_logs_bucket=archive_access_logs,
            kms_key_deletion_window_days=config.log_archive.kms_key_deletion_window_days,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.logging}),
    )
    audit_trails = _audit_trails(config, providers, log_archive)
    log_group_key = LogGroupKey(
        f"{config.name}-logs",
        LogGroupKeyArgs(log_group_names=log_group_names(config), protect=config.protect_stateful, tags=tags),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    net = config.network
    network = Network(
        f"{config.name}-network",
        NetworkArgs(
            cidr=str(net.cidr),
            availability_zones=list(net.availability_zones),
            private_subnet_cidrs=[str(c) for c in net.private_subnet_cidrs],
            public_subnet_cidrs=[str(c) for c in net.public_subnet_cidrs],
            cluster_name=config.cluster_name,
            flow_logs_bucket=log_archive.bucket,
            flow_logs_prefix=FLOW_LOGS_PREFIX,
            flow_logs_bucket_policy=log_archive.policy,
            nat=net.nat,
            interface_endpoints=config.interface_endpoints,
            flow_logs_traffic_type=net.flow_logs.traffic_type,
            flow_logs_max_aggregation_interval_seconds=net.flow_logs.max_aggregation_interval_seconds,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    cl = config.cluster
    group = cl.system_node_group
    namespace_editors: dict[str, list[str]] = {}
    for team in config.scheduling.teams:
        for arn in team.role_arns:
            namespace_editors.setdefault(arn, []).append(gpu_capacity.team_namespace(team))
    cluster = Cluster(
        f"{config.name}-cluster",
        ClusterArgs(
            cluster_name=config.cluster_name,
            version=cl.version,
            upgrade_policy=cl.upgrade_policy,
            network=network,
            system_node_group=NodeGroupArgs(
                instance_types=list(group.instance_types), min_size=group.min_size, max_size=group.max_size,
                desired_size=group.desired_size, disk_size_gib=group.disk_size_gib,
                capacity_type=group.capacity_type.value,
            ),
            public_access_cidrs=[str(c) for c in cl.public_access_cidrs],
            admin_role_arns=list(cl.admin_role_arns) + ([cl.deploy_role_arn] if cl.deploy_role_arn else []),
            kubeconfig_role_arn=config.accounts.workload.role_arn,
            namespace_editors=namespace_editors,
            log_retention_days=cl.log_retention_days,
            log_kms_key=log_group_key.key,
            deletion_protection=cl.deletion_protection if cl.deletion_protection is not None else config.is_prod,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    return Platform(config=config, providers=providers, log_archive=log_archive, network=network, cluster=cluster,
                    log_group_key=log_group_key, audit_trails=audit_trails,
                    access_log_buckets={"logging": archive_access_logs})


@plan_section
def _logging_section(config: PlatformConfig, recording: Recording) -> tuple[str, list[str]]:
    archive = config.log_archive
    steps = [f"STANDARD_IA day {archive.transition_to_infrequent_access_days}" if archive.transition_to_infrequent_access_days else "",
             f"GLACIER_IR day {archive.transition_to_glacier_days}" if archive.transition_to_glacier_days else "",
             f"expire day {archive.expiration_days}" if archive.expiration_days else "kept forever"]
    lock = config.object_lock_retention_days
    trail = archive.audit_trail
    trails = ("organization trail (logging account, delegated administrator)" if trail.mode is AuditTrailMode.ORGANIZATION
              else "account trails in workload and automation")
    access = sorted({r.name.removeprefix(f"{config.name}-").removesuffix("-access-logs")
                     for r in recording.by_type("mlplatform:bucket:AccessLogBucket")})
    return ("Logs and audit", [
        f"log archive (logging account, SSE-KMS): VPC flow logs + CloudTrail {trails}; "
        f"{', '.join(s for s in steps if s)}; Object Lock {f'GOVERNANCE {lock} days' if lock else 'off'}",
        f"S3 server access logs: an SSE-S3 bucket in each of {', '.join(access) or 'no account'}, "
        f"expire after {archive.access_log_expiration_days} days",
        f"CloudWatch log groups: KMS-encrypted ({len(log_group_names(config))} groups), control plane kept "
        f"{config.cluster.log_retention_days} days",
        f"interface endpoints: {'on' if config.interface_endpoints else 'off (AWS APIs through the NAT gateway)'}",
    ])


@plan_warning
def _dev_object_lock(config: PlatformConfig, recording: Recording):
    if not config.is_prod and config.object_lock_retention_days:
        yield (f"logArchive.objectLockRetentionDays is set in {config.environment.value}: `pulumi destroy` cannot delete "
               f"archived logs for {config.object_lock_retention_days} days (GOVERNANCE mode needs s3:BypassGovernanceRetention)")


# Capabilities added on top of the foundation, in deployment order.
CAPABILITIES: tuple[Callable[[Platform], Optional[dict[str, Any]]], ...] = (
    gpu_capacity.deploy, datasets_tracking.deploy, training.deploy, operations.deploy, gitops_capability.deploy)


def main() -> Platform:
    config = read_config()
    platform = build_platform(config)
    pulumi.export("clusterName", platform.cluster.cluster_name)
    pulumi.export("clusterEndpoint", platform.cluster.endpoint)
    pulumi.export("kubeconfig", platform.cluster.kubeconfig)
    pulumi.export("oidcIssuer", platform.cluster.oidc_issuer)
    pulumi.export("vpcId", platform.network.vpc_id)
    pulumi.export("privateSubnetIds", platform.network.private_subnet_ids)
    pulumi.export("publicSubnetIds", platform.network.public_subnet_ids)
    pulumi.export("nodeSecurityGroupId", platform.cluster.node_security_group.id)
    pulumi.export("clusterSecurityGroupId", platform.cluster.cluster_security_group_id)
    pulumi.export("logArchiveBucket", platform.log_archive.bucket.bucket)
    for capability in CAPABILITIES:
        for key, value in (capability(platform) or {}).items():
            pulumi.export(key, value)
    platform.seal_access_logs()
    return platform
