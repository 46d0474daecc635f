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

from components.cluster import Cluster, ClusterArgs, NodeGroupArgs
from components.log_archive import LogArchive, LogArchiveArgs
from components.network import Network, NetworkArgs
from infra.accounts import AccountProviders, create_account_providers
from infra.config import PROJECT, PlatformConfig, load_platform_config
from infra import datasets_tracking
from infra import gpu_capacity
from infra import policy_gate  # noqa: F401  (registers the policy pack with the offline plan)
from infra import training
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

    def workload_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for an AWS component in the workload account."""
        return pulumi.ResourceOptions(providers={"aws": self.providers.workload}, **kwargs)

    def kubernetes_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for a component that deploys into the cluster (and may touch AWS)."""
        return pulumi.ResourceOptions(
            providers={"aws": self.providers.workload, "kubernetes": self.cluster.k8s_provider}, **kwargs
        )


def raw_stack_config() -> dict[str, Any]:
    """The project's config values as the engine passed them, JSON objects decoded."""
    values = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    raw: dict[str, Any] = {}
    prefix = f"{PROJECT}:"
    for key, value in values.items():
        if not key.startswith(prefix):
            continue
        raw[key[len(prefix):]] = _decode(value)
    return raw


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
    return load_platform_config(raw_stack_config(), source=f"stack '{stack}' (Pulumi.{stack}.yaml)")


def build_platform(config: PlatformConfig) -> Platform:
    providers = create_account_providers(config)
    tags = config.resource_tags

    log_archive = LogArchive(
        f"{config.name}-log-archive",
        LogArchiveArgs(
            writer_account_ids=sorted({config.accounts.workload.id, config.accounts.automation.id}),
            transition_to_infrequent_access_days=config.log_archive.transition_to_infrequent_access_days,
            transition_to_glacier_days=config.log_archive.transition_to_glacier_days,
            expiration_days=config.log_archive.expiration_days,
            noncurrent_version_expiration_days=config.log_archive.noncurrent_version_expiration_days,
            kms_key_deletion_window_days=config.log_archive.kms_key_deletion_window_days,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.logging}),
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
            nat=net.nat,
            interface_endpoints=net.interface_endpoints,
            flow_logs_traffic_type=net.flow_logs.traffic_type,
            flow_logs_max_aggregation_interval_seconds=net.flow_logs.max_aggregation_interval_seconds,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    cl = config.cluster
    group = cl.system_node_group
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
            log_retention_days=cl.log_retention_days,
            deletion_protection=cl.deletion_protection if cl.deletion_protection is not None else config.is_prod,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    return Platform(config=config, providers=providers, log_archive=log_archive, network=network, cluster=cluster)


# Capabilities added on top of the foundation, in deployment order.
CAPABILITIES: tuple[Callable[[Platform], Optional[dict[str, Any]]], ...] = (
    gpu_capacity.deploy, datasets_tracking.deploy, training.deploy, gitops_capability.deploy)


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
    return platform
