"""AWS storage, logging and encryption rules, checked on the recorded graph of both stacks.

Each test states an AWS rule and checks it by resolving references between recorded
resources (bucket names, ARNs, key ids, file system ids) and by evaluating the resource
policies the way AWS would for the request the service makes, never by comparing with
our own constants. Sources are named in each test.
"""
from __future__ import annotations

import fnmatch
import json
from typing import Any, Iterable, Optional

import pytest

from infra.recording import RecordedResource
from infra.plan import account_of

BUCKET = "aws:s3/bucket:Bucket"
ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
BUCKET_LOGGING = "aws:s3/bucketLogging:BucketLogging"
PUBLIC_ACCESS = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
OBJECT_LOCK = "aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration"
VERSIONING = "aws:s3/bucketVersioning:BucketVersioning"
KEY = "aws:kms/key:Key"
KEY_POLICY = "aws:kms/keyPolicy:KeyPolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
TRAIL = "aws:cloudtrail/trail:Trail"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
FILE_SYSTEM = "aws:fsx/lustreFileSystem:LustreFileSystem"
QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"
LOAD_BALANCER = "aws:lb/loadBalancer:LoadBalancer"
TLS = {"aws:SecureTransport": "true"}


# -- a small IAM policy evaluator ---------------------------------------------------------------
def _list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _condition_holds(operator: str, key: str, expected: Any, context: dict[str, Any]) -> bool:
    base, if_exists = (operator[:-len("IfExists")], True) if operator.endswith("IfExists") else (operator, False)
    if key not in context:
        return if_exists
    actual = [str(a) for a in _list(context[key])]
    wanted = [str(e) for e in _list(expected)]
    if base in ("StringEquals", "ArnEquals"):
        return any(a in wanted for a in actual)
    if base in ("StringLike", "ArnLike"):
        return any(fnmatch.fnmatchcase(a, w) for a in actual for w in wanted)
    if base == "Bool":
        return any(a.lower() == w.lower() for a in actual for w in wanted)
    raise NotImplementedError(f"condition operator {operator} is not modelled by this test")


def _principal_matches(principal: Any, kind: str, name: str) -> bool:
    if principal == "*":
        return True
    values = [str(v) for v in _list((principal or {}).get(kind, []))]
    return name in values or (kind == "AWS" and "*" in values)


def allows(policy: dict, *, principal: tuple[str, str], action: str, resource: str,
           context: Optional[dict[str, Any]] = None) -> bool:
    """Whether ``policy`` alone allows the request (an explicit deny wins)."""
    context = {**TLS, **(context or {})}
    allowed = False
    for statement in policy["Statement"]:
        if not _principal_matches(statement.get("Principal"), *principal):
            continue
        if not any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in _list(statement["Action"])):
            continue
        # A trust policy has no Resource: the role itself is the resource.
        if not any(fnmatch.fnmatchcase(resource, r) for r in _list(statement.get("Resource", "*"))):
            continue
        conditions = statement.get("Condition", {})
        if not all(_condition_holds(op, k, v, context) for op, pairs in conditions.items() for k, v in pairs.items()):
            continue
        if statement["Effect"] == "Deny":
            return False
        allowed = True
    return allowed


def test_evaluator_denies_what_it_should():
    policy = {"Statement": [
        {"Effect": "Allow", "Principal": {"Service": "a.amazonaws.com"}, "Action": "s3:PutObject", "Resource": "arn:b/x/*",
         "Condition": {"StringEquals": {"aws:SourceAccount": ["1"]}, "ArnLike": {"aws:SourceArn": "arn:s:1:*"}}},
        {"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "arn:b/*",
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}
    ok = {"aws:SourceAccount": "1", "aws:SourceArn": "arn:s:1:thing"}
    assert allows(policy, principal=("Service", "a.amazonaws.com"), action="s3:PutObject", resource="arn:b/x/1", context=ok)
    assert not allows(policy, principal=("Service", "a.amazonaws.com"), action="s3:PutObject", resource="arn:b/y/1", context=ok)
    assert not allows(policy, principal=("Service", "a.amazonaws.com"), action="s3:PutObject", resource="arn:b/x/1",
                      context={**ok, "aws:SourceAccount": "2"})
    assert not allows(policy, principal=("Service", "a.amazonaws.com"), action="s3:PutObject", resource="arn:b/x/1",
                      context={"aws:SourceAccount": "1"})
    assert not allows(policy, principal=("Service", "a.amazonaws.com"), action="s3:PutObject", resource="arn:b/x/1",
                      context={**ok, "aws:SecureTransport": "false"})
    assert not allows(policy, principal=("Service", "b.amazonaws.com"), action="s3:PutObject", resource="arn:b/x/1", context=ok)


# -- resolving references on the recorded graph -----------------------------------------------
class Graph:
    def __init__(self, plan):
        self.plan = plan
        self.recording = plan.recording
        self.config = plan.config

    def all(self, resource_type: str) -> list[RecordedResource]:
        return self.recording.by_type(resource_type)

    def account_id(self, resource: RecordedResource) -> str:
        key = account_of(resource, self.recording, self.config)
        assert key is not None, f"{resource.type} {resource.name} has no account"
        return getattr(self.config.accounts, key).id

    def bucket(self, ref: str) -> RecordedResource:
        """A bucket by name (its id) or ARN (optionally followed by /key)."""
        name = ref.split(":::", 1)[1].split("/", 1)[0] if ref.startswith("arn:") else ref
        found = [b for b in self.all(BUCKET) if b.id == name]
        assert len(found) == 1, f"no recorded bucket {name!r}"
        return found[0]

    def attached(self, resource_type: str, bucket: RecordedResource) -> list[RecordedResource]:
        return [r for r in self.all(resource_type) if r.inputs.get("bucket") == bucket.id]

    def bucket_policy(self, bucket: RecordedResource) -> tuple[RecordedResource, dict]:
        (policy,) = self.attached(BUCKET_POLICY, bucket)
        return policy, json.loads(policy.inputs["policy"])

    def default_encryption(self, bucket: RecordedResource) -> dict:
        (config,) = self.attached(ENCRYPTION, bucket)
        (rule,) = config.inputs["rules"]
        return rule["applyServerSideEncryptionByDefault"]

    def key(self, arn: str) -> RecordedResource:
        found = [k for k in self.all(KEY) if k.outputs["arn"] == arn]
        assert len(found) == 1, f"no recorded key {arn}"
        return found[0]

    def key_policy(self, key: RecordedResource) -> tuple[Optional[RecordedResource], dict]:
        """The policy in force: a KeyPolicy resource replaces the key's own."""
        attached = [p for p in self.all(KEY_POLICY) if p.inputs["keyId"] == key.outputs["keyId"]]
        if attached:
            assert len(attached) == 1 and not key.inputs.get("policy"), f"{key.name}: inline policy and KeyPolicy fight"
            return attached[0], json.loads(attached[0].inputs["policy"])
        return None, json.loads(key.inputs["policy"])

    def depends_on(self, resource: RecordedResource, other: RecordedResource) -> bool:
        return other.urn in resource.dependencies


@pytest.fixture
def graph(plan) -> Graph:
    return Graph(plan)


# -- S3 server access logs ------------------------------------------------------------------------
def test_access_log_targets_are_same_account_sse_s3_and_admit_only_their_source(graph):
    """S3 User Guide, "Enabling Amazon S3 server access logging": the destination bucket must be
    in the same account (and Region) as the source, must not use SSE-KMS default encryption nor
    Object Lock, and (with BucketOwnerEnforced) must admit logging.s3.amazonaws.com in its policy,
    scoped with aws:SourceArn / aws:SourceAccount."""
    loggings = graph.all(BUCKET_LOGGING)
    assert loggings
    for logging in loggings:
        source = graph.bucket(logging.inputs["bucket"])
        target = graph.bucket(logging.inputs["targetBucket"])
        account = graph.account_id(source)
        assert graph.account_id(target) == account, f"{logging.name}: target in another account"
        assert graph.account_id(logging) == account
        assert graph.default_encryption(target) == {"sseAlgorithm": "AES256"}, f"{logging.name}: target is not SSE-S3"
        assert not graph.attached(OBJECT_LOCK, target), f"{logging.name}: Object Lock on an access-log target"
        policy_resource, policy = graph.bucket_policy(target)
        key = f"{target.outputs['arn']}/{logging.inputs['targetPrefix']}2026-11-21-12-00-00-ABCDEF"
        request = dict(principal=("Service", "logging.s3.amazonaws.com"), action="s3:PutObject", resource=key)
        assert allows(policy, **request, context={"aws:SourceArn": source.outputs["arn"], "aws:SourceAccount": account})
        assert not allows(policy, **request, context={"aws:SourceArn": "arn:aws:s3:::someone-elses-bucket",
                                                       "aws:SourceAccount": account})
        assert not allows(policy, **request, context={"aws:SourceArn": source.outputs["arn"], "aws:SourceAccount": "999999999999"})
        assert graph.depends_on(logging, policy_resource), f"{logging.name} starts before the policy that admits it"


def test_every_kms_bucket_logs_its_access(graph):
    """Every data bucket (SSE-KMS) has S3 server access logging; the SSE-S3 buckets are log targets."""
    logged = {graph.bucket(l.inputs["bucket"]).urn for l in graph.all(BUCKET_LOGGING)}
    targets = {graph.bucket(l.inputs["targetBucket"]).urn for l in graph.all(BUCKET_LOGGING)}
    alb_targets = {graph.bucket(lb.inputs["accessLogs"]["bucket"]).urn
                   for lb in graph.all(LOAD_BALANCER) if lb.inputs.get("accessLogs")}
    for bucket in graph.all(BUCKET):
        encryption = graph.default_encryption(bucket)
        if encryption["sseAlgorithm"] == "aws:kms":
            assert bucket.urn in logged, f"{bucket.name} has no server access logging"
        else:
            # ALB and S3 access logs support SSE-S3 only; nothing else may skip KMS.
            assert bucket.urn in targets | alb_targets, f"{bucket.name} is SSE-S3 but not a log target"


# -- encryption at rest, public access, TLS --------------------------------------------------------
def test_buckets_block_public_access_deny_plain_http_and_use_rotated_keys(graph):
    for bucket in graph.all(BUCKET):
        (block,) = graph.attached(PUBLIC_ACCESS, bucket)
        assert all(block.inputs[k] is True for k in
                   ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")), bucket.name
        _, policy = graph.bucket_policy(bucket)
        any_object = f"{bucket.outputs['arn']}/x"
        assert not allows(policy, principal=("AWS", "arn:aws:iam::123456789012:root"), action="s3:GetObject",
                          resource=any_object, context={"aws:SecureTransport": "false"})
        deny = [s for s in policy["Statement"] if s["Effect"] == "Deny" and s.get("Principal") == "*"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and any_object.rsplit("/", 1)[0] + "/*"
                   in _list(s["Resource"]) for s in deny), f"{bucket.name}: plain HTTP is not denied"
        (versioning,) = graph.attached(VERSIONING, bucket)
        assert versioning.inputs["versioningConfiguration"]["status"] == "Enabled"
        encryption = graph.default_encryption(bucket)
        if encryption["sseAlgorithm"] == "aws:kms":
            key = graph.key(encryption["kmsMasterKeyId"])
            assert key.inputs["enableKeyRotation"] is True
            assert graph.account_id(key) == graph.account_id(bucket)


# -- FSx data repository associations -----------------------------------------------------------
def test_fsx_dra_buckets_keys_admit_the_file_systems_service_linked_role(graph):
    """FSx for Lustre User Guide, "Working with server-side encrypted Amazon S3 buckets": the KMS
    key of an SSE-KMS bucket linked by a DRA must let AWSServiceRoleForFSxS3Access_<fs-id> use it
    through S3 (encryption context: the bucket ARN, as the buckets use S3 Bucket Keys)."""
    dras = graph.all(DRA)
    if graph.config.datasets is None or graph.config.datasets.fsx is None \
            or not graph.config.datasets.fsx.data_repository_associations:
        pytest.skip("no data repository associations in this stack")
    assert dras
    region = graph.config.region
    for dra in dras:
        (fs,) = [f for f in graph.all(FILE_SYSTEM) if f.id == dra.inputs["fileSystemId"]]
        bucket = graph.bucket(dra.inputs["dataRepositoryPath"].removeprefix("s3://").split("/", 1)[0])
        account = graph.account_id(bucket)
        encryption = graph.default_encryption(bucket)
        if encryption["sseAlgorithm"] == "AES256":
            continue  # FSx supports SSE-S3 buckets with no key policy
        key = graph.key(encryption["kmsMasterKeyId"])
        policy_resource, policy = graph.key_policy(key)

        def slr(fs_id: str) -> str:
            return (f"arn:aws:iam::{account}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
                    f"AWSServiceRoleForFSxS3Access_{fs_id}")

        def request(fs_id: str, action: str, context: str) -> bool:
            return allows(policy, principal=("AWS", slr(fs_id)), action=action, resource="*", context={
                "aws:PrincipalArn": slr(fs_id), "kms:CallerAccount": account,
                "kms:ViaService": f"s3.{region}.amazonaws.com", "kms:EncryptionContext:aws:s3:arn": context})

        for action in ("kms:GenerateDataKey", "kms:Decrypt", "kms:Encrypt"):
            assert request(fs.id, action, bucket.outputs["arn"]), f"{dra.name}: key refuses the FSx role ({action})"
            assert request(fs.id, action, bucket.outputs["arn"] + "/datasets/a.bin")
        assert not request("fs-0000000000000000", "kms:Decrypt", bucket.outputs["arn"]), "any file system may use the key"
        assert not request(fs.id, "kms:Decrypt", "arn:aws:s3:::another-bucket"), "the role may use the key on any bucket"
        if policy_resource is not None:
            assert graph.depends_on(dra, policy_resource), f"{dra.name} is created before its key policy"


# -- VPC flow logs -------------------------------------------------------------------------------
def test_flow_logs_delivery_path_and_key_are_admitted_and_waited_for(graph):
    """VPC User Guide, "Amazon S3 bucket permissions for flow logs" / "Flow log files": with
    Hive-compatible partitions objects are written under
    <destination>/AWSLogs/aws-account-id=<id>/aws-service=vpcflowlogs/aws-region=<region>/...;
    delivery.logs.amazonaws.com writes with aws:SourceAccount and aws:SourceArn
    arn:aws:logs:<region>:<id>:*, and needs the SSE-KMS key (CloudWatch Logs "Logs sent to S3")."""
    (flow_log,) = graph.all(FLOW_LOG)
    account, region = graph.account_id(flow_log), graph.config.region
    destination = flow_log.inputs["logDestination"]
    bucket = graph.bucket(destination)
    hive = flow_log.inputs["destinationOptions"]["hiveCompatiblePartitions"]
    account_dir = f"aws-account-id={account}/aws-service=vpcflowlogs/aws-region={region}" if hive \
        else f"{account}/vpcflowlogs/{region}"
    key_name = f"{destination}/AWSLogs/{account_dir}/year=2026/month=11/day=21/hour=12/{account}_vpcflowlogs_x.parquet"
    source = {"aws:SourceAccount": account, "aws:SourceArn": f"arn:aws:logs:{region}:{account}:flow-log/{flow_log.id}"}
    policy_resource, policy = graph.bucket_policy(bucket)
    service = ("Service", "delivery.logs.amazonaws.com")
    assert allows(policy, principal=service, action="s3:PutObject", resource=key_name,
                  context={**source, "s3:x-amz-acl": "bucket-owner-full-control"})
    assert allows(policy, principal=service, action="s3:GetBucketAcl", resource=bucket.outputs["arn"], context=source)
    assert not allows(policy, principal=service, action="s3:PutObject", resource=key_name,
                      context={"aws:SourceAccount": "999999999999", "aws:SourceArn": "arn:aws:logs:us-east-1:999999999999:x",
                               "s3:x-amz-acl": "bucket-owner-full-control"})
    assert graph.depends_on(flow_log, policy_resource), "the flow log is created before the policy that admits it"
    encryption = graph.default_encryption(bucket)
    if encryption["sseAlgorithm"] == "aws:kms":
        _, key_policy = graph.key_policy(graph.key(encryption["kmsMasterKeyId"]))
        assert allows(key_policy, principal=service, action="kms:GenerateDataKey", resource="*", context=source)
        assert not allows(key_policy, principal=service, action="kms:GenerateDataKey", resource="*",
                          context={"aws:SourceAccount": "999999999999", "aws:SourceArn": "arn:aws:logs:us-east-1:999999999999:x"})


# -- audit trail ---------------------------------------------------------------------------------
def test_audit_trail_per_account_into_the_archive_with_kms_and_validation(graph):
    """CloudTrail User Guide: bucket policy admits cloudtrail.amazonaws.com for
    <prefix>/AWSLogs/<account>/* with aws:SourceArn = the trail's ARN; the key policy lets it
    GenerateDataKey* under the same aws:SourceArn; log file validation, multi-region."""
    trails = graph.all(TRAIL)
    accounts = {graph.account_id(t) for t in trails}
    assert {graph.config.accounts.workload.id, graph.config.accounts.automation.id} <= accounts
    region = graph.config.region
    for trail in trails:
        inputs = trail.inputs
        assert inputs["enableLogFileValidation"] is True and inputs["isMultiRegionTrail"] is True
        assert inputs["includeGlobalServiceEvents"] is True and inputs.get("enableLogging", True) is True
        bucket = graph.bucket(inputs["s3BucketName"])
        assert account_of(bucket, graph.recording, graph.config) == "logging"
        account = graph.account_id(trail)
        arn = f"arn:aws:cloudtrail:{region}:{account}:trail/{inputs['name']}"
        service = ("Service", "cloudtrail.amazonaws.com")
        policy_resource, policy = graph.bucket_policy(bucket)
        object_key = f"{bucket.outputs['arn']}/{inputs['s3KeyPrefix']}/AWSLogs/{account}/CloudTrail/{region}/2026/11/21/x.json.gz"
        assert allows(policy, principal=service, action="s3:PutObject", resource=object_key,
                      context={"aws:SourceArn": arn, "s3:x-amz-acl": "bucket-owner-full-control"})
        assert allows(policy, principal=service, action="s3:GetBucketAcl", resource=bucket.outputs["arn"],
                      context={"aws:SourceArn": arn})
        other = f"arn:aws:cloudtrail:{region}:{account}:trail/someone-elses"
        assert not allows(policy, principal=service, action="s3:PutObject", resource=object_key,
                          context={"aws:SourceArn": other, "s3:x-amz-acl": "bucket-owner-full-control"})
        assert graph.depends_on(trail, policy_resource), f"{trail.name} is created before the bucket policy"
        key = graph.key(inputs["kmsKeyId"])
        _, key_policy = graph.key_policy(key)
        context = {"aws:SourceArn": arn, "kms:EncryptionContext:aws:cloudtrail:arn": arn}
        assert allows(key_policy, principal=service, action="kms:GenerateDataKey", resource="*", context=context)
        assert allows(key_policy, principal=service, action="kms:DescribeKey", resource="*", context=context)
        assert not allows(key_policy, principal=service, action="kms:GenerateDataKey", resource="*",
                          context={"aws:SourceArn": other, "kms:EncryptionContext:aws:cloudtrail:arn": other})


def test_archive_has_object_lock_in_prod_only(graph):
    """S3 Object Lock (COMPLIANCE, retention from config) on the archive in prod; it needs versioning."""
    (archive,) = {graph.bucket(t.inputs["s3BucketName"]).urn: graph.bucket(t.inputs["s3BucketName"])
                  for t in graph.all(TRAIL)}.values()
    locks = graph.attached(OBJECT_LOCK, archive)
    if not graph.config.is_prod:
        assert locks == []
        return
    (lock,) = locks
    assert lock.inputs["rule"]["defaultRetention"] == {"mode": "COMPLIANCE", "days": graph.config.object_lock_retention_days}
    (versioning,) = graph.attached(VERSIONING, archive)
    assert graph.depends_on(lock, versioning)


# -- CloudWatch log groups -------------------------------------------------------------------------
def test_log_groups_encrypted_with_a_key_that_admits_cloudwatch_logs_for_them(graph):
    """CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs using AWS KMS": the key
    policy admits logs.<region>.amazonaws.com with kms:EncryptionContext:aws:logs:arn = the group."""
    groups = graph.all(LOG_GROUP)
    assert groups
    region = graph.config.region
    for group in groups:
        assert group.inputs.get("kmsKeyId"), f"{group.name} is not encrypted with a customer-managed key"
        key = graph.key(group.inputs["kmsKeyId"])
        account = graph.account_id(group)
        assert graph.account_id(key) == account
        _, policy = graph.key_policy(key)
        service = ("Service", f"logs.{region}.amazonaws.com")
        arn = f"arn:aws:logs:{region}:{account}:log-group:{group.inputs['name']}"
        for action in ("kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"):
            assert allows(policy, principal=service, action=action, resource="*",
                          context={"kms:EncryptionContext:aws:logs:arn": arn}), f"{group.name}: {action} refused"
        assert not allows(policy, principal=service, action="kms:Decrypt", resource="*",
                          context={"kms:EncryptionContext:aws:logs:arn": f"arn:aws:logs:{region}:{account}:log-group:/other"})
        if graph.config.is_prod:
            assert group.inputs["retentionInDays"] >= 365, f"{group.name} keeps logs {group.inputs['retentionInDays']} days"


# -- service principals in resource policies --------------------------------------------------------
SCOPING_KEYS = ("aws:SourceArn", "aws:SourceAccount")
# Services whose documented key-policy statement scopes them by encryption context instead.
CONTEXT_SCOPED = {"logs.": "kms:EncryptionContext:aws:logs:arn"}


def _resource_policies(graph) -> Iterable[tuple[str, dict]]:
    for r in graph.all(BUCKET_POLICY) + graph.all(KEY_POLICY) + graph.all(QUEUE_POLICY) + graph.all(TOPIC_POLICY):
        yield r.name, json.loads(r.inputs["policy"])
    for key in graph.all(KEY):
        if key.inputs.get("policy"):
            yield key.name, json.loads(key.inputs["policy"])


def test_every_service_principal_is_scoped_to_our_resources(graph):
    """Confused-deputy prevention (IAM User Guide, "The confused deputy problem"): an Allow to an
    AWS service principal carries aws:SourceArn or aws:SourceAccount."""
    checked = 0
    for name, policy in _resource_policies(graph):
        for statement in policy["Statement"]:
            principal = statement.get("Principal")
            if statement["Effect"] != "Allow" or not isinstance(principal, dict) or "Service" not in principal:
                continue
            keys = {k for pairs in statement.get("Condition", {}).values() for k in pairs}
            for service in _list(principal["Service"]):
                context_key = next((v for prefix, v in CONTEXT_SCOPED.items() if str(service).startswith(prefix)), None)
                assert keys & set(SCOPING_KEYS) or (context_key and context_key in keys), \
                    f"{name}: {service} admitted without aws:SourceArn/aws:SourceAccount ({statement.get('Sid')})"
                checked += 1
    assert checked >= 5


def test_control_plane_log_group_exists_before_the_cluster(graph):
    """EKS User Guide, "Send control plane logs to CloudWatch Logs": EKS writes to
    /aws/eks/<cluster>/cluster and creates that group itself (no KMS key, logs kept forever)
    unless it exists, so ours must be created first."""
    (cluster,) = graph.all("eks:index:Cluster")
    name = f"/aws/eks/{cluster.inputs['name']}/cluster"
    (group,) = [g for g in graph.all(LOG_GROUP) if g.inputs["name"] == name]
    assert graph.depends_on(cluster, group)
    assert graph.account_id(group) == graph.account_id(cluster)


def test_every_kms_key_rotates_and_is_protected_in_prod(graph):
    """CIS AWS Foundations 3.6 / checkov CKV_AWS_7: customer-managed keys rotate; prod keys cannot
    be deleted by a stack change (Pulumi protect) and wait the longest window when deleted."""
    keys = graph.all(KEY)
    assert keys
    for key in keys:
        assert key.inputs["enableKeyRotation"] is True, f"{key.name} does not rotate"
        assert 7 <= key.inputs.get("deletionWindowInDays", 30) <= 30
        if graph.config.is_prod:
            assert key.protect, f"{key.name} is not protected in prod"


# -- the log-archive destination ------------------------------------------------------------------
def test_the_log_destination_role_admits_cloudwatch_logs_for_both_accounts_and_nobody_else(graph):
    """CloudWatch Logs User Guide, "Cross-account cross-Region subscriptions using Firehose":
    "When the destination is created, CloudWatch Logs sends a test message to the destination on
    the recipient account's behalf. When the subscription filter is active later, CloudWatch Logs
    sends log events to the destination on the source account's behalf." Both calls assume the
    destination's role; a third account's log ARN must not."""
    config = graph.config
    [destination] = graph.all("aws:cloudwatch/logDestination:LogDestination")
    [role] = [r for r in graph.all("aws:iam/role:Role") if r.outputs["arn"] == destination.inputs["roleArn"]]
    trust = json.loads(role.inputs["assumeRolePolicy"])
    recipient, source = config.accounts.logging.id, config.accounts.workload.id
    assert graph.account_id(destination) == recipient
    region = config.region

    def assumes(account: str, arn_tail: str) -> bool:
        return allows(trust, principal=("Service", "logs.amazonaws.com"), action="sts:AssumeRole", resource="*",
                      context={"aws:SourceArn": f"arn:aws:logs:{region}:{account}:{arn_tail}", "aws:SourceAccount": account})

    assert assumes(recipient, f"destination:{destination.inputs['name']}"), "PutDestination's test message is refused"
    assert assumes(source, "log-group:/aws/eks/x/containers:*"), "the subscription's deliveries are refused"
    assert not assumes("999999999999", "log-group:/aws/eks/x/containers:*")
    other_region = {"aws:SourceArn": f"arn:aws:logs:eu-north-1:{source}:log-group:x", "aws:SourceAccount": source}
    assert not allows(trust, principal=("Service", "logs.amazonaws.com"), action="sts:AssumeRole", resource="*",
                      context=other_region)
