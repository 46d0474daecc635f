"""The ``network`` section: the multi-AZ VPC, NAT and endpoints; its rules."""
from __future__ import annotations

from typing import Any, Iterator, Optional

from pydantic import Field, field_validator

from components.network import NatStrategy, subnet_problems
from components.network import NetworkArgs
from workloads.problems import Problem
from infra.config.common import Cidr, Environment, _Model
from infra.config.engine import Rule, invalid


class FlowLogsConfig(_Model):
    traffic_type: str = Field(NetworkArgs.flow_logs_traffic_type, pattern="^(ALL|ACCEPT|REJECT)$")
    max_aggregation_interval_seconds: int = Field(NetworkArgs.flow_logs_max_aggregation_interval_seconds, description="60 or 600.")

    @field_validator("max_aggregation_interval_seconds")
    @classmethod
    def _interval(cls, value: int) -> int:
        if value not in (60, 600):
            raise invalid("is not an aggregation interval VPC Flow Logs accepts", "use 60 or 600")
        return value


class NetworkConfig(_Model):
    """Multi-AZ VPC. Subnet CIDRs are listed one per AZ, in the order of the AZs."""

    cidr: Cidr = Field(description="VPC CIDR, /16 to /24.")
    availability_zones: list[str] = Field(description="At least 2 AZ names of the region (e.g. us-west-2a).")
    private_subnet_cidrs: list[Cidr] = Field(description="One per AZ; nodes and pods live here, size them for GPU pods.")
    public_subnet_cidrs: list[Cidr] = Field(description="One per AZ; NAT gateways and internet-facing load balancers.")
    nat: NatStrategy = Field(NetworkArgs.nat, description="none | single | one_per_az.")
    interface_endpoints: Optional[bool] = Field(None, description=(
        "ECR api+dkr, STS, CloudWatch Logs, SQS, EC2 endpoints (about $88/month with 2 AZs). Default: on in prod, "
        "off in dev (traffic goes through the NAT gateway)."))
    flow_logs: FlowLogsConfig = Field(default_factory=FlowLogsConfig)

    def args(self, *, interface_endpoints: bool, **wiring: Any) -> NetworkArgs:
        """``interface_endpoints``: the stack's resolved choice (PlatformConfig.interface_endpoints:
        unset here means on in prod), required so an unset value never reaches the Args as None."""
        return self.copy_into(NetworkArgs, interface_endpoints=interface_endpoints,
                              flow_logs_traffic_type=self.flow_logs.traffic_type,
                              flow_logs_max_aggregation_interval_seconds=self.flow_logs.max_aggregation_interval_seconds,
                              **wiring)


def _network_rules(region, cidr, availability_zones, private_subnet_cidrs, public_subnet_cidrs, nat) -> Iterator[Problem]:
    yield from subnet_problems(
        "network",
        vpc_cidr=cidr,
        availability_zones=availability_zones,
        private_subnet_cidrs=private_subnet_cidrs,
        public_subnet_cidrs=public_subnet_cidrs,
        nat=nat,
        region=region,
    )


def _private_egress(environment: Environment, nat: NatStrategy, interface_endpoints: Optional[bool]) -> Iterator[Problem]:
    endpoints = environment is Environment.PROD if interface_endpoints is None else interface_endpoints
    if nat is NatStrategy.NONE and not endpoints:
        why = "is off" if interface_endpoints is False else f"defaults to off in {environment.value}"
        yield Problem("network.interfaceEndpoints", interface_endpoints,
                      f"with nat: none and no interface endpoints nodes reach neither ECR, STS nor EC2 (it {why})",
                      "set network.interfaceEndpoints: true, or choose nat: single")


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("region", "network.cidr", "network.availabilityZones", "network.privateSubnetCidrs", "network.publicSubnetCidrs", "network.nat"), _network_rules),
    Rule(("environment", "network.nat", "network.interfaceEndpoints"), _private_egress),
)
