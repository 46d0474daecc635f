"""On-demand prices of the GPU instance types, with their source and date, and the spot assumption.

One table for every cost figure the platform prints (job preflight today; the operations issue
extends it to the whole stack). Prices are USD per instance-hour, Linux, us-east-1 and us-west-2
(the same in both), from the EC2 On-Demand pricing page after AWS's June 2025 GPU price reduction
("Announcing up to 45% price reduction for Amazon EC2 NVIDIA GPU-accelerated instances",
2025-06-05). They were recorded offline: check them against the page before quoting a budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


_ON_DEMAND = {
    "p5.48xlarge": 55.04, "p5.4xlarge": 6.88, "p5e.48xlarge": 63.30, "p5en.48xlarge": 63.30,
    "p4d.24xlarge": 21.96, "p4de.24xlarge": 27.45,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.16xlarge": 3.3968,
    "g6.12xlarge": 4.6016, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.16xlarge": 4.096,
    "g5.12xlarge": 5.672, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
    "g6e.16xlarge": 7.57719, "g6e.12xlarge": 10.49264, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
}

PRICES: Mapping[str, InstancePrice] = {k: InstancePrice(k, v) for k, v in _ON_DEMAND.items()}


def price(instance_type: str) -> InstancePrice:
    try:
        return PRICES[instance_type]
    except KeyError:
        raise KeyError(f"no price for {instance_type!r}; add it to workloads/prices.py with its source") from None
