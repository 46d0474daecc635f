"""Capability: tracking (MLflow on ECS Fargate + Aurora, its image repositories, ALB access logs).

config -> components. Every team namespace (``scheduling.teams``) gets an MLflow user and Secret.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

import pulumi

from components.images import ImageRepositories, ImageRepositoriesArgs
from components.log_archive import AlbAccessLogs
from components.mlflow_server import APP_DATABASE_USER
from components.tracking import (
    service_log_group_names,
    MASTER_USERNAME,
    ROTATION_EXCEPTIONS,
    DatabaseArgs,
    Tracking,
    TrackingArgs,
)
from catalog.versions import AURORA_POSTGRESQL_VERSION
from infra import costs
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform

SECTION = "Tracking"


def tracking_name(config: PlatformConfig) -> str:
    return f"{config.name}-mlflow"


def log_group_names(config: PlatformConfig) -> list[str]:
    """CloudWatch log groups this capability creates (the platform's log key must admit them)."""
    if config.tracking is None:
        return []
    # components.tracking names its group /ecs/<name>.
    return [f"/ecs/{tracking_name(config)}", *service_log_group_names(tracking_name(config)).values()]


def image_repository_names(config: PlatformConfig) -> dict[str, str]:
    """ECR repositories (automation account) for the images the stack runs that are ours: the MLflow
    server, the trainer and, with GPU pools, the GPU readiness agent (docker/node-health), whose
    DaemonSet every GPU node waits for (gpuEnablement.nodeHealthImage)."""
    names = {"mlflow": f"{config.name}/mlflow", "trainer": f"{config.name}/trainer"}
    if config.gpu_pools:
        names["node-health"] = f"{config.name}/node-health"
    return names


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    if config.tracking is None:
        return {}
    tracking_config = config.tracking
    tags = config.resource_tags
    images = ImageRepositories(
        f"{config.name}-images",
        ImageRepositoriesArgs(
            repository_names=image_repository_names(config),
            puller_account_ids=[config.accounts.workload.id],
            untagged_expiration_days=tracking_config.ecr_untagged_expiration_days,
            protect=config.protect_stateful, tags=tags,
        ),
        opts=pulumi.ResourceOptions(providers={"aws": platform.providers.automation}),
    )
    alb_logs = AlbAccessLogs(
        f"{config.name}-alb-logs", writer_account_ids=[config.accounts.workload.id],
        expiration_days=tracking_config.alb_log_expiration_days, protect=config.protect_stateful, tags=tags,
        region=config.region,
        opts=pulumi.ResourceOptions(providers={"aws": platform.providers.logging}),
    )
    database = tracking_config.database
    tracking = Tracking(
        tracking_name(config),
        tracking_config.copy_into(
            TrackingArgs, network=platform.network, cluster=platform.cluster,
            namespaces=config.team_namespaces, namespace_resources=platform.team_namespace_resources(),
            # prod: a reader in a second AZ takes over when the writer fails
            database=database.copy_into(DatabaseArgs, num_instances=2 if config.is_prod else 1),
            image_repository_arn=images.repositories["mlflow"].arn,
            scheme=tracking_config.load_balancer_scheme,
            artifacts_lifecycle=[tracking_config.artifacts_bucket.rule("artifacts")],
            # S3 delivers server access logs only within the source bucket's account.
            access_logs_bucket=platform.access_log_bucket("workload"), alb_logs_bucket=alb_logs.bucket,
            alb_logs_policy=alb_logs.policy,
            log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
            protect=config.protect_stateful, tags=tags,
        ),
        opts=platform.kubernetes_opts(),
    )
    return {
        "mlflowTrackingUri": tracking.tracking_uri,
        "mlflowArtifactsBucket": tracking.artifacts.name,
        "mlflowImageRepository": images.repositories["mlflow"].repository_url,
        "trainerImageRepository": images.repositories["trainer"].repository_url,
        **({"nodeHealthImageRepository": images.repositories["node-health"].repository_url}
           if "node-health" in images.repositories else {}),
        "mlflowCertificateValidation": tracking.certificate.domain_validation_options,
    }


# -- plan: warnings and a section ---------------------------------------------------------------
def _tracking_warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    tr = config.tracking
    if tr is None:
        return
    if tr.route53_zone_id is None:
        yield (f"tracking.route53ZoneId is not set: create the ACM DNS validation record for {tr.domain_name} "
               "(stack output mlflowCertificateValidation) or the HTTPS listeners cannot be created")
    if not config.team_namespaces:
        yield "no team namespaces (scheduling.teams): no namespace gets the FSx claim or the MLflow Secret"
    yield from first_deploy_warnings(config)
    if ROTATION_EXCEPTIONS:
        yield (f"MLflow secrets without automatic rotation (written exceptions, reasons in the '{SECTION}' "
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
    if config.tracking is None:
        return
    tr, db = config.tracking, config.tracking.database
    lines = [
        f"MLflow https://{tr.domain_name} ({tr.load_balancer_scheme.value}), Aurora {db.min_capacity_acu}-"
        f"{db.max_capacity_acu} ACU, pause after {db.seconds_until_auto_pause} s",
        f"MLflow server: {tr.image or 'NOT DEPLOYED (tracking.image unset: push the image first)'}",
        f"Aurora aurora-postgresql created at {AURORA_POSTGRESQL_VERSION}; minor upgrades by AWS "
        "(auto minor upgrade on, engine_version changes ignored)",
        f"Secret db master ({MASTER_USERNAME}): RDS-managed, rotated every 7 days by RDS; read only by the "
        "db-bootstrap container at task start",
        f"Secret db app ({APP_DATABASE_USER}, owner of database mlflow, no superuser/createrole/createdb): "
        f"rotated every {db.password_rotation_days} days (Secrets Manager, single-user function); "
        "the server re-reads it on authentication failure",
    ]
    for secret, reason in ROTATION_EXCEPTIONS.items():
        lines.append(f"Secret {secret}: NOT ROTATED (exception): {reason}")
    lines.append(f"MLflow team users (EDIT on their experiment, READ elsewhere): {', '.join(config.team_namespaces) or 'none'}")
    yield SECTION, lines


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.tracking(recording)


CAPABILITY = Capability("tracking", deploy=deploy, plan_sections=plan_sections, warnings=_tracking_warnings,
                        cost_lines=cost_lines, log_group_names=log_group_names)
