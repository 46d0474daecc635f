"""Prices: the on-demand price source of the instance types (the GPU ones live with their shapes
in catalog/gpus.py), the static CPU node types, the spot assumption, and the unit prices of the
rest of the stack. One table for every cost figure the platform prints (job preflight, the plan's
cost report, the EKS upgrade calendar).

Instance prices are USD per instance-hour, Linux, us-east-1 and us-west-2 (the same in both), from
the EC2 On-Demand pricing page after AWS's June 2025 GPU price reduction ("Announcing up to 45%
price reduction for Amazon EC2 NVIDIA GPU-accelerated instances", 2025-06-05). They were recorded
offline: check them against the page before quoting a budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from catalog.gpus import instance_shapes

SOURCE_URL = "https://aws.amazon.com/ec2/pricing/on-demand/"
PRICES_AS_OF = "2025-06 price list (recorded 2026-11)"
REGIONS = ("us-east-1", "us-west-2")

# Spot prices move with supply and demand (https://aws.amazon.com/ec2/spot/pricing/); GPU spot
# capacity has traded at roughly 50-70% below on-demand. Cost estimates assume this discount
# and say so; the interruptions it buys are what the checkpoint time budget is for.
SPOT_DISCOUNT = 0.60


@dataclass(frozen=True)
class InstancePrice:
    instance_type: str
    on_demand_usd_per_hour: float
    source: str = SOURCE_URL
    as_of: str = PRICES_AS_OF

    @property
    def spot_usd_per_hour(self) -> float:
        return round(self.on_demand_usd_per_hour * (1 - SPOT_DISCOUNT), 4)

    @property
    def reserved_usd_per_hour(self) -> float:
        """What a reserved instance-hour is billed. An On-Demand Capacity Reservation is billed at
        the on-demand rate for as long as it exists, used or not (EC2 User Guide, "Capacity
        Reservation pricing and billing"), so a job that runs in it costs nothing more; Capacity
        Blocks for ML (also cr-... ids, which Karpenter selects the same way) are paid up front at
        the block's price, which the reservation, not this table, records."""
        return self.on_demand_usd_per_hour


# On-demand prices of the CPU instance types the stacks' static node groups use (same page and date).
CPU_ON_DEMAND_USD_PER_HOUR: Mapping[str, float] = {
    "m7i.large": 0.1008, "m7i.xlarge": 0.2016, "m7i.2xlarge": 0.4032,
    "m6i.large": 0.096, "m6i.xlarge": 0.192, "m6i.2xlarge": 0.384,
    "t3.medium": 0.0416, "t3.large": 0.0832, "m5.large": 0.096, "m5.xlarge": 0.192,
}

PRICES: Mapping[str, InstancePrice] = {
    **{name: InstancePrice(name, shape.on_demand_usd_per_hour) for name, shape in instance_shapes().items()},
    **{name: InstancePrice(name, usd) for name, usd in CPU_ON_DEMAND_USD_PER_HOUR.items()},
}


def price(instance_type: str) -> InstancePrice:
    try:
        return PRICES[instance_type]
    except KeyError:
        raise KeyError(f"no price for {instance_type!r}; add it to catalog/gpus.py (GPU shapes) or "
                       "catalog/prices.py (CPU types) with its source") from None


# -- the rest of the stack: unit prices of what runs while no job does ---------------------------
# us-east-1 / us-west-2 list prices (the same in both), USD, from each service's public pricing
# page as recorded on the date below. The offline plan's cost report multiplies these by what
# the recorded graph creates (infra/costs.py); check them before quoting a budget.
STACK_PRICES_AS_OF = "2026-11"
HOURS_PER_MONTH = 730  # AWS's own monthly estimates use 730 hours


@dataclass(frozen=True)
class UnitPrice:
    usd: float
    unit: str
    source: str
    as_of: str = STACK_PRICES_AS_OF


STACK_PRICES: Mapping[str, UnitPrice] = {
    "eks_standard_hour": UnitPrice(0.10, "cluster-hour (standard support)", "https://aws.amazon.com/eks/pricing/"),
    "eks_extended_hour": UnitPrice(0.60, "cluster-hour (extended support)", "https://aws.amazon.com/eks/pricing/"),
    "nat_gateway_hour": UnitPrice(0.045, "NAT gateway-hour", "https://aws.amazon.com/vpc/pricing/"),
    "nat_gateway_gb": UnitPrice(0.045, "GB processed by a NAT gateway", "https://aws.amazon.com/vpc/pricing/"),
    "public_ipv4_hour": UnitPrice(0.005, "public IPv4 address-hour", "https://aws.amazon.com/vpc/pricing/"),
    "interface_endpoint_hour": UnitPrice(0.01, "interface endpoint ENI-hour (per AZ)", "https://aws.amazon.com/privatelink/pricing/"),
    "alb_hour": UnitPrice(0.0225, "Application Load Balancer-hour", "https://aws.amazon.com/elasticloadbalancing/pricing/"),
    "alb_lcu_hour": UnitPrice(0.008, "LCU-hour", "https://aws.amazon.com/elasticloadbalancing/pricing/"),
    "aurora_serverless_v2_acu_hour": UnitPrice(0.12, "ACU-hour (Aurora Standard)", "https://aws.amazon.com/rds/aurora/pricing/"),
    "aurora_storage_gb_month": UnitPrice(0.10, "GB-month of Aurora storage", "https://aws.amazon.com/rds/aurora/pricing/"),
    "fsx_lustre_p2_125_gb_month": UnitPrice(0.145, "GB-month, PERSISTENT_2 125 MB/s/TiB", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_lustre_p2_250_gb_month": UnitPrice(0.210, "GB-month, PERSISTENT_2 250 MB/s/TiB", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_lustre_p2_500_gb_month": UnitPrice(0.340, "GB-month, PERSISTENT_2 500 MB/s/TiB", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fsx_lustre_p2_1000_gb_month": UnitPrice(0.600, "GB-month, PERSISTENT_2 1000 MB/s/TiB", "https://aws.amazon.com/fsx/lustre/pricing/"),
    "fargate_vcpu_hour": UnitPrice(0.04048, "vCPU-hour (Linux/x86)", "https://aws.amazon.com/fargate/pricing/"),
    "fargate_gb_hour": UnitPrice(0.004445, "GB-hour (Linux/x86)", "https://aws.amazon.com/fargate/pricing/"),
    "ebs_gp3_gb_month": UnitPrice(0.08, "GB-month of gp3", "https://aws.amazon.com/ebs/pricing/"),
    "s3_standard_gb_month": UnitPrice(0.023, "GB-month of S3 Standard (first 50 TB)", "https://aws.amazon.com/s3/pricing/"),
    "kms_key_month": UnitPrice(1.00, "customer-managed key-month", "https://aws.amazon.com/kms/pricing/"),
    "secret_month": UnitPrice(0.40, "secret-month", "https://aws.amazon.com/secrets-manager/pricing/"),
    "cloudwatch_alarm_metric_month": UnitPrice(0.10, "standard-resolution alarm metric-month", "https://aws.amazon.com/cloudwatch/pricing/"),
    # First 25 hosted zones of an account.
    "route53_hosted_zone_month": UnitPrice(0.50, "hosted zone-month", "https://aws.amazon.com/route53/pricing/"),
    # Standard log class, after the free tier's 5 GB/month.
    # Amazon Managed Service for Prometheus: ingestion tiers per 10 million samples (first 2
    # billion samples a month, then the next 250 billion), storage per GB-month.
    "amp_ingest_first_2b_10m_samples": UnitPrice(0.90, "10M samples ingested (first 2B/month)", "https://aws.amazon.com/prometheus/pricing/"),
    "amp_ingest_next_250b_10m_samples": UnitPrice(0.35, "10M samples ingested (next 250B/month)", "https://aws.amazon.com/prometheus/pricing/"),
    "amp_storage_gb_month": UnitPrice(0.03, "GB-month of AMP metric storage", "https://aws.amazon.com/prometheus/pricing/"),
    "cloudwatch_logs_ingest_gb": UnitPrice(0.50, "GB ingested into CloudWatch Logs (standard)", "https://aws.amazon.com/cloudwatch/pricing/"),
    "cloudwatch_logs_storage_gb_month": UnitPrice(0.03, "GB-month of CloudWatch Logs storage", "https://aws.amazon.com/cloudwatch/pricing/"),
    "firehose_ingest_gb": UnitPrice(0.029, "GB ingested by Firehose (Direct PUT, first 500 TB)", "https://aws.amazon.com/firehose/pricing/"),
    # EFS Standard storage (Regional), us-east-1/us-west-2; elastic throughput is billed per GB
    # read/written ($0.03/$0.06), nothing while idle.
    "efs_standard_gb_month": UnitPrice(0.30, "GB-month of EFS Standard storage", "https://aws.amazon.com/efs/pricing/"),
    # Container Insights with enhanced observability for EKS is billed per observation (one metric
    # sample of one entity), tiered; this is the first tier's price.
    "container_insights_observations_million": UnitPrice(
        0.21, "million observations (Container Insights with enhanced observability, first tier)",
        "https://aws.amazon.com/cloudwatch/pricing/"),
    "amg_editor_month": UnitPrice(9.00, "Managed Grafana editor/admin user-month", "https://aws.amazon.com/grafana/pricing/"),
}
