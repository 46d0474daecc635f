"""The region table matches the endpoint data the AWS SDKs resolve regions from (botocore)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.regions import REGIONS_BY_PARTITION, partition_of


def botocore_partitions() -> dict[str, set[str]]:
    botocore = pytest.importorskip("botocore")
    data = json.loads((Path(botocore.__file__).parent / "data" / "endpoints.json").read_text())
    return {p["partition"]: set(p["regions"]) for p in data["partitions"]}


@pytest.mark.parametrize("partition", sorted(REGIONS_BY_PARTITION))
def test_every_region_of_the_partition_and_no_other(partition):
    upstream = botocore_partitions()[partition]
    ours = set(REGIONS_BY_PARTITION[partition])
    assert ours - upstream == set(), "regions AWS does not list"
    assert upstream - ours == set(), "AWS opened a region: add it to catalog/regions.py"


def test_partition_of():
    assert partition_of("us-west-2") == "aws"
    assert partition_of("cn-north-1") == "aws-cn"
    assert partition_of("us-gov-west-1") == "aws-us-gov"
    assert partition_of("us-west-9") is None and partition_of("us-iso-east-1") is None
