"""AWS partitions and their regions, so a stack's region is checked itself, not guessed from AZs.

Source: botocore 1.43.127 ``botocore/data/endpoints.json`` (``partitions[].regions``), the
table the AWS SDKs and CLI resolve endpoints from; cross-checked by
tests/infra/test_regions.py against the botocore installed with the dev extras. The
isolated partitions (aws-iso*, aws-eusc) are left out: the platform's services (EKS, FSx
for Lustre, Aurora Serverless v2) and its ARNs are only checked for these three.
When AWS opens a region, add it here (the test says which one is missing).
"""
from __future__ import annotations

from typing import Optional

REGIONS_BY_PARTITION: dict[str, tuple[str, ...]] = {
    "aws": (
        "af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
        "ap-south-1", "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4",
        "ap-southeast-5", "ap-southeast-6", "ap-southeast-7", "ca-central-1", "ca-west-1", "eu-central-1",
        "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3",
        "il-central-1", "me-central-1", "me-south-1", "mx-central-1", "sa-east-1", "us-east-1", "us-east-2",
        "us-west-1", "us-west-2",
    ),
    "aws-cn": ("cn-north-1", "cn-northwest-1"),
    "aws-us-gov": ("us-gov-east-1", "us-gov-west-1"),
}

PARTITION_OF_REGION: dict[str, str] = {
    region: partition for partition, regions in REGIONS_BY_PARTITION.items() for region in regions
}


def partition_of(region: str) -> Optional[str]:
    """The partition of a known region, or None."""
    return PARTITION_OF_REGION.get(region)
