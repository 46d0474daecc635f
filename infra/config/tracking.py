"""The ``tracking`` section: MLflow on Fargate with Aurora behind HTTPS load balancers; its rules."""
from __future__ import annotations

from typing import Annotated, Iterator, Optional

from pydantic import Field, field_validator

from components.images import ImageRepositoriesArgs
from components.tracking import LoadBalancerScheme, tracking_problems
from components.tracking import DatabaseArgs, TrackingArgs
from workloads.problems import Problem
from catalog import limits
from infra.config.common import (
    check_log_retention, prod_retention_rule, Cidr, DomainName, Environment, ImageRef, ZoneId, _Model, _exposure,
)
from infra.config.datasets import BucketLifecycleConfig, bucket_lifecycle_problems
from infra.config.engine import Rule
from infra.config.common import at_most


class TrackingDatabaseConfig(_Model):
    """Aurora PostgreSQL Serverless v2 behind MLflow."""

    min_capacity_acu: Annotated[float, at_most(limits.AURORA_SERVERLESS_V2_MAX_ACU)] = Field(DatabaseArgs.min_capacity_acu, description="0 lets the cluster pause when idle.")
    max_capacity_acu: Annotated[float, at_most(limits.AURORA_SERVERLESS_V2_MAX_ACU)] = Field(DatabaseArgs.max_capacity_acu, description="At most 256.")
    seconds_until_auto_pause: Optional[int] = Field(DatabaseArgs.seconds_until_auto_pause, description="300-86400; only with minCapacityAcu 0.")
    backup_retention_days: Annotated[int, at_most(limits.RDS_BACKUP_RETENTION_DAYS)] = Field(DatabaseArgs.backup_retention_days, ge=1)
    password_rotation_days: int = Field(DatabaseArgs.password_rotation_days, description="Rotation period of the MLflow server's own database password (1-1000).")


class TrackingConfig(_Model):
    """MLflow on ECS Fargate with Aurora, behind HTTPS load balancers."""

    image: Optional[ImageRef] = Field(None, description="MLflow server image built from docker/mlflow; repo@sha256:... in prod. "
                                 "Unset on a first deploy (no ECS service until the image is pushed; README First deploy order).")
    domain_name: DomainName = Field(description="Tracking host name, e.g. mlflow.dev.example.com.")
    route53_zone_id: Optional[ZoneId] = Field(None, description="Public hosted zone for certificate validation (and the public record).")
    load_balancer_scheme: LoadBalancerScheme = Field(TrackingArgs.scheme, description="internal | internet-facing.")
    ingress_cidrs: list[Cidr] = Field(default_factory=list, description="Clients outside the VPC (VPN, office).")
    allow_internet_ingress: bool = Field(False, description=(
        "Named opt-in: lets a prod internet-facing load balancer admit the whole internet (ingressCidrs covering "
        "0.0.0.0/0 together). Refused otherwise."))
    num_workers: int = Field(TrackingArgs.num_workers, ge=1, le=16)
    cpu_units: int = TrackingArgs.cpu_units
    memory_mib: int = TrackingArgs.memory_mib
    desired_count: int = Field(TrackingArgs.desired_count, ge=1, le=10)
    admin_username: str = Field(TrackingArgs.admin_username, pattern=r"^[a-zA-Z][a-zA-Z0-9_.-]{2,63}$")
    log_retention_days: int = Field(TrackingArgs.log_retention_days, description="CloudWatch retention of the MLflow task logs; prod: 365 or more.")
    alb_log_expiration_days: int = Field(90, ge=1)
    ecr_untagged_expiration_days: int = Field(ImageRepositoriesArgs.untagged_expiration_days, ge=1)
    artifacts_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    database: TrackingDatabaseConfig = Field(default_factory=TrackingDatabaseConfig)

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return check_log_retention(value)


def _tracking_rules(environment: Environment, image: Optional[str], db: TrackingDatabaseConfig, scheme, ingress_cidrs,
                    cpu_units: int, memory_mib: int) -> Iterator[Problem]:
    yield from tracking_problems(
        "tracking", is_prod=environment is Environment.PROD, image=image,
        min_capacity_acu=db.min_capacity_acu, max_capacity_acu=db.max_capacity_acu,
        seconds_until_auto_pause=db.seconds_until_auto_pause, scheme=scheme,
        num_ingress_cidrs=len(ingress_cidrs), cpu_units=cpu_units, memory_mib=memory_mib,
        password_rotation_days=db.password_rotation_days,
    )


def _tracking_exposure(environment: Environment, scheme: LoadBalancerScheme, ingress_cidrs, allow_internet_ingress: bool) -> Iterator[Problem]:
    exposed = _exposure("tracking.ingressCidrs", list(ingress_cidrs))
    if not exposed or scheme is not LoadBalancerScheme.INTERNET_FACING:
        return
    at, value, what = exposed
    if environment is Environment.PROD and not allow_internet_ingress:
        yield Problem(at, value, f"admits {what} to the prod internet-facing MLflow load balancer",
                      "list your VPN or office egress CIDRs, use loadBalancerScheme: internal, or set "
                      "tracking.allowInternetIngress: true to accept a public tracking server")


def _artifacts_lifecycle(artifacts_bucket: BucketLifecycleConfig) -> Iterator[Problem]:
    yield from bucket_lifecycle_problems("tracking.artifactsBucket", artifacts_bucket)


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    prod_retention_rule("tracking.logRetentionDays"),
    Rule(("environment", "tracking.image", "tracking.database", "tracking.loadBalancerScheme", "tracking.ingressCidrs", "tracking.cpuUnits", "tracking.memoryMib"), _tracking_rules),
    Rule(("environment", "tracking.loadBalancerScheme", "tracking.ingressCidrs", "tracking.allowInternetIngress"), _tracking_exposure),
    Rule(("tracking.artifactsBucket",), _artifacts_lifecycle),
)
