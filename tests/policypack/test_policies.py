"""The policy pack: both stacks pass; each policy fails on a graph mutated to break its rule."""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Callable

import pytest

from infra.policy_gate import evaluate, graph_resources
from policypack.rules import MANDATORY, RULES, Resource


def _graph(plan) -> list[Resource]:
    return [dataclasses.replace(r, props=copy.deepcopy(dict(r.props))) for r in graph_resources(plan.recording)]


def _first(resources: list[Resource], type_: str, where: Callable[[Resource], bool] = lambda r: True) -> Resource:
    return next(r for r in resources if r.type == type_ and where(r))


def test_both_stacks_pass_every_mandatory_policy(plan):
    violations = [v for v in evaluate(graph_resources(plan.recording)) if v.enforcement == MANDATORY]
    assert violations == []


def test_every_policy_names_its_reference_and_level():
    assert len({rule.name for rule in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.references and rule.enforcement in ("mandatory", "advisory")
        assert (rule.check_resource is None) != (rule.check_stack is None)


def _set(path: str, value):
    def mutate(resource: Resource) -> None:
        *parents, leaf = path.split(".")
        node = resource.props
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if value is _DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return mutate


_DELETE = object()
POD_IDENTITY = lambda r: "pods.eks.amazonaws.com" in r.props.get("assumeRolePolicy", "")  # noqa: E731
GPU_POOL = lambda r: any(t.get("key") == "nvidia.com/gpu" for t in r.props["spec"]["template"]["spec"].get("taints", []))  # noqa: E731
HTTPS = lambda r: r.props.get("protocol") == "HTTPS"  # noqa: E731

# policy -> (stack, resource type, which one, mutation)
MUTATIONS = {
    "eks-public-endpoint-restricted": ("dev", "eks:index:Cluster", None, _set("publicAccessCidrs", ["10.0.0.0/8", "0.0.0.0/0"])),
    "eks-private-endpoint-in-prod": ("prod", "eks:index:Cluster", None, _set("endpointPublicAccess", True)),
    "eks-secrets-encrypted": ("prod", "eks:index:Cluster", None, _set("encryptionConfigKeyArn", _DELETE)),
    "eks-control-plane-logs": ("dev", "eks:index:Cluster", None, _set("enabledClusterLogTypes", ["api", "audit"])),
    "imdsv2-hop-limit-1": ("prod", "aws:ec2/launchTemplate:LaunchTemplate", None, _set("metadataOptions.httpPutResponseHopLimit", 2)),
    "no-world-ingress": ("prod", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                         lambda r: r.props.get("cidrIpv4"), _set("cidrIpv4", "0.0.0.0/0")),
    "tls12-listeners": ("dev", "aws:lb/listener:Listener", HTTPS, _set("sslPolicy", "ELBSecurityPolicy-2016-08")),
    "ecs-no-public-ip": ("dev", "aws:ecs/service:Service", None, _set("networkConfiguration.assignPublicIp", True)),
    "rds-encrypted": ("dev", "aws:rds/cluster:Cluster", None, _set("storageEncrypted", False)),
    "fsx-kms": ("prod", "aws:fsx/lustreFileSystem:LustreFileSystem", None, _set("kmsKeyId", _DELETE)),
    "log-groups-kms": ("dev", "aws:cloudwatch/logGroup:LogGroup", None, _set("kmsKeyId", _DELETE)),
    "log-retention-prod": ("prod", "aws:cloudwatch/logGroup:LogGroup", None, _set("retentionInDays", 30)),
    "deletion-protection-prod": ("prod", "aws:rds/cluster:Cluster", None, _set("deletionProtection", False)),
    "s3-public-access-blocked": ("dev", "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", None,
                                 _set("restrictPublicBuckets", False)),
    "pod-identity-trust-scoped": ("prod", "aws:iam/role:Role", POD_IDENTITY,
                                  lambda r: r.props.update(assumeRolePolicy=json.dumps({"Statement": [{
                                      "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                                      "Action": ["sts:AssumeRole", "sts:TagSession"]}]}))),
    "no-wildcard-admin": ("dev", "aws:iam/rolePolicy:RolePolicy", None,
                          _set("policy", json.dumps({"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))),
    "gpu-pools-training-safe": ("prod", "kubernetes:karpenter.sh/v1:NodePool", GPU_POOL,
                                _set("spec.disruption.consolidationPolicy", "WhenEmptyOrUnderutilized")),
    "nodepool-gpu-limits": ("dev", "kubernetes:karpenter.sh/v1:NodePool", GPU_POOL, _set("spec.limits", {"cpu": "1000"})),
    "required-tags": ("dev", "aws:kms/key:Key", None, _set("tags", {"team": "ml-platform"})),
}


def test_every_policy_has_a_mutation():
    assert set(MUTATIONS) | {"s3-encrypted"} == {rule.name for rule in RULES}


@pytest.mark.parametrize("policy", sorted(MUTATIONS))
def test_policy_fails_on_a_mutated_graph(policy, dev_plan, prod_plan):
    stack, type_, where, mutate = MUTATIONS[policy]
    resources = _graph(dev_plan if stack == "dev" else prod_plan)
    target = _first(resources, type_, where or (lambda r: True))
    before = {v.policy for v in evaluate(resources) if v.urn == target.urn}
    mutate(target)
    after = [v for v in evaluate(resources) if v.policy == policy]
    assert policy not in before
    assert after and all(v.message for v in after), f"{policy} did not fire on the mutated {target.name}"


def test_a_bucket_without_encryption_configuration_fails(dev_plan):
    resources = _graph(dev_plan)
    bucket = _first(resources, "aws:s3/bucket:Bucket")
    kind = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    mutated = [r for r in resources if not (r.type == kind and bucket.urn in r.dependencies)]
    [violation] = [v for v in evaluate(mutated) if v.policy == "s3-encrypted"]
    assert violation.urn == bucket.urn


def test_the_pulumi_policy_wrappers_report_what_the_rules_find(dev_plan):
    """What `pulumi preview --policy-pack policypack` runs: the same rules behind pulumi-policy's API."""
    pulumi_policy = pytest.importorskip("pulumi_policy")
    from policypack.pack import policies

    by_name = {p.name: p for p in policies()}
    assert set(by_name) == {rule.name for rule in RULES}
    resources = _graph(dev_plan)
    template = _first(resources, "aws:ec2/launchTemplate:LaunchTemplate")
    template.props["metadataOptions"]["httpTokens"] = "optional"
    options = pulumi_policy.PolicyResourceOptions(protect=False, ignore_changes=[], delete_before_replace=None,
                                                  aliases=[], custom_timeouts=None, additional_secret_outputs=[])
    args = pulumi_policy.ResourceValidationArgs(template.type, template.props, template.urn, template.name, options, None)
    reported: list = []
    by_name["imdsv2-hop-limit-1"].validate(args, lambda message, urn=None: reported.append(message))
    assert reported and "IMDSv1" in reported[0]

    bucket = _first(resources, "aws:s3/bucket:Bucket")
    policy_resources = [
        pulumi_policy.PolicyResource(r.type, r.props, r.urn, r.name, options, None, None,
                                     [type("Dep", (), {"urn": u})() for u in r.dependencies if u != bucket.urn], {})
        for r in resources
    ]
    reported = []
    by_name["s3-public-access-blocked"].validate(pulumi_policy.StackValidationArgs(policy_resources),
                                                 lambda message, urn=None: reported.append((message, urn)))
    assert (f"bucket {bucket.name} has no public access block with all four settings on", bucket.urn) in reported


def test_a_mandatory_violation_makes_the_plan_fail(dev_plan, monkeypatch):
    from infra import plan as plan_module
    from infra import policy_gate

    resources = _graph(dev_plan)
    _set("enabledClusterLogTypes", ["api"])(_first(resources, "eks:index:Cluster"))
    monkeypatch.setattr(policy_gate, "graph_resources", lambda recording: resources)
    warnings = plan_module.plan_warnings(dev_plan.config, dev_plan.recording)
    assert any(w.startswith("ERROR policy eks-control-plane-logs") for w in warnings)
