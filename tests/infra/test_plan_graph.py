"""The plan's resource graph: urn, id and dependencies, and the Recording graph API."""
from __future__ import annotations

from collections import Counter

import pytest

from infra.plan.mock_engine import run_recorded
from infra.plan import resource_graph

import pulumi


def reference_inputs(resource):
    """(key, value) of inputs that hold another resource's id or ARN by naming convention."""
    for key, value in resource.inputs.items():
        if isinstance(value, str) and (key.endswith(("Id", "Arn", "Ids")) or key in ("bucket", "targetBucket", "role")):
            yield key, value


def test_every_node_has_a_unique_urn_and_id(plan):
    graph = plan.graph
    assert all(node["urn"].startswith("urn:pulumi:") and node["id"] for node in graph)
    for key in ("urn", "id"):
        duplicates = [v for v, n in Counter(node[key] for node in graph).items() if n > 1]
        assert duplicates == [], f"{key} not unique: {duplicates}"


def test_ids_are_deterministic(plan):
    from infra.plan import build_plan

    again = build_plan(plan.stack)
    # (Registration order may differ between runs; what a URN gets may not.)
    assert {n["urn"]: n["id"] for n in again.graph} == {n["urn"]: n["id"] for n in plan.graph}


def test_dependencies_name_recorded_resources(plan):
    names = {node["name"] for node in plan.graph}
    assert all(set(node["dependencies"]) <= names for node in plan.graph)
    # Not a vacuous list: most AWS resources are built from another resource's outputs.
    assert sum(bool(node["dependencies"]) for node in plan.graph) > len(plan.graph) // 2


def test_references_resolve_to_a_resource_created_first(plan):
    """Wherever an input holds another resource's id or ARN (securityGroupId, vpcId, kmsKeyId,
    targetBucket...), the engine must create that resource first: it is a dependency."""
    recording = plan.recording
    checked = 0
    for resource in recording.resources:
        for key, value in reference_inputs(resource):
            target = recording.try_resolve(value)
            if target is None or target is resource:
                continue
            checked += 1
            assert recording.depends_on(resource, target), (
                f"{resource.type} {resource.name}.{key}={value} names {target.type} {target.name}, not a dependency")
    assert checked > 50


def test_resolve_finds_security_groups_and_buckets_by_the_values_inputs_hold(plan):
    recording = plan.recording
    group = recording.one("aws:ec2/securityGroup:SecurityGroup", next(
        r.name for r in recording.by_type("aws:ec2/securityGroup:SecurityGroup")))
    assert recording.resolve(group.id) is group
    assert recording.resolve(group.outputs["arn"]) is group
    assert recording.resolve(group.urn) is group
    bucket = recording.by_type("aws:s3/bucket:Bucket")[0]
    assert recording.resolve(bucket.outputs["bucket"], "aws:s3/bucket:Bucket") is bucket
    with pytest.raises(LookupError):
        recording.resolve("sg-does-not-exist")


def test_graph_api_on_a_small_program():
    """dependencies_of (direct and transitive), depends_on, property dependencies, references."""

    def program():
        import pulumi_aws as aws

        provider = aws.Provider("p", region="us-west-2")
        opts = pulumi.ResourceOptions(provider=provider)
        vpc = aws.ec2.Vpc("vpc", cidr_block="10.0.0.0/16", opts=opts)
        group = aws.ec2.SecurityGroup("sg", vpc_id=vpc.id, opts=opts)
        logs = aws.s3.Bucket("logs", bucket="logs-bucket", opts=opts)
        rule = aws.vpc.SecurityGroupIngressRule("rule", security_group_id=group.id, cidr_ipv4="10.0.0.0/8",
                                                ip_protocol="tcp", from_port=443, to_port=443, opts=opts)
        aws.s3.BucketLogging("logging", bucket="data-bucket", target_bucket=logs.bucket, target_prefix="x/",
                             opts=pulumi.ResourceOptions(provider=provider, depends_on=[rule]))

    recording = run_recorded(program, project="p", stack="s")
    vpc, group, logs, rule, logging = (recording.one(t) for t in (
        "aws:ec2/vpc:Vpc", "aws:ec2/securityGroup:SecurityGroup", "aws:s3/bucket:Bucket",
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "aws:s3/bucketLogging:BucketLogging"))
    assert recording.resolve(rule.inputs["securityGroupId"]) is group
    assert recording.resolve(logging.inputs["targetBucket"]) is logs
    assert recording.dependencies_of(rule) == [group]
    assert recording.property_dependencies_of(rule, "securityGroupId") == [group]
    assert {r.name for r in recording.dependencies_of(logging)} == {"logs", "rule"}  # depends_on + property
    assert {r.name for r in recording.dependencies_of(logging, transitive=True)} == {"logs", "rule", "sg", "vpc"}
    assert recording.depends_on(logging, vpc) and not recording.depends_on(logging, vpc, transitive=False)
    assert recording.dependents_of(group) == [rule]
    assert recording.references(logging) == [logs]
    assert recording.references(rule) == [group]
    # Ids come from the URN: the same program records the same ids.
    again = run_recorded(program, project="p", stack="s")
    assert {r.urn: r.id for r in again.resources} == {r.urn: r.id for r in recording.resources}


def test_each_recording_has_its_own_root_stack():
    """A process that records one stack then another (a test worker, a CI driver) gives each
    program the root Stack of its own project and stack: the engine parents top-level resources
    to ``urn:pulumi:<stack>::<project>::pulumi:pulumi:Stack::<project>-<stack>``."""

    def program():
        pulumi.ComponentResource("mlplatform:test:Thing", "thing")

    first = run_recorded(program, project="first", stack="dev")
    second = run_recorded(program, project="second", stack="prod")
    for recording, project, stack in ((first, "first", "dev"), (second, "second", "prod")):
        thing = recording.one("mlplatform:test:Thing")
        assert thing.parent == f"urn:pulumi:{stack}::{project}::pulumi:pulumi:Stack::{project}-{stack}"


def test_graph_json_dependencies_match_the_recording(plan):
    recording = plan.recording
    graph = resource_graph(recording, plan.config)
    for node, resource in zip(graph, recording.resources):
        assert node["urn"] == resource.urn and node["id"] == resource.id
        # Every URN the engine was given maps to a recorded resource (a remote component's
        # mock-only children map to the component).
        expected = {recording.by_urn(urn).name for urn in resource.dependencies}
        assert node["dependencies"] == sorted(expected)


def test_mock_outputs_belong_to_the_resource_they_were_made_for(plan):
    """Resources register from a thread pool: each mock output (id from the URN, ARN with the
    provider's account) must be made from its own record, never a concurrent one's."""
    from infra.plan import account_of

    accounts = {key: getattr(plan.config.accounts, key).id for key in ("automation", "workload", "logging")}
    checked = 0
    for resource in plan.recording.resources:
        if not resource.custom or resource.is_provider or resource.remote:
            continue
        arn = resource.outputs.get("arn")
        key = account_of(resource, plan.recording, plan.config)
        if isinstance(arn, str) and arn.startswith("arn:") and arn.split(":")[4] and key:
            checked += 1
            assert arn.split(":")[4] == accounts[key], (resource.name, arn, key)
        assert resource.id, resource.name
    assert checked > 50
