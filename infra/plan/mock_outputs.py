"""Outputs the recording engine fabricates for the resource types whose outputs the platform reads
(ids, ARNs, DNS names): plausible, deterministic values derived from the URN digest.

Owned by ``infra.plan.mock_engine`` (the offline plan and the tests); no production module imports it.
"""
from __future__ import annotations

from typing import Callable

# Offline stand-in for S3's prefix-list ranges (RFC 2544 benchmarking space, never AWS's): the
# recorded NetworkPolicy shows where the real ranges go; a deploy reads them from the endpoint.
MOCK_S3_PREFIX_LIST_CIDRS = ("198.18.0.0/20", "198.18.16.0/20")


def _vpc_endpoint_outputs(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    outputs = {"id": f"vpce-{digest[:17]}"}
    if inputs.get("vpcEndpointType") == "Gateway":
        outputs["cidrBlocks"] = list(MOCK_S3_PREFIX_LIST_CIDRS)
        outputs["prefixListId"] = f"pl-{digest[:8]}"
    return outputs


def _lustre(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    fs_id = f"fs-{digest[:17]}"
    return {"id": fs_id, "dnsName": f"{fs_id}.fsx.{region}.amazonaws.com", "mountName": digest[:8],
            "arn": f"arn:aws:fsx:{region}:{account}:file-system/{fs_id}"}


def _efs(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    fs_id = f"fs-{digest[:17]}"
    return {"id": fs_id, "dnsName": f"{fs_id}.efs.{region}.amazonaws.com",
            "arn": f"arn:aws:elasticfilesystem:{region}:{account}:file-system/{fs_id}"}


def _efs_access_point(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    ap_id = f"fsap-{digest[:17]}"
    return {"id": ap_id, "arn": f"arn:aws:elasticfilesystem:{region}:{account}:access-point/{ap_id}"}


def _aurora(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    ident = inputs.get("clusterIdentifier") or name
    return {"id": ident, "endpoint": f"{ident}.cluster-{digest[:12]}.{region}.rds.amazonaws.com",
            "arn": f"arn:aws:rds:{region}:{account}:cluster:{ident}",
            "masterUserSecrets": [{"secretArn": f"arn:aws:secretsmanager:{region}:{account}:secret:rds!cluster-{digest[:8]}",
                                   "kmsKeyId": inputs.get("masterUserSecretKmsKeyId"), "secretStatus": "active"}]}


def _alb(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    scheme = "internal-" if inputs.get("internal") else ""
    return {"dnsName": f"{scheme}{name[:20]}-{digest[:8]}.{region}.elb.amazonaws.com", "zoneId": "Z1H1FL5HABSF5",
            "arn": f"arn:aws:elasticloadbalancing:{region}:{account}:loadbalancer/app/{name[:20]}/{digest[:16]}"}


def _certificate(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    domain = inputs.get("domainName", "example.com")
    return {"arn": f"arn:aws:acm:{region}:{account}:certificate/{digest[:8]}-{digest[8:12]}",
            "domainValidationOptions": [{"domainName": domain, "resourceRecordName": f"_{digest[:32]}.{domain}.",
                                         "resourceRecordType": "CNAME",
                                         "resourceRecordValue": f"_{digest[32:64]}.acm-validations.aws."}]}


def _ecr(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    repo = inputs.get("name") or name
    return {"repositoryUrl": f"{account}.dkr.ecr.{region}.amazonaws.com/{repo}",
            "arn": f"arn:aws:ecr:{region}:{account}:repository/{repo}"}



def _serverless_app(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    function = inputs.get("parameters", {}).get("functionName", name)
    return {"outputs": {"RotationLambdaARN": f"arn:aws:lambda:{region}:{account}:function:{function}"}}


def _hosted_zone(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    return {"zoneId": f"Z{digest[:20].upper()}"}


def _sns_topic(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    return {"arn": f"arn:aws:sns:{region}:{account}:{inputs.get('name', name)}"}


def _metric_alarm(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    return {"arn": f"arn:aws:cloudwatch:{region}:{account}:alarm:{inputs.get('name', name)}"}


# ARN formats as each service documents them (Service Authorization Reference, "Resource types
# defined by <service>"), for the types the generic ``arn:aws:<module>:...:<type>/<name>`` gets
# wrong: another service prefix (events, elasticloadbalancing), a ":" instead of "/", or a
# generated part. ``ident`` is the resource's mocked id, ``name`` its physical name.
def _secret_suffix(digest: str) -> str:
    # Secrets Manager appends "-" and 6 random characters to the secret's name in its ARN.
    return digest[-6:]


ARN_FORMATS: dict[str, Callable[[str, str, str, str, str, dict], str]] = {
    "aws:secretsmanager/secret:Secret":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:secretsmanager:{region}:{account}:secret:{name}-{_secret_suffix(digest)}",
    "aws:cloudwatch/eventRule:EventRule":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:events:{region}:{account}:rule/{name}",
    "aws:lb/targetGroup:TargetGroup":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:elasticloadbalancing:{region}:{account}:targetgroup/{name}/{digest[:16]}",
    "aws:lb/listener:Listener":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:elasticloadbalancing:{region}:{account}:listener/app/{name[:20]}/{digest[16:32]}/{digest[:16]}",
    "aws:ecs/cluster:Cluster": lambda name, ident, account, region, digest, inputs: f"arn:aws:ecs:{region}:{account}:cluster/{name}",
    "aws:ecs/taskDefinition:TaskDefinition":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:ecs:{region}:{account}:task-definition/{inputs.get('family', name)}:1",
    "aws:lambda/function:Function":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:lambda:{region}:{account}:function:{name}",
    "aws:cloudtrail/trail:Trail":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:cloudtrail:{region}:{account}:trail/{name}",
    "aws:iam/instanceProfile:InstanceProfile":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:iam::{account}:instance-profile/{name}",
    "aws:kms/alias:Alias": lambda name, ident, account, region, digest, inputs: f"arn:aws:kms:{region}:{account}:{name}",
    "aws:rds/clusterInstance:ClusterInstance":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:rds:{region}:{account}:db:{inputs.get('identifier') or name}",
    "aws:rds/subnetGroup:SubnetGroup": lambda name, ident, account, region, digest, inputs: f"arn:aws:rds:{region}:{account}:subgrp:{name}",
    "aws:budgets/budget:Budget": lambda name, ident, account, region, digest, inputs: f"arn:aws:budgets::{account}:budget/{name}",
    "aws:eks/nodeGroup:NodeGroup":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:eks:{region}:{account}:nodegroup/{inputs.get('clusterName')}/{inputs.get('nodeGroupName') or name}/{_uuid(digest)}",
    "aws:eks/addon:Addon":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:eks:{region}:{account}:addon/{inputs.get('clusterName')}/{inputs.get('addonName')}/{_uuid(digest)}",
    "aws:eks/podIdentityAssociation:PodIdentityAssociation":
        lambda name, ident, account, region, digest, inputs:
        f"arn:aws:eks:{region}:{account}:podidentityassociation/{inputs.get('clusterName')}/a-{digest[:17]}",
    "aws:ec2/securityGroup:SecurityGroup":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:security-group/{ident}",
    "aws:ec2/vpc:Vpc": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:vpc/{ident}",
    "aws:ec2/subnet:Subnet": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:subnet/{ident}",
    "aws:ec2/launchTemplate:LaunchTemplate":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:launch-template/{ident}",
    "aws:ec2/routeTable:RouteTable": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:route-table/{ident}",
    "aws:ec2/internetGateway:InternetGateway":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:internet-gateway/{ident}",
    "aws:ec2/natGateway:NatGateway": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:natgateway/{ident}",
    "aws:ec2/vpcEndpoint:VpcEndpoint": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:vpc-endpoint/{ident}",
    "aws:ec2/flowLog:FlowLog": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:vpc-flow-log/{ident}",
    "aws:ec2/eip:Eip": lambda name, ident, account, region, digest, inputs: f"arn:aws:ec2:{region}:{account}:elastic-ip/{ident}",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation":
        lambda name, ident, account, region, digest, inputs: f"arn:aws:fsx:{region}:{account}:association/{ident}",
}


def _uuid(digest: str) -> str:
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


# Read by ``infra.plan.mock_engine`` on top of its generic per-type outputs.
TYPE_OUTPUTS: dict[str, Callable[[str, dict, str, str, str], dict]] = {
    "aws:ec2/vpcEndpoint:VpcEndpoint": _vpc_endpoint_outputs,
    "aws:fsx/lustreFileSystem:LustreFileSystem": _lustre,
    "aws:efs/fileSystem:FileSystem": _efs,
    "aws:efs/accessPoint:AccessPoint": _efs_access_point,
    "aws:rds/cluster:Cluster": _aurora,
    "aws:lb/loadBalancer:LoadBalancer": _alb,
    "aws:acm/certificate:Certificate": _certificate,
    "aws:ecr/repository:Repository": _ecr,
    "aws:serverlessrepository/cloudFormationStack:CloudFormationStack": _serverless_app,
    "aws:route53/zone:Zone": _hosted_zone,
    "aws:sns/topic:Topic": _sns_topic,
    "aws:cloudwatch/metricAlarm:MetricAlarm": _metric_alarm,
}
