"""Multi-AZ VPC for EKS: private/public subnets, NAT, endpoints, flow logs, discovery tags."""
from __future__ import annotations

import json

import ipaddress
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from workloads.problems import Problem, raise_if_any, accepts_enum_values

# AWS services the nodes reach without a NAT hop: image pulls (ECR api + dkr), IRSA/Pod
# Identity tokens (STS), logs, Karpenter's interruption queue (SQS) and EC2 API calls.
INTERFACE_ENDPOINT_SERVICES = ("ecr.api", "ecr.dkr", "sts", "logs", "sqs", "ec2")


class NatStrategy(str, Enum):
    """How private subnets reach the internet."""

    NONE = "none"  # only VPC endpoints; image pulls from public registries fail
    SINGLE = "single"  # one NAT gateway: cheap, but one AZ's outage cuts egress for all
    ONE_PER_AZ = "one_per_az"  # one NAT per AZ: no cross-AZ dependency (prod)


def subnet_problems(
    path: str,
    *,
    vpc_cidr: ipaddress.IPv4Network,
    availability_zones: Sequence[str],
    private_subnet_cidrs: Sequence[ipaddress.IPv4Network],
    public_subnet_cidrs: Sequence[ipaddress.IPv4Network],
    nat: NatStrategy,
    region: Optional[str] = None,
) -> Iterator[Problem]:
    """Every problem of a VPC layout: AZ count, CIDR sizes, containment and overlaps."""
    num_azs = len(availability_zones)
    if num_azs < 2:
        yield Problem(f"{path}.availabilityZones", list(availability_zones),
                      "EKS needs subnets in at least 2 availability zones", "list 2 or more AZs of the region")
    if len(set(availability_zones)) != num_azs:
        yield Problem(f"{path}.availabilityZones", list(availability_zones), "AZs are listed more than once",
                      "list each AZ once")
    if region:
        foreign = [az for az in availability_zones if not (az.startswith(region) and len(az) == len(region) + 1)]
        if foreign:
            yield Problem(f"{path}.availabilityZones", foreign, f"are not AZs of region {region}",
                          f"use names such as {region}a, {region}b")
    if not 16 <= vpc_cidr.prefixlen <= 24:
        yield Problem(f"{path}.cidr", str(vpc_cidr), "VPC CIDRs must be between /16 and /24",
                      "use a /16 to /24 block, e.g. 10.0.0.0/16")
    for kind, cidrs in (("private", private_subnet_cidrs), ("public", public_subnet_cidrs)):
        key = f"{path}.{kind}SubnetCidrs"
        if len(cidrs) != num_azs:
            yield Problem(key, [str(c) for c in cidrs],
                          f"there are {len(cidrs)} {kind} subnets for {num_azs} availability zones",
                          "list exactly one CIDR per availability zone, in the same order")
        for index, cidr in enumerate(cidrs):
            if not cidr.subnet_of(vpc_cidr):
                yield Problem(f"{key}[{index}]", str(cidr), f"is outside the VPC CIDR {vpc_cidr}",
                              f"pick a block inside {vpc_cidr}")
            if not 16 <= cidr.prefixlen <= 28:
                yield Problem(f"{key}[{index}]", str(cidr), "subnets must be between /16 and /28",
                              "use a /16 to /28 block")
    labelled = [(f"{path}.privateSubnetCidrs[{i}]", c) for i, c in enumerate(private_subnet_cidrs)]
    labelled += [(f"{path}.publicSubnetCidrs[{i}]", c) for i, c in enumerate(public_subnet_cidrs)]
    for i, (key_a, a) in enumerate(labelled):
        for key_b, b in labelled[i + 1:]:
            if a.overlaps(b):
                yield Problem(key_b, str(b), f"overlaps {key_a} ({a})", "give every subnet its own block")
    if nat is not NatStrategy.NONE and not public_subnet_cidrs:
        yield Problem(f"{path}.nat", nat.value, "NAT gateways live in public subnets, and there are none",
                      "add publicSubnetCidrs or set nat: none")


@accepts_enum_values
@dataclass(frozen=True)
class NetworkArgs:
    """Inputs of ``Network``.

    Attributes:
        cidr: the VPC's IPv4 block.
        availability_zones: AZ names, one private and one public subnet in each.
        private_subnet_cidrs / public_subnet_cidrs: one block per AZ, same order.
        nat: NAT strategy (see ``NatStrategy``).
        interface_endpoints: create the ``INTERFACE_ENDPOINT_SERVICES`` endpoints.
        cluster_name: tagged on private subnets for Karpenter discovery and on all subnets
            for the AWS Load Balancer Controller.
        flow_logs_bucket: bucket (usually the log archive's) receiving VPC flow logs.
        flow_logs_prefix: key prefix of the flow logs in that bucket (no slashes at the ends).
        flow_logs_bucket_policy: the bucket policy that admits the flow log; creation fails
            (and nothing is delivered) until it exists, so the flow log waits for it.
        flow_logs_traffic_type / flow_logs_max_aggregation_interval_seconds: flow log knobs.
        tags: tags on every taggable child.
    """

    cidr: str
    availability_zones: Sequence[str]
    private_subnet_cidrs: Sequence[str]
    public_subnet_cidrs: Sequence[str]
    cluster_name: str
    flow_logs_bucket: aws.s3.Bucket
    nat: NatStrategy = NatStrategy.SINGLE
    interface_endpoints: bool = True
    flow_logs_prefix: str = "vpc-flow-logs"
    flow_logs_bucket_policy: Optional[pulumi.Resource] = None
    flow_logs_traffic_type: str = "ALL"
    flow_logs_max_aggregation_interval_seconds: int = 600
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cidr_problems = [
            Problem(f"NetworkArgs.{key}", value, "is not an IPv4 network CIDR", "use a block such as 10.0.0.0/16")
            for key, values in (("cidr", [self.cidr]), ("private_subnet_cidrs", self.private_subnet_cidrs),
                                ("public_subnet_cidrs", self.public_subnet_cidrs))
            for value in values if _network(value) is None
        ]
        raise_if_any("NetworkArgs", cidr_problems)
        raise_if_any("NetworkArgs", subnet_problems(
            "NetworkArgs",
            vpc_cidr=ipaddress.IPv4Network(self.cidr),
            availability_zones=self.availability_zones,
            private_subnet_cidrs=[ipaddress.IPv4Network(c) for c in self.private_subnet_cidrs],
            public_subnet_cidrs=[ipaddress.IPv4Network(c) for c in self.public_subnet_cidrs],
            nat=self.nat,
        ))


def _network(value: object) -> Optional[ipaddress.IPv4Network]:
    try:
        return ipaddress.IPv4Network(value)  # strict: host bits set is an error too
    except (ValueError, TypeError):
        return None


def s3_endpoint_policy(account_id: str, region: str) -> dict:
    """S3 gateway endpoint: requests signed by this account's principals, and reads of the ECR
    layer bucket (Amazon ECR User Guide, "Amazon ECR interface VPC endpoints": the gateway
    endpoint's minimum policy must allow ``arn:aws:s3:::prod-<region>-starport-layer-bucket/*``,
    because layers are fetched with URLs ECR signs)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ThisAccountsPrincipals", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
         "Condition": {"StringEquals": {"aws:PrincipalAccount": account_id}}},
        {"Sid": "EcrImageLayers", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::prod-{region}-starport-layer-bucket/*"},
    ]}


def account_endpoint_policy(account_id: str) -> dict:
    """Interface endpoint (STS): only this account's principals."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ThisAccountsPrincipals", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
         "Condition": {"StringEquals": {"aws:PrincipalAccount": account_id}}}]}


class Network(pulumi.ComponentResource):
    """A VPC laid out for EKS and Karpenter.

    Private subnets carry ``karpenter.sh/discovery`` and ``kubernetes.io/role/internal-elb``.
    Public subnets carry no ``kubernetes.io/role/elb``: the MLflow ALB names its subnets, and
    without the tag a ``Service type: LoadBalancer`` finds no public subnet to become internet-facing
    in (team namespaces also refuse that Service type). The default security group is emptied
    so nothing lands in it by accident.
    """

    vpc: aws.ec2.Vpc
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:network:Network", name, None, opts)
        self.args = args

        def tags(suffix: str, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
            return {**args.tags, "Name": f"{name}-{suffix}", **(extra or {})}

        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc", cidr_block=args.cidr, enable_dns_hostnames=True, enable_dns_support=True,
            tags=tags("vpc"), opts=pulumi.ResourceOptions(parent=self),
        )
        vpc_child = pulumi.ResourceOptions(parent=self.vpc)
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=self.vpc.id, ingress=[], egress=[],
                                     tags=tags("default-sg"), opts=vpc_child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=tags("igw"), opts=vpc_child)
        self._subnets(name, tags, vpc_child, igw)
        self.private_route_tables = self._private_route_tables(name, tags, vpc_child,
                                                               self._nat_gateways(name, tags, vpc_child, igw))
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self)).region
        self.s3_endpoint = self._s3_endpoint(name, tags, vpc_child, region)
        self.endpoint_security_group: Optional[aws.ec2.SecurityGroup] = None
        if args.interface_endpoints:
            self._interface_endpoints(name, tags, vpc_child, region)
        self.flow_log = self._flow_log(name, tags)

        self.vpc_id = self.vpc.id
        self.vpc_cidr = self.vpc.cidr_block
        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in self.private_subnets])
        self.public_subnet_ids = pulumi.Output.all(*[s.id for s in self.public_subnets])
        self.register_outputs({
            "vpc_id": self.vpc_id,
            "private_subnet_ids": self.private_subnet_ids,
            "public_subnet_ids": self.public_subnet_ids,
        })

    def _subnets(self, name, tags, opts, igw) -> None:
        """A public and a private subnet per AZ; the public ones route to the internet gateway."""
        args = self.args
        public_rt = aws.ec2.RouteTable(
            f"{name}-public-rt", vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}], tags=tags("public-rt"), opts=opts,
        )
        self.public_subnets: list[aws.ec2.Subnet] = []
        self.private_subnets: list[aws.ec2.Subnet] = []
        for index, az in enumerate(args.availability_zones):
            suffix = az[-1]
            public = aws.ec2.Subnet(
                f"{name}-public-{suffix}", vpc_id=self.vpc.id, availability_zone=az,
                cidr_block=args.public_subnet_cidrs[index], map_public_ip_on_launch=False,
                tags=tags(f"public-{suffix}", {"subnet-tier": "public"}),
                opts=opts,
            )
            aws.ec2.RouteTableAssociation(f"{name}-public-{suffix}-rta", subnet_id=public.id,
                                          route_table_id=public_rt.id, opts=pulumi.ResourceOptions(parent=public))
            private = aws.ec2.Subnet(
                f"{name}-private-{suffix}", vpc_id=self.vpc.id, availability_zone=az,
                cidr_block=args.private_subnet_cidrs[index],
                tags=tags(f"private-{suffix}", {
                    "kubernetes.io/role/internal-elb": "1",
                    "karpenter.sh/discovery": args.cluster_name,
                    "subnet-tier": "private",
                }),
                opts=opts,
            )
            self.public_subnets.append(public)
            self.private_subnets.append(private)

    def _private_route_tables(self, name, tags, opts, nat_gateways) -> list[aws.ec2.RouteTable]:
        """A route table per private subnet: the default route through its AZ's NAT gateway (or the one)."""
        tables = []
        for index, (az, private) in enumerate(zip(self.args.availability_zones, self.private_subnets)):
            suffix = az[-1]
            routes = []
            if nat_gateways:
                nat = nat_gateways[index] if self.args.nat is NatStrategy.ONE_PER_AZ else nat_gateways[0]
                routes = [{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}]
            rt = aws.ec2.RouteTable(f"{name}-private-{suffix}-rt", vpc_id=self.vpc.id, routes=routes,
                                    tags=tags(f"private-{suffix}-rt"), opts=opts)
            aws.ec2.RouteTableAssociation(f"{name}-private-{suffix}-rta", subnet_id=private.id,
                                          route_table_id=rt.id, opts=pulumi.ResourceOptions(parent=private))
            tables.append(rt)
        return tables

    def _s3_endpoint(self, name, tags, opts, region) -> aws.ec2.VpcEndpoint:
        """S3 traffic (datasets, checkpoints, FSx imports) must not pay NAT data processing."""
        return aws.ec2.VpcEndpoint(
            f"{name}-s3-endpoint", vpc_id=self.vpc.id, vpc_endpoint_type="Gateway",
            service_name=pulumi.Output.concat("com.amazonaws.", region, ".s3"),
            route_table_ids=[rt.id for rt in self.private_route_tables], tags=tags("s3-endpoint"), opts=opts,
            # Only this account's principals (a pod holding someone else's keys cannot write to
            # their bucket through it), plus the ECR layer bucket image pulls read.
            policy=pulumi.Output.all(self._account_id(), region).apply(lambda v: json.dumps(s3_endpoint_policy(v[0], v[1]))),
        )

    def _flow_log(self, name, tags) -> aws.ec2.FlowLog:
        args = self.args
        return aws.ec2.FlowLog(
            f"{name}-flow-log", vpc_id=self.vpc.id, traffic_type=args.flow_logs_traffic_type,
            log_destination_type="s3",
            # Objects land under <prefix>/AWSLogs/aws-account-id=<id>/aws-service=vpcflowlogs/...
            # (Hive-compatible partitions; VPC User Guide, "Flow log files" for S3).
            log_destination=pulumi.Output.concat(args.flow_logs_bucket.arn, "/", args.flow_logs_prefix.strip("/")),
            max_aggregation_interval=args.flow_logs_max_aggregation_interval_seconds,
            destination_options={"file_format": "parquet", "per_hour_partition": True, "hive_compatible_partitions": True},
            tags=tags("flow-log"),
            opts=pulumi.ResourceOptions(parent=self.vpc, depends_on=[args.flow_logs_bucket_policy] if args.flow_logs_bucket_policy else None),
        )

    def _nat_gateways(self, name, tags, opts, igw) -> list[aws.ec2.NatGateway]:
        if self.args.nat is NatStrategy.NONE:
            return []
        count = len(self.public_subnets) if self.args.nat is NatStrategy.ONE_PER_AZ else 1
        gateways = []
        for az, public in list(zip(self.args.availability_zones, self.public_subnets))[:count]:
            suffix = az[-1]
            eip = aws.ec2.Eip(f"{name}-nat-{suffix}-eip", domain="vpc", tags=tags(f"nat-{suffix}-eip"), opts=opts)
            gateways.append(aws.ec2.NatGateway(
                f"{name}-nat-{suffix}", allocation_id=eip.id, subnet_id=public.id, tags=tags(f"nat-{suffix}"),
                opts=pulumi.ResourceOptions(parent=self.vpc, depends_on=[igw]),
            ))
        return gateways

    def _account_id(self) -> pulumi.Output[str]:
        return aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id

    def _interface_endpoints(self, name, tags, opts, region) -> None:
        self.endpoint_security_group = aws.ec2.SecurityGroup(
            f"{name}-endpoints-sg", vpc_id=self.vpc.id, description="HTTPS from the VPC to AWS interface endpoints",
            ingress=[{"protocol": "tcp", "from_port": 443, "to_port": 443, "cidr_blocks": [self.args.cidr],
                      "description": "HTTPS from inside the VPC"}],
            egress=[], tags=tags("endpoints-sg"), opts=opts,
        )
        for service in INTERFACE_ENDPOINT_SERVICES:
            aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}-endpoint", vpc_id=self.vpc.id, vpc_endpoint_type="Interface",
                service_name=pulumi.Output.concat("com.amazonaws.", region, f".{service}"),
                private_dns_enabled=True, subnet_ids=[s.id for s in self.private_subnets],
                security_group_ids=[self.endpoint_security_group.id],
                policy=(self._account_id().apply(lambda account: json.dumps(account_endpoint_policy(account)))
                        if service == "sts" else None),
                tags=tags(f"{service.replace('.', '-')}-endpoint"), opts=opts,
            )
