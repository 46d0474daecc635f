"""The foundation capability: accounts, log archive and audit trails, network, cluster.

``build_platform`` creates what every other capability builds on; the capability object adds
the foundation's stack outputs, its plan section and warnings, and the idle cost of the control
plane, static nodes, network and the stack's storage and keys.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterable, Iterator, Sequence

import pulumi

from catalog.regions import partition_of
from components.charts import ChartSource
from components.cluster import Cluster, control_plane_log_group_name
from components.kms import LogGroupKey, LogGroupKeyArgs
from components.log_archive import (
    FLOW_LOGS_PREFIX,
    AuditTrail,
    AuditTrailArgs,
    AuditTrailSources,
    LogArchive,
    s3_object_events,
)
from components.datasets import DatasetBucket, bucket_arn_prefix
from components.network import Network
from catalog.versions import (
    EKS_EXTENDED_USD_PER_HOUR,
    EKS_RELEASES,
    EKS_STANDARD_USD_PER_HOUR,
    EKS_VERSIONS,
    HOURS_PER_MONTH,
    ami_release_date,
)
from infra import costs
from infra.accounts import AccountProviders, create_account_providers
from infra.capability import Capability
from infra.config import AuditTrailMode, PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform, access_log_bucket, datasets_name


def audit_trail_name(config: PlatformConfig) -> str:
    return f"{config.name}-audit"


def _trail_sources(config: PlatformConfig) -> AuditTrailSources:
    trail = config.log_archive.audit_trail
    if trail.mode is AuditTrailMode.ORGANIZATION:
        return AuditTrailSources(audit_trail_name(config), organization_id=trail.organization_id,
                                 management_account_id=trail.management_account_id)
    # The logging account too: changes to the archive bucket, its policy and its key are
    # recorded where they happen.
    return AuditTrailSources(audit_trail_name(config), account_ids=[
        config.accounts.workload.id, config.accounts.automation.id, config.accounts.logging.id])


def _data_event_selectors(config: PlatformConfig, archive: LogArchive) -> dict[str, list[dict]]:
    """Per account role, the S3 data events its trail records: every object call on the tenant
    buckets (datasets, checkpoints: who read or overwrote whose data), and on the archive the
    writes that are not CloudTrail's and the flow logs' own deliveries (deletes, retention)."""
    # From the region, not an invoke: this runs outside any component, where an invoke has no
    # parent to inherit a provider from, and Pulumi.yaml disables the default AWS provider (the
    # engine refuses a provider-less invoke then: audit 4, B1).
    partition = partition_of(config.region)
    selectors: dict[str, list[dict]] = {"logging": [s3_object_events(
        "Log archive: object writes other than deliveries", [pulumi.Output.concat(archive.bucket.arn, "/")],
        writes_only_except_delivery=True)]}
    if config.datasets is not None:
        name = datasets_name(config)
        selectors["workload"] = [s3_object_events(
            "Tenant data: datasets and checkpoints objects",
            [bucket_arn_prefix(partition, name, kind) for kind in (DatasetBucket.DATASETS, DatasetBucket.CHECKPOINTS)])]
    return selectors


def _audit_trails(config: PlatformConfig, providers: AccountProviders, archive: LogArchive) -> list[AuditTrail]:
    tags = config.resource_tags
    selectors = _data_event_selectors(config, archive)
    if config.log_archive.audit_trail.mode is AuditTrailMode.ORGANIZATION:
        # Created by the logging account as CloudTrail delegated administrator (README).
        return [AuditTrail(f"{config.name}-audit-organization",
                           AuditTrailArgs(archive=archive, trail_name=audit_trail_name(config), organization=True,
                                          data_event_selectors=[s for group in selectors.values() for s in group],
                                          tags=tags),
                           opts=pulumi.ResourceOptions(providers={"aws": providers.logging}))]
    trails, seen = [], set()
    for key in ("workload", "automation", "logging"):
        account_id = getattr(config.accounts, key).id
        if account_id in seen:  # one trail per account, whatever roles it plays
            continue
        seen.add(account_id)
        own = [s for role, group in selectors.items() if getattr(config.accounts, role).id == account_id for s in group]
        trails.append(AuditTrail(f"{config.name}-audit-{key}",
                                 AuditTrailArgs(archive=archive, trail_name=audit_trail_name(config),
                                                data_event_selectors=own, tags=tags),
                                 opts=pulumi.ResourceOptions(providers={"aws": getattr(providers, key)})))
    return trails


def log_group_names(config: PlatformConfig) -> list[str]:
    """The foundation's own CloudWatch log groups (the cluster's control-plane logs)."""
    return [control_plane_log_group_name(config.cluster_name)]


def build_platform(config: PlatformConfig, log_groups: Sequence[str], *, read_only: bool = False,
                   charts: ChartSource = ChartSource()) -> Platform:
    """``log_groups``: every log group the platform will create (the log key must name each
    one before it exists), from ``infra.capabilities.log_group_names``, the foundation's included.
    ``read_only``: a pull-request preview (``infra.plan.deploy preview --read-only``): every AWS
    provider uses the stack's ``<name>-ci-reader`` roles. ``charts``: where every Helm release's chart
    comes from (``infra.chart_mirror.chart_source``)."""
    providers = create_account_providers(config, read_only=read_only)
    tags = config.resource_tags

    archive_access_logs = access_log_bucket(config, providers, "logging")
    log_archive = LogArchive(
        f"{config.name}-log-archive",
        config.log_archive.args(
            flow_log_account_ids=[config.accounts.workload.id],
            audit_trail=_trail_sources(config),
            object_lock_retention_days=config.object_lock_retention_days,  # 365 in prod when unset
            # COMPLIANCE in prod: not even the logging account's root can shorten or lift it.
            object_lock_mode="COMPLIANCE" if config.is_prod else "GOVERNANCE",
            access_logs_bucket=archive_access_logs,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.logging}),
    )
    audit_trails = _audit_trails(config, providers, log_archive)
    log_group_key = LogGroupKey(
        f"{config.name}-logs",
        LogGroupKeyArgs(log_group_names=list(log_groups), protect=config.protect_stateful, tags=tags),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    network = Network(
        f"{config.name}-network",
        config.network.args(
            cluster_name=config.cluster_name,
            flow_logs_bucket=log_archive.bucket,
            flow_logs_prefix=FLOW_LOGS_PREFIX,
            flow_logs_bucket_policy=log_archive.policy,
            interface_endpoints=config.interface_endpoints,  # on in prod when unset
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    namespace_editors: dict[str, list[str]] = {}
    for team in config.scheduling.teams:
        for arn in team.role_arns:
            namespace_editors.setdefault(arn, []).append(team.namespace)
    cluster = Cluster(
        f"{config.name}-cluster",
        config.cluster.args(
            is_prod=config.is_prod,
            cluster_name=config.cluster_name,
            network=network,
            # Unchanged in read-only previews: they exclude the in-cluster resources (infra.plan.deploy).
            kubeconfig_role_arn=config.accounts.workload.role_arn,
            namespace_editors=namespace_editors,
            log_kms_key=log_group_key.key,
            protect=config.protect_stateful,
            tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": providers.workload}),
    )
    return Platform(config=config, providers=providers, log_archive=log_archive, network=network, cluster=cluster,
                    charts=charts,
                    log_group_key=log_group_key, audit_trails=audit_trails,
                    access_log_buckets={"logging": archive_access_logs})




def deploy(platform: Platform) -> dict[str, Any]:
    """The foundation's stack outputs (``build_platform`` created its components)."""
    return {
        "clusterName": platform.cluster.cluster_name,
        "clusterEndpoint": platform.cluster.endpoint,
        "kubeconfig": platform.cluster.kubeconfig,
        "oidcIssuer": platform.cluster.oidc_issuer,
        "vpcId": platform.network.vpc_id,
        "privateSubnetIds": platform.network.private_subnet_ids,
        "publicSubnetIds": platform.network.public_subnet_ids,
        "nodeSecurityGroupId": platform.cluster.node_security_group.id,
        "clusterSecurityGroupId": platform.cluster.cluster_security_group_id,
        "logArchiveBucket": platform.log_archive.bucket.bucket,
    }


# -- offline plan ------------------------------------------------------------------------
def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    archive = config.log_archive
    steps = [f"STANDARD_IA day {archive.transition_to_infrequent_access_days}" if archive.transition_to_infrequent_access_days else "",
             f"GLACIER_IR day {archive.transition_to_glacier_days}" if archive.transition_to_glacier_days else "",
             f"expire day {archive.expiration_days}" if archive.expiration_days else "kept forever"]
    lock = config.object_lock_retention_days
    trail = archive.audit_trail
    trails = ("organization trail (logging account, delegated administrator)" if trail.mode is AuditTrailMode.ORGANIZATION
              else "account trails in workload, automation and logging")
    access = sorted({r.name.removeprefix(f"{config.name}-").removesuffix("-access-logs")
                     for r in recording.by_type("mlplatform:bucket:AccessLogBucket")})
    lock_mode = "COMPLIANCE" if config.is_prod else "GOVERNANCE"
    yield ("Logs and audit", [
        f"log archive (logging account, SSE-KMS): VPC flow logs + CloudTrail {trails}; "
        f"{', '.join(s for s in steps if s)}; Object Lock {f'{lock_mode} {lock} days' if lock else 'off'}",
        "CloudTrail S3 data events: datasets and checkpoints objects (workload trail), archive deletions and "
        f"retention changes (logging trail); archive key deletion/disabling only by role "
        f"{archive.break_glass_role_name}",
        f"S3 server access logs: an SSE-S3 bucket in each of {', '.join(access) or 'no account'}, "
        f"expire after {archive.access_log_expiration_days} days",
        f"CloudWatch log groups: KMS-encrypted ({_encrypted_log_groups(config, recording)} groups), control plane kept "
        f"{config.cluster.log_retention_days} days",
        f"interface endpoints: {'on' if config.interface_endpoints else 'off (AWS APIs through the NAT gateway)'}",
    ])


def _encrypted_log_groups(config: PlatformConfig, recording: Recording) -> int:
    """How many log groups the recorded log key admits (its ``kms:EncryptionContext:aws:logs:arn``)."""
    key = recording.one("aws:kms/key:Key", f"{config.name}-logs-key")
    statements = json.loads(key.inputs["policy"])["Statement"]
    return sum(len(s.get("Condition", {}).get("ArnLike", {}).get("kms:EncryptionContext:aws:logs:arn", []))
               for s in statements)


def _eks_support(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    version = config.cluster.version
    support = EKS_VERSIONS[version]
    today = dt.date.today()
    extra = (EKS_EXTENDED_USD_PER_HOUR - EKS_STANDARD_USD_PER_HOUR) * HOURS_PER_MONTH
    total = EKS_EXTENDED_USD_PER_HOUR * HOURS_PER_MONTH
    policy = config.cluster.upgrade_policy.value
    # AWS bills extended support "from the beginning of the day" standard support ends: `>=`.
    if today >= support.extended_support_ends:
        yield f"EKS {version} is past the end of extended support ({support.extended_support_ends}): upgrade now."
    elif today >= support.standard_support_ends:
        if policy == "EXTENDED":
            yield (f"EKS {version} is in extended support since {support.standard_support_ends} (ends "
                   f"{support.extended_support_ends}): the control plane costs ${EKS_EXTENDED_USD_PER_HOUR:.2f}/h "
                   f"instead of ${EKS_STANDARD_USD_PER_HOUR:.2f}/h, about ${total:,.0f}/month (+${extra:,.0f}/month). "
                   f"Plan the upgrade to a standard-support version.")
        else:
            yield (f"EKS {version} left standard support on {support.standard_support_ends} and upgradePolicy is "
                   f"STANDARD: AWS will upgrade the control plane on its own schedule. Set EXTENDED "
                   f"(+${extra:,.0f}/month) or upgrade first.")
    elif policy == "EXTENDED":
        yield (f"upgradePolicy EXTENDED: when EKS {version} leaves standard support on "
               f"{support.standard_support_ends} the control plane will cost +${extra:,.0f}/month.")


# AWS publishes AL2023 EKS AMIs about every two weeks; add-on builds move as often.
AMI_ALIAS_MAX_AGE_DAYS = 90
VERSION_ROW_MAX_AGE_DAYS = 120


def _version_age(config: PlatformConfig, recording: Recording, today: dt.date | None = None) -> Iterable[str]:
    today = today or dt.date.today()
    release = EKS_RELEASES[config.cluster.version]
    aliases = {config.karpenter.ami_alias, *(pool.ami_alias for pool in config.gpu_pools if pool.ami_alias)}
    for alias in sorted(aliases):
        date = ami_release_date(alias)
        if date is not None and (today - date).days > AMI_ALIAS_MAX_AGE_DAYS:
            yield (f"Karpenter AMI alias {alias} is {(today - date).days} days old (> {AMI_ALIAS_MAX_AGE_DAYS}): nodes miss "
                   "kernel and NVIDIA driver patches; move it to a recent release (docs/runbooks/upgrading-eks.md, AMI patches)")
    version = config.cluster.version
    node_release = config.cluster.system_node_group.release_version
    ssm = f"/aws/service/eks/optimized-ami/{version}/amazon-linux-2023/x86_64/standard/recommended/release_version"
    if node_release is None:
        # No stored source gives the AL2023 release versions (<patch>-<date>) of the pinned AMI
        # releases, so none is pinned for the operator.
        yield (f"cluster.systemNodeGroup.releaseVersion is not set: the system nodes keep the AMI EKS picked at creation "
               f"(no kernel/containerd patches until the next minor upgrade). Read the current one with "
               f"`aws ssm get-parameter --name {ssm}` and set it (docs/runbooks/upgrading-eks.md, AMI patches)")
    else:
        date = ami_release_date("v" + node_release.rsplit("-", 1)[1])
        if date is not None and (today - date).days > AMI_ALIAS_MAX_AGE_DAYS:
            yield (f"system node group AMI release {node_release} is {(today - date).days} days old "
                   f"(> {AMI_ALIAS_MAX_AGE_DAYS}): move cluster.systemNodeGroup.releaseVersion to the current "
                   f"`aws ssm get-parameter --name {ssm}`")
    if (today - release.verified).days > VERSION_ROW_MAX_AGE_DAYS:
        yield (f"the EKS {config.cluster.version} add-on builds (catalog/versions.py EKS_RELEASES) were last checked "
               f"{release.verified} ({(today - release.verified).days} days ago): compare with `aws eks describe-addon-versions "
               f"--kubernetes-version {config.cluster.version}` and bump them")


def _egress(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    nat = config.network.nat.value
    if nat == "none":
        yield ("network.nat is none: nodes reach only VPC endpoints; images from public registries "
               "(Docker Hub, nvcr.io, ghcr.io) and Hugging Face cannot be pulled.")
    if nat == "single" and config.is_prod:
        yield "network.nat is single in prod: one AZ outage cuts internet egress for every node. Use one_per_az."


def _public_endpoint(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    if config.cluster.public_access_cidrs:
        cidrs = ", ".join(str(c) for c in config.cluster.public_access_cidrs)
        yield f"the Kubernetes API endpoint is public for {cidrs} (private access stays on)."


def _wiring(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    for resource in recording.resources:
        if resource.custom and resource.package in ("aws", "kubernetes") and not resource.is_provider:
            if resource.provider is None:
                yield f"ERROR {resource.type} {resource.name} has no explicit provider."


def _dev_object_lock(config: PlatformConfig, recording: Recording):
    if not config.is_prod and config.object_lock_retention_days:
        yield (f"logArchive.objectLockRetentionDays is set in {config.environment.value}: `pulumi destroy` cannot delete "
               f"archived logs for {config.object_lock_retention_days} days (GOVERNANCE mode needs s3:BypassGovernanceRetention)")



def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    for check in (_eks_support, _version_age, _egress, _public_endpoint, _wiring, _dev_object_lock):
        yield from check(config, recording)


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.eks_control_plane(recording, today)
    yield from costs.static_nodes(recording)
    yield from costs.network(recording)
    yield from costs.storage_and_keys(recording)
    yield from costs.observability(recording)


FOUNDATION = Capability("foundation", deploy=deploy, plan_sections=plan_sections, warnings=warnings, cost_lines=cost_lines,
                        log_group_names=log_group_names)
