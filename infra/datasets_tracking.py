"""Capability: datasets (S3 + FSx for Lustre) and tracking (MLflow on Fargate + Aurora).

config -> components. Team namespaces come from ``datasets.fsx.namespaces`` until the
scheduling capability owns team namespaces.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

import pulumi

from components.datasets import (
    SPOT_NOTICE_SECONDS,
    Datasets,
    DatasetsArgs,
    checkpoint_seconds,
    fsx_log_group_name,
    write_throughput_mb_per_s,
)
from components.images import ImageRepositories, ImageRepositoriesArgs
from components.mlflow_server import APP_DATABASE_USER
from components.tracking import (
    service_log_group_names,
    MASTER_USERNAME,
    ROTATION_EXCEPTIONS,
    AlbAccessLogs,
    DatabaseArgs,
    Tracking,
    TrackingArgs,
)
from components.versions import AURORA_POSTGRESQL_VERSION
from components.versions import addon_versions
from infra import costs
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.mock_engine import Recording
from infra.platform import Platform


def team_namespaces(config: PlatformConfig) -> list[str]:
    """Namespaces that get the FSx claim and the MLflow Secret.

    The scheduling capability's teams (namespace ``team-<name>``) when it is configured;
    ``datasets.fsx.namespaces`` otherwise (a stand-in from before team namespaces existed).
    """
    teams = getattr(getattr(config, "scheduling", None), "teams", None) or []
    if teams:
        return [team.namespace for team in teams]
    return list(config.datasets.fsx.namespaces) if config.datasets else []


def datasets_name(config: PlatformConfig) -> str:
    return f"{config.name}-datasets"


def tracking_name(config: PlatformConfig) -> str:
    return f"{config.name}-mlflow"


def log_group_names(config: PlatformConfig) -> list[str]:
    """CloudWatch log groups this capability creates (the platform's log key must admit them)."""
    names = []
    if config.datasets is not None:
        names.append(fsx_log_group_name(datasets_name(config)))
    if config.tracking is not None:
        names.append(f"/ecs/{tracking_name(config)}")  # components.tracking names its group /ecs/<name>
        names += service_log_group_names(tracking_name(config)).values()
    return names


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    tags = config.resource_tags
    outputs: dict[str, Any] = {}
    namespaces = team_namespaces(config)
    if config.datasets is not None:
        ds = config.datasets
        datasets = Datasets(
            datasets_name(config),
            DatasetsArgs(
                network=platform.network, cluster=platform.cluster,
                fsx=ds.fsx.args(),
                namespaces=namespaces, namespace_resources=platform.team_namespace_resources(),
                access_logs_bucket=platform.access_log_bucket("workload"),
                log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
                datasets_lifecycle=[ds.datasets_bucket.rule("datasets")],
                checkpoints_lifecycle=[ds.checkpoints_bucket.rule("checkpoints")],
                # The build of the cluster's own Kubernetes minor (catalog/versions.py EKS_RELEASES).
                addon_version=addon_versions(config.cluster.version)["aws-fsx-csi-driver"],
                protect=config.protect_stateful, tags=tags,
            ),
            opts=platform.kubernetes_opts(),
        )
        platform.components["datasets"] = datasets
        outputs.update({
            "fsxFileSystemId": datasets.file_system.id,
            "fsxDnsName": datasets.file_system.dns_name,
            "fsxMountName": datasets.file_system.mount_name,
            "datasetsBucket": datasets.buckets[next(iter(datasets.buckets))].name,
            "checkpointsBucket": list(datasets.buckets.values())[1].name,
        })

    if config.tracking is not None:
        tr = config.tracking
        images = ImageRepositories(
            f"{config.name}-images",
            ImageRepositoriesArgs(
                repository_names={"mlflow": f"{config.name}/mlflow", "trainer": f"{config.name}/trainer"},
                puller_account_ids=[config.accounts.workload.id],
                untagged_expiration_days=tr.ecr_untagged_expiration_days,
                protect=config.protect_stateful, tags=tags,
            ),
            opts=pulumi.ResourceOptions(providers={"aws": platform.providers.automation}),
        )
        alb_logs = AlbAccessLogs(
            f"{config.name}-alb-logs", writer_account_ids=[config.accounts.workload.id],
            expiration_days=tr.alb_log_expiration_days, protect=config.protect_stateful, tags=tags,
            region=config.region,
            opts=pulumi.ResourceOptions(providers={"aws": platform.providers.logging}),
        )
        db = tr.database
        tracking = Tracking(
            tracking_name(config),
            tr.copy_into(
                TrackingArgs, network=platform.network, cluster=platform.cluster,
                namespaces=namespaces, namespace_resources=platform.team_namespace_resources(),
                # prod: a reader in a second AZ takes over when the writer fails
                database=db.copy_into(DatabaseArgs, num_instances=2 if config.is_prod else 1),
                image_repository_arn=images.repositories["mlflow"].arn,
                scheme=tr.load_balancer_scheme,
                artifacts_lifecycle=[tr.artifacts_bucket.rule("artifacts")],
                # S3 delivers server access logs only within the source bucket's account.
                access_logs_bucket=platform.access_log_bucket("workload"), alb_logs_bucket=alb_logs.bucket,
                alb_logs_policy=alb_logs.policy,
                log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
                protect=config.protect_stateful, tags=tags,
            ),
            opts=platform.kubernetes_opts(),
        )
        outputs.update({
            "mlflowTrackingUri": tracking.tracking_uri,
            "mlflowArtifactsBucket": tracking.artifacts.name,
            "mlflowImageRepository": images.repositories["mlflow"].repository_url,
            "trainerImageRepository": images.repositories["trainer"].repository_url,
            "mlflowCertificateValidation": tracking.certificate.domain_validation_options,
        })
    return outputs


# -- plan: warnings and a section ---------------------------------------------------------------
def spot_save_warnings(config: PlatformConfig) -> Iterator[str]:
    ds = config.datasets
    if ds is None:
        return
    fsx = ds.fsx
    budget = SPOT_NOTICE_SECONDS - ds.spot_notice_margin_seconds
    seconds = checkpoint_seconds(ds.largest_model_parameters, fsx.storage_capacity_gib,
                                 fsx.per_unit_storage_throughput_mb_per_tib)
    if seconds > budget:
        mb_s = write_throughput_mb_per_s(fsx.storage_capacity_gib, fsx.per_unit_storage_throughput_mb_per_tib)
        yield (f"FSx writes {mb_s:.0f} MB/s ({fsx.storage_capacity_gib} GiB x {fsx.per_unit_storage_throughput_mb_per_tib} "
               f"MB/s/TiB): saving the state of a {ds.largest_model_parameters / 1e9:.1f}B-parameter model (~16 B/param) "
               f"takes ~{seconds:.0f} s, more than the {budget} s left of a spot notice; raise "
               "datasets.fsx.storageCapacityGib or perUnitStorageThroughputMbPerTib, or train it on on-demand capacity")


def cross_az_warnings(config: PlatformConfig) -> Iterator[str]:
    """GPU pools that may launch outside the file system's AZ pay cross-AZ latency and traffic."""
    if config.datasets is None:
        return
    fsx_az = config.network.availability_zones[config.datasets.fsx.subnet_index]
    pools = getattr(config, "gpu_pools", None) or []
    spread = [pool.name for pool in pools if set(pool.zones or config.network.availability_zones) != {fsx_az}]
    if spread:
        yield (f"FSx for Lustre lives in {fsx_az} only; GPU pools {spread} may launch in other AZs and read it "
               f"across AZs (higher latency, $0.01/GB each way): set their zones to [{fsx_az}] for training pools")


def _tracking_warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    tr = config.tracking
    if tr is None:
        return
    if tr.route53_zone_id is None:
        yield (f"tracking.route53ZoneId is not set: create the ACM DNS validation record for {tr.domain_name} "
               "(stack output mlflowCertificateValidation) or the HTTPS listeners cannot be created")
    if not team_namespaces(config):
        yield "no team namespaces (scheduling.teams or datasets.fsx.namespaces): no namespace gets the FSx claim or the MLflow Secret"
    yield from first_deploy_warnings(config)
    if ROTATION_EXCEPTIONS:
        yield (f"MLflow secrets without automatic rotation (written exceptions, reasons in the 'Datasets and tracking' "
               f"section and in each secret's description): {', '.join(ROTATION_EXCEPTIONS)}")


def first_deploy_warnings(config: PlatformConfig) -> Iterator[str]:
    """The MLflow service needs its image in the ECR repository this stack creates."""
    tr = config.tracking
    if tr is None:
        return
    repository = f"{config.accounts.automation.id}.dkr.ecr.{config.region}.amazonaws.com/{config.name}/mlflow"
    if tr.image is None:
        yield (f"tracking.image is not set: the MLflow task definition and ECS service are not created (first deploy "
               f"order, README). After this up: docker build docker/mlflow, push it to {repository} (stack output "
               "mlflowImageRepository), set tracking.image to <repository>@sha256:<digest>, and run up again")


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    lines = []
    if config.datasets is not None:
        fsx = config.datasets.fsx
        lines.append(f"FSx PERSISTENT_2 {fsx.storage_capacity_gib} GiB x {fsx.per_unit_storage_throughput_mb_per_tib} MB/s/TiB "
                     f"= {write_throughput_mb_per_s(fsx.storage_capacity_gib, fsx.per_unit_storage_throughput_mb_per_tib):.0f} MB/s, "
                     f"{len(fsx.data_repository_associations)} DRA(s), PVC in {', '.join(team_namespaces(config)) or 'no namespace'}")
    if config.tracking is not None:
        tr, db = config.tracking, config.tracking.database
        lines.append(f"MLflow https://{tr.domain_name} ({tr.load_balancer_scheme.value}), Aurora {db.min_capacity_acu}-"
                     f"{db.max_capacity_acu} ACU, pause after {db.seconds_until_auto_pause} s")
        lines.append(f"MLflow server: {tr.image or 'NOT DEPLOYED (tracking.image unset: push the image first)'}")
        lines.append(f"Aurora aurora-postgresql created at {AURORA_POSTGRESQL_VERSION}; minor upgrades by AWS "
                     "(auto minor upgrade on, engine_version changes ignored)")
        lines.append(f"Secret db master ({MASTER_USERNAME}): RDS-managed, rotated every 7 days by RDS; read only by the "
                     "db-bootstrap container at task start")
        lines.append(f"Secret db app ({APP_DATABASE_USER}, owner of database mlflow, no superuser/createrole/createdb): "
                     f"rotated every {db.password_rotation_days} days (Secrets Manager, single-user function); "
                     "the server re-reads it on authentication failure")
        for secret, reason in ROTATION_EXCEPTIONS.items():
            lines.append(f"Secret {secret}: NOT ROTATED (exception): {reason}")
        teams = team_namespaces(config)
        lines.append(f"MLflow team users (EDIT on their experiment, READ elsewhere): {', '.join(teams) or 'none'}")
    if lines:
        yield "Datasets and tracking", lines


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    yield from spot_save_warnings(config)
    yield from cross_az_warnings(config)
    yield from _tracking_warnings(config, recording)


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.tracking(recording)
    yield from costs.file_systems(recording)


CAPABILITY = Capability("datasets and tracking", deploy=deploy, plan_sections=plan_sections, warnings=warnings,
                        cost_lines=cost_lines)
