"""Outputs fabricated for AWS resources and invokes where no AWS account answers: ids, ARNs, DNS
names, the lookups the program makes. Plausible and deterministic: derived from a seed (the URN, and
for a resource created again after a replacement the URN and its generation).

One home for the offline plan's recording engine (``infra.plan.mock_engine``) and the ``aws`` stand-in
provider plugin (``tools/engine/standins``): the first ``pulumi up`` through the stand-in gives the
ids and ARNs the offline plan records. No production module imports it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping, Optional

DEFAULT_ACCOUNT_ID = "000000000000"
DEFAULT_REGION = "us-east-1"

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


def _route53_record(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    """``fqdn``, which the program hands ACM's certificate validation: the record's name in the
    API's normalized form, without the trailing dot (terraform-provider-aws
    internal/service/route53/record.go: ``findResourceRecordSetByFourPartKey`` returns
    ``expandRecordName(recordName, zoneName)``, set as ``fqdn``; the name's StateFunc trims the
    trailing dot ACM's ``resource_record_name`` carries and lower-cases it)."""
    record = str(inputs.get("name") or "")
    return {"fqdn": record.rstrip(".").lower()} if record else {}


def _sns_topic(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    # A topic the program gives no name is autonamed (``autoname``: the seed's digest's first 7).
    return {"arn": f"arn:aws:sns:{region}:{account}:{inputs.get('name') or f'{name}-{digest[:7]}'}"}


def _amp_workspace(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    # The endpoint ends in "/" (terraform-provider-aws internal/service/amp/workspace.go sets
    # ``prometheus_endpoint`` from DescribeWorkspace's ``PrometheusEndpoint``, documented as
    # https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/).
    ident = f"ws-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return {"id": ident, "arn": f"arn:aws:aps:{region}:{account}:workspace/{ident}",
            "prometheusEndpoint": f"https://aps-workspaces.{region}.amazonaws.com/workspaces/{ident}/"}


def _grafana_workspace(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    ident = f"g-{digest[:10]}"
    return {"id": ident, "arn": f"arn:aws:grafana:{region}:{account}:/workspaces/{ident}",
            "endpoint": f"{ident}.grafana-workspace.{region}.amazonaws.com"}


def _metric_alarm(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    return {"arn": f"arn:aws:cloudwatch:{region}:{account}:alarm:{inputs.get('name') or f'{name}-{digest[:7]}'}"}


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


def _with_id(prefix: str) -> Callable[..., dict]:
    def outputs(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
        return {"id": f"{prefix}-{digest[:17]}"}

    return outputs


def _bucket(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    bucket = inputs.get("bucket") or f"{name}-{digest[:7]}"
    return {"id": bucket, "bucket": bucket, "arn": f"arn:aws:s3:::{bucket}",
            "bucketDomainName": f"{bucket}.s3.amazonaws.com", "bucketRegionalDomainName": f"{bucket}.s3.{region}.amazonaws.com"}


def _kms_key(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    key_id = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return {"id": key_id, "keyId": key_id, "arn": f"arn:aws:kms:{region}:{account}:key/{key_id}"}


def _iam_role(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    role = inputs.get("name") or f"{name}-{digest[:7]}"
    return {"id": role, "name": role, "arn": f"arn:aws:iam::{account}:role/{inputs.get('path', '/').strip('/') + '/' if inputs.get('path', '/') != '/' else ''}{role}", "uniqueId": f"AROA{digest[:17].upper()}"}


def _iam_policy(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    policy = inputs.get("name") or f"{name}-{digest[:7]}"
    return {"id": f"arn:aws:iam::{account}:policy/{policy}", "name": policy, "arn": f"arn:aws:iam::{account}:policy/{policy}"}


def _log_group(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    group = inputs.get("name") or f"{name}-{digest[:7]}"
    return {"id": group, "name": group, "arn": f"arn:aws:logs:{region}:{account}:log-group:{group}"}


def _sqs_queue(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    queue = inputs.get("name") or f"{name}-{digest[:7]}"
    return {"id": f"https://sqs.{region}.amazonaws.com/{account}/{queue}", "name": queue, "url": f"https://sqs.{region}.amazonaws.com/{account}/{queue}",
            "arn": f"arn:aws:sqs:{region}:{account}:{queue}"}


def _eks_cluster(name: str, inputs: dict, account: str, region: str, digest: str) -> dict:
    """What EKS reports for a cluster: endpoint, CA, OIDC issuer, the security group EKS creates."""
    cluster_name = inputs.get("name") or f"{name}-{digest[:7]}"
    network = dict(inputs.get("kubernetesNetworkConfig") or {})
    network.setdefault("ipFamily", "ipv4")
    network.setdefault("serviceIpv4Cidr", "172.20.0.0/16")
    return {"id": cluster_name, "name": cluster_name, "arn": f"arn:aws:eks:{region}:{account}:cluster/{cluster_name}",
            "endpoint": f"https://{digest[:32].upper()}.gr7.{region}.eks.amazonaws.com",
            "certificateAuthority": {"data": "bW9jaw=="},
            "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/{digest[:32].upper()}"}]}],
            "vpcConfig": {**(inputs.get("vpcConfig") or {}), "clusterSecurityGroupId": f"sg-{digest[:17]}",
                          "vpcId": f"vpc-{digest[17:34]}"},
            "kubernetesNetworkConfig": network, "status": "ACTIVE", "platformVersion": "eks.1"}


# Per-type outputs on top of the generic ones ``fabricate`` makes.
TYPE_OUTPUTS: dict[str, Callable[[str, dict, str, str, str], dict]] = {
    "aws:ec2/vpc:Vpc": _with_id("vpc"),
    "aws:ec2/subnet:Subnet": _with_id("subnet"),
    "aws:ec2/securityGroup:SecurityGroup": _with_id("sg"),
    "aws:ec2/internetGateway:InternetGateway": _with_id("igw"),
    "aws:ec2/natGateway:NatGateway": _with_id("nat"),
    "aws:ec2/eip:Eip": _with_id("eipalloc"),
    "aws:ec2/routeTable:RouteTable": _with_id("rtb"),
    "aws:ec2/launchTemplate:LaunchTemplate": lambda *a: {**_with_id("lt")(*a), "latestVersion": 1, "defaultVersion": 1},
    "aws:ec2/flowLog:FlowLog": _with_id("fl"),
    "aws:s3/bucket:Bucket": _bucket,
    "aws:kms/key:Key": _kms_key,
    "aws:iam/role:Role": _iam_role,
    "aws:iam/policy:Policy": _iam_policy,
    "aws:cloudwatch/logGroup:LogGroup": _log_group,
    "aws:sqs/queue:Queue": _sqs_queue,
    "aws:eks/cluster:Cluster": _eks_cluster,
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
    "aws:route53/record:Record": _route53_record,
    "aws:sns/topic:Topic": _sns_topic,
    "aws:cloudwatch/metricAlarm:MetricAlarm": _metric_alarm,
    "aws:amp/workspace:Workspace": _amp_workspace,
    "aws:grafana/workspace:Workspace": _grafana_workspace,
}


def digest_of(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def autoname(name: str, seed: str) -> str:
    """A physical name for a resource that gives none: its Pulumi name, ``-`` and seven hex
    characters (pulumi-terraform-bridge autonaming: ``resource.NewUniqueName(seed, name+"-", 7)``)."""
    return f"{name}-{digest_of(seed)[:7]}"


def fabricate(type_: str, name: str, seed: str, inputs: Mapping[str, Any], account: str,
              region: str) -> tuple[str, dict]:
    """The id and outputs a resource of ``type_`` gets: its inputs, plus an id, ARN and name made
    from ``seed`` (the URN: unique within a stack and the same on every run, so ids, and the ARNs
    and names built from them, resolve back to one resource)."""
    inputs = dict(inputs)
    digest = digest_of(seed)
    resource_id = f"{name}-{digest[:8]}"
    outputs = dict(inputs)
    service = type_.split(":")[1].split("/")[0] if ":" in type_ else "mock"
    physical_name = inputs.get("name") or autoname(name, seed)
    outputs.setdefault("arn", f"arn:aws:{service}:{region}:{account}:{type_.split(':')[-1].lower()}/{physical_name}")
    outputs.setdefault("name", physical_name)
    outputs["id"] = resource_id
    special = TYPE_OUTPUTS.get(type_)
    if special:
        outputs.update(special(name, inputs, account, region, digest))
        resource_id = outputs.get("id", resource_id)
    arn_format = ARN_FORMATS.get(type_)
    if arn_format is not None:
        outputs["arn"] = arn_format(outputs.get("name") or physical_name, resource_id, account, region, digest, inputs)
        if type_ == "aws:secretsmanager/secret:Secret":
            resource_id = outputs["arn"]  # a secret's id is its ARN (terraform-provider-aws)
    return resource_id, outputs


def json_or_value(value: Any) -> Any:
    """A JSON-encoded object or list decoded (the SDK sends structured provider config so), else the value."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def account_and_region(provider_inputs: Optional[Mapping[str, Any]]) -> tuple[str, str]:
    """The account and region an ``aws`` provider works in, from its inputs (nested values may be
    JSON-encoded, as the SDKs send provider inputs): the account of the first role it assumes, else
    its only allowed account."""
    if not provider_inputs:
        return DEFAULT_ACCOUNT_ID, DEFAULT_REGION
    region = provider_inputs.get("region") or DEFAULT_REGION
    account = DEFAULT_ACCOUNT_ID
    roles = json_or_value(provider_inputs.get("assumeRoles")) or []
    allowed = json_or_value(provider_inputs.get("allowedAccountIds")) or []
    # A secret inside (an external id) makes the whole list a secret: fall back to allowedAccountIds.
    if isinstance(roles, list) and roles and isinstance(roles[0], dict) and isinstance(roles[0].get("roleArn"), str):
        account = roles[0]["roleArn"].split(":")[4] or account
    elif isinstance(allowed, list) and allowed:
        account = allowed[0]
    return account, region


# The ELB account of each region that writes load balancer access logs (Elastic Load Balancing
# User Guide, "Enable access logs for your Application Load Balancer": regions available before
# August 2022). Regions not listed use the log delivery service principal instead.
_ELB_ACCOUNTS = {"us-east-1": "127311923021", "us-east-2": "033677994240", "us-west-1": "027434742980",
                 "us-west-2": "797873946194", "eu-west-1": "156460612806", "eu-central-1": "054676820928"}

INVOKE_TOKENS = (
    "aws:index/getCallerIdentity:getCallerIdentity",
    "aws:index/getRegion:getRegion",
    "aws:index/getPartition:getPartition",
    "aws:secretsmanager/getRandomPassword:getRandomPassword",
    "aws:elb/getServiceAccount:getServiceAccount",
    "aws:secretsmanager/getSecretVersion:getSecretVersion",
)


def invoke(token: str, args: Mapping[str, Any], account: str, region: str, *,
           random_seed: Optional[str] = None) -> Optional[dict]:
    """The answer to an invoke the program makes, or None for a token not answered here.

    ``random_seed``: None, and GetRandomPassword returns nothing (offline plans stay stable);
    a string, and it returns a value derived from it (two real runs draw different values).
    """
    if token == "aws:index/getCallerIdentity:getCallerIdentity":
        return {"accountId": account, "arn": f"arn:aws:iam::{account}:role/mock", "userId": "MOCK", "id": account}
    if token == "aws:index/getRegion:getRegion":
        return {"name": region, "region": region, "id": region, "endpoint": f"ec2.{region}.amazonaws.com",
                "description": region}
    if token == "aws:index/getPartition:getPartition":
        return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws", "reverseDnsPrefix": "com.amazonaws"}
    if token == "aws:secretsmanager/getRandomPassword:getRandomPassword":
        if random_seed is None:
            return {}
        seed = json.dumps([random_seed, dict(args)], sort_keys=True, default=str)
        return {"randomPassword": digest_of(seed), "id": "mock"}
    if token == "aws:elb/getServiceAccount:getServiceAccount":
        elb_account = _ELB_ACCOUNTS.get(args.get("region") or region, "127311923021")
        return {"arn": f"arn:aws:iam::{elb_account}:root", "id": elb_account}
    if token == "aws:secretsmanager/getSecretVersion:getSecretVersion":
        # A stand-in value with every key the platform reads (Git and OIDC credentials).
        secret_id = args.get("secretId", "mock")
        value = {"username": "mock-user", "password": "mock-password", "clientSecret": "mock-client-secret"}
        return {"secretId": secret_id, "secretString": json.dumps(value), "versionId": "mock-version",
                "arn": (secret_id if secret_id.startswith("arn:")
                        else f"arn:aws:secretsmanager:{region}:{account}:secret:{secret_id}-"
                             f"{digest_of(secret_id)[-6:]}"),
                "id": secret_id}
    return None
