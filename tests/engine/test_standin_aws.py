"""The ``aws`` stand-in provider, driven through its gRPC servicer as the engine drives it (no CLI).

Each test names the upstream rule it holds the stand-in to: the pinned SDK's input types, the
Terraform bridge's Check/Diff behaviour, AWS's own refusals.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from tests.engine.standin_support import Context, Refused, check, configure, create, delete, diff, read, update, urn
from tools.engine.standins import aws as standin
from tools.engine.standins.replacements import REPLACE_ON_CHANGE
from tools.engine.standins.state import StateStore

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "222233334444"


@pytest.fixture
def provider(tmp_path):
    servicer = standin.AwsStandIn(StateStore(tmp_path / "state"))
    configure(servicer, region="us-west-2",
              assumeRoles=json.dumps([{"roleArn": f"arn:aws:iam::{ACCOUNT}:role/mlp-pulumi-deploy"}]),
              defaultTags=json.dumps({"tags": {"environment": "dev"}}))
    return servicer


def created(provider, resource_urn, news):
    inputs, failures = check(provider, resource_urn, news)
    assert failures == []
    resource_id, outputs = create(provider, resource_urn, inputs)
    return inputs, resource_id, outputs


# -- Check ---------------------------------------------------------------------------------------
def test_check_refuses_a_key_the_sdk_does_not_declare_and_a_missing_required_one(provider):
    """pulumi-aws 7.51.1 ``ClusterArgs`` has ``kubernetesNetworkConfig`` (no flattened
    ``kubernetesServiceIpAddressRange``) and requires ``roleArn`` and ``vpcConfig.subnetIds``; the
    bridge answers "Invalid or unknown key" / "Missing required property"."""
    _, failures = check(provider, urn("aws:eks/cluster:Cluster", "c"), {
        "name": "c", "kubernetesServiceIpAddressRange": "172.20.0.0/16", "vpcConfig": {"endpointPublicAccess": False}})
    paths = {path: reason for path, reason in failures}
    assert set(paths) == {"kubernetesServiceIpAddressRange", "roleArn", "vpcConfig.subnetIds"}
    assert "not an input of ClusterArgs" in paths["kubernetesServiceIpAddressRange"]
    assert "required" in paths["roleArn"]


def test_check_passes_what_the_pinned_sdk_declares(provider):
    _, failures = check(provider, urn("aws:eks/cluster:Cluster", "c"), {
        "name": "c", "roleArn": "arn:aws:iam::1:role/r",
        "kubernetesNetworkConfig": {"serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4"},
        "vpcConfig": {"subnetIds": ["subnet-1"]}})
    assert failures == []


def test_check_refuses_a_type_the_pinned_sdk_does_not_have(provider):
    with pytest.raises(Refused, match="unrecognized resource type"):
        check(provider, urn("aws:ec2/noSuchThing:NoSuchThing", "x"), {})


def test_provider_config_keys_are_checked_too(provider):
    response = provider.CheckConfig(provider_pb2.CheckRequest(
        urn=urn("pulumi:providers:aws", "workload"),
        news=__import__("tools.engine.standins.wire", fromlist=["encode"]).encode(
            {"region": "us-west-2", "assumeRole": json.dumps({"roleArn": "x"}), "version": "7.51.1"})), Context())
    assert [f.property for f in response.failures] == ["assumeRole"]
    assert "did you mean `assumeRoles`" in response.failures[0].reason


def test_an_autoname_is_drawn_once_and_kept(provider):
    """The bridge names a resource that gives no ``name`` ``<name>-<7 chars>`` and records it in
    ``__defaults``, so later Checks keep it (pulumi-terraform-bridge schema.go ``applyDefaults``)."""
    role = urn("aws:iam/role:Role", "mlp-dev-role")
    first, _ = check(provider, role, {"assumeRolePolicy": "{}"})
    assert first["name"].startswith("mlp-dev-role-") and len(first["name"]) == len("mlp-dev-role-") + 7
    assert first["__defaults"] == ["name"]
    again, _ = check(provider, role, {"assumeRolePolicy": "{\"changed\": true}"}, olds=first)
    assert again["name"] == first["name"]
    explicit, _ = check(provider, role, {"assumeRolePolicy": "{}", "name": "given"}, olds=first)
    assert explicit["name"] == "given" and explicit["__defaults"] == []
    # A replacement is checked with no olds (the engine re-runs Check) and takes a new name, so
    # the new role can exist beside the old one; that name then stays.
    create(provider, role, first)
    replacement, _ = check(provider, role, {"assumeRolePolicy": "{}"})
    assert replacement["name"] != first["name"] and replacement["name"].startswith("mlp-dev-role-")
    create(provider, role, replacement)
    kept, _ = check(provider, role, {"assumeRolePolicy": "{}", "description": "d"}, olds=replacement)
    assert kept["name"] == replacement["name"]


# -- Diff --------------------------------------------------------------------------------------------
def test_a_subnet_cidr_change_replaces_and_a_tag_change_updates(provider):
    subnet = urn("aws:ec2/subnet:Subnet", "private-a")
    inputs, subnet_id, outputs = created(provider, subnet, {"vpcId": "vpc-1", "cidrBlock": "10.0.0.0/20",
                                                            "availabilityZone": "us-west-2a"})
    moved, _ = check(provider, subnet, {**inputs, "cidrBlock": "10.0.16.0/20"}, olds=inputs)
    replaced = diff(provider, subnet, subnet_id, inputs, outputs, moved)
    assert list(replaced.replaces) == ["cidrBlock"]
    assert replaced.detailedDiff["cidrBlock"].kind == provider_pb2.PropertyDiff.UPDATE_REPLACE
    retagged, _ = check(provider, subnet, {**inputs, "tags": {"team": "a"}}, olds=inputs)
    updated = diff(provider, subnet, subnet_id, inputs, outputs, retagged)
    assert updated.changes == provider_pb2.DiffResponse.DIFF_SOME and list(updated.replaces) == []
    same = diff(provider, subnet, subnet_id, inputs, outputs, check(provider, subnet, inputs, olds=inputs)[0])
    assert same.changes == provider_pb2.DiffResponse.DIFF_NONE


def test_a_nested_force_new_path_replaces_the_top_level_property(provider):
    """terraform-provider-aws eks/cluster.go: ``kubernetes_network_config.service_ipv4_cidr``
    ForceNew; ``vpc_config.subnet_ids`` is not (EKS updates a cluster's subnets in place)."""
    cluster = urn("aws:eks/cluster:Cluster", "c-eksCluster")
    base = {"name": "c", "roleArn": "arn:aws:iam::1:role/r", "vpcConfig": {"subnetIds": ["subnet-a", "subnet-b"]},
            "kubernetesNetworkConfig": {"serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4"}}
    inputs, cluster_id, outputs = created(provider, cluster, base)
    cidr, _ = check(provider, cluster, {**base, "kubernetesNetworkConfig": {"serviceIpv4Cidr": "10.100.0.0/16",
                                                                           "ipFamily": "ipv4"}}, olds=inputs)
    response = diff(provider, cluster, cluster_id, inputs, outputs, cidr)
    assert list(response.replaces) == ["kubernetesNetworkConfig"]
    assert "kubernetesNetworkConfig.serviceIpv4Cidr" in response.detailedDiff
    # The cluster is named explicitly: the old one must go before the new one can take the name.
    assert response.deleteBeforeReplace is True
    subnets, _ = check(provider, cluster, {**base, "vpcConfig": {"subnetIds": ["subnet-a", "subnet-c"]}}, olds=inputs)
    response = diff(provider, cluster, cluster_id, inputs, outputs, subnets)
    assert list(response.replaces) == [] and list(response.diffs) == ["vpcConfig"]


def test_an_unknown_force_new_value_is_a_replacement(provider):
    """Terraform plans a ForceNew attribute whose new value is unknown as "forces replacement"."""
    from tools.engine.standins.wire import UNKNOWN

    subnet = urn("aws:ec2/subnet:Subnet", "s")
    inputs, subnet_id, outputs = created(provider, subnet, {"vpcId": "vpc-1", "cidrBlock": "10.0.0.0/20"})
    response = diff(provider, subnet, subnet_id, inputs, outputs, {**inputs, "vpcId": UNKNOWN})
    assert list(response.replaces) == ["vpcId"]


def test_delete_before_replace_only_for_an_explicit_name(provider):
    """pulumi-terraform-bridge ``nameRequiresDeleteBeforeReplace``: an autonamed resource can be
    created beside the old one (it gets a new name); an explicitly named one cannot."""
    group = urn("aws:ec2/securityGroup:SecurityGroup", "sg")
    inputs, group_id, outputs = created(provider, group, {"vpcId": "vpc-1", "description": "old"})
    news, _ = check(provider, group, {"vpcId": "vpc-1", "description": "new"}, olds=inputs)
    response = diff(provider, group, group_id, inputs, outputs, news)
    assert list(response.replaces) == ["description"] and response.deleteBeforeReplace is False
    named = urn("aws:iam/role:Role", "named")
    inputs, role_id, outputs = created(provider, named, {"assumeRolePolicy": "{}", "name": "mlp-x"})
    news, _ = check(provider, named, {"assumeRolePolicy": "{}", "name": "mlp-y"}, olds=inputs)
    response = diff(provider, named, role_id, inputs, outputs, news)
    assert list(response.replaces) == ["name"] and response.deleteBeforeReplace is True


def test_ignore_changes_paths_hide_only_what_they_name(provider):
    """pulumi-eks ignores ``accessConfig.bootstrapClusterCreatorAdminPermissions``; a change of
    ``accessConfig.authenticationMode`` still shows."""
    cluster = urn("aws:eks/cluster:Cluster", "c-eksCluster")
    base = {"name": "c", "roleArn": "r", "vpcConfig": {"subnetIds": ["a"]},
            "accessConfig": {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}}
    inputs, cluster_id, outputs = created(provider, cluster, base)
    flipped = {**inputs, "accessConfig": {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True}}
    ignored = ("accessConfig.bootstrapClusterCreatorAdminPermissions",)
    assert diff(provider, cluster, cluster_id, inputs, outputs, flipped, ignored).changes == provider_pb2.DiffResponse.DIFF_NONE
    assert list(diff(provider, cluster, cluster_id, inputs, outputs, flipped).replaces) == ["accessConfig"]
    mode = {**inputs, "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP",
                                       "bootstrapClusterCreatorAdminPermissions": False}}
    assert list(diff(provider, cluster, cluster_id, inputs, outputs, mode, ignored).diffs) == ["accessConfig"]


def test_a_write_only_input_never_diffs(provider):
    """Terraform write-only arguments (``secret_string_wo``) are neither stored nor compared; their
    ``..._wo_version`` decides when the value is sent again."""
    version = urn("aws:secretsmanager/secretVersion:SecretVersion", "v")
    inputs, version_id, outputs = created(provider, version, {"secretId": "s", "secretStringWo": "one",
                                                              "secretStringWoVersion": 1})
    assert "secretStringWo" not in outputs
    again, _ = check(provider, version, {**inputs, "secretStringWo": "two"}, olds=inputs)
    assert diff(provider, version, version_id, inputs, outputs, again).changes == provider_pb2.DiffResponse.DIFF_NONE
    bumped, _ = check(provider, version, {**inputs, "secretStringWo": "two", "secretStringWoVersion": 2}, olds=inputs)
    assert list(diff(provider, version, version_id, inputs, outputs, bumped).diffs) == ["secretStringWoVersion"]


def test_every_replacement_rule_names_an_input_a_stack_sets(dev_plan, prod_plan):
    """The table stays small and honest: each rule's property is declared by the pinned SDK and
    set (or autonamed) on some resource of a stack."""
    from infra.plan import input_rules
    from tools.engine.standins.wire import get_path

    resources = [r for plan in (dev_plan, prod_plan) for r in plan.recording.resources]
    for type_, rules in REPLACE_ON_CHANGE.items():
        of_type = [r for r in resources if r.type == type_]
        assert of_type, f"no stack creates {type_}"
        for rule in rules:
            assert rule.path.split(".")[0] in input_rules.input_names(type_), (type_, rule.path)
            autonamed = standin.autonamed_property(type_) == rule.path
            assert autonamed or any(get_path(r.inputs, rule.path) is not None for r in of_type), (type_, rule.path)
            assert rule.source


# -- Create / Read / Update / Delete -------------------------------------------------------------
def test_first_creation_gets_the_offline_plans_ids_and_a_replacement_new_ones(provider):
    from infra.plan import mock_outputs

    vpc = urn("aws:ec2/vpc:Vpc", "mlp-dev-network-vpc")
    inputs, vpc_id, outputs = created(provider, vpc, {"cidrBlock": "10.0.0.0/16"})
    assert vpc_id == mock_outputs.fabricate("aws:ec2/vpc:Vpc", "mlp-dev-network-vpc", vpc, {}, ACCOUNT, "us-west-2")[0]
    assert outputs["arn"] == f"arn:aws:ec2:us-west-2:{ACCOUNT}:vpc/{vpc_id}"
    assert outputs["tagsAll"] == {"environment": "dev"}
    second_id, _ = create(provider, vpc, inputs)
    assert second_id != vpc_id


def test_state_survives_the_process_and_read_reports_what_is_gone(provider, tmp_path):
    """A refresh in a later run (another plugin process) reads the same state; a resource deleted
    behind Pulumi's back reads as gone (empty id), which the engine drops from the stack."""
    key = urn("aws:kms/key:Key", "k")
    inputs, key_id, outputs = created(provider, key, {"description": "d"})
    later = standin.AwsStandIn(StateStore(tmp_path / "state"))
    assert read(later, key, key_id, outputs, inputs) == (key_id, outputs, inputs)
    new_outputs = update(later, key, key_id, outputs, {**inputs, "description": "e"}, inputs)
    assert new_outputs["description"] == "e" and new_outputs["arn"] == outputs["arn"]
    assert read(provider, key, key_id, outputs, inputs)[1]["description"] == "e"
    for path in (tmp_path / "state").rglob("resources/*.json"):
        path.unlink()
    assert read(provider, key, key_id, outputs, inputs)[0] == ""


def test_a_second_resource_with_a_taken_name_is_refused(provider):
    """IAM: "EntityAlreadyExists" for a role name in use in the account (any region)."""
    created(provider, urn("aws:iam/role:Role", "one"), {"assumeRolePolicy": "{}", "name": "mlp-deploy"})
    inputs, _ = check(provider, urn("aws:iam/role:Role", "two"), {"assumeRolePolicy": "{}", "name": "mlp-deploy"})
    with pytest.raises(Refused, match="AlreadyExists.*mlp-deploy"):
        create(provider, urn("aws:iam/role:Role", "two"), inputs)


def test_deletion_protection_refuses_the_delete(provider):
    """RDS DeleteDBCluster refuses a cluster with deletion protection on; off, it deletes."""
    cluster = urn("aws:rds/cluster:Cluster", "db")
    inputs, cluster_id, outputs = created(provider, cluster, {"engine": "aurora-postgresql", "deletionProtection": True})
    with pytest.raises(Refused, match="deletion protection"):
        delete(provider, cluster, cluster_id, outputs, inputs)
    outputs = update(provider, cluster, cluster_id, outputs, {**inputs, "deletionProtection": False}, inputs)
    delete(provider, cluster, cluster_id, outputs, inputs)
    assert read(provider, cluster, cluster_id, outputs, inputs)[0] == ""


def test_preview_create_leaves_computed_outputs_unknown_and_stores_nothing(provider, tmp_path):
    from tools.engine.standins.wire import UNKNOWN

    key = urn("aws:kms/key:Key", "k")
    inputs, _ = check(provider, key, {"description": "d"})
    resource_id, outputs = create(provider, key, inputs, preview=True)
    assert resource_id == "" and outputs["arn"] is UNKNOWN and outputs["description"] == "d"
    assert not list((tmp_path / "state").rglob("resources/*.json"))


def test_an_eks_cluster_reports_the_test_control_plane(provider, tmp_path, monkeypatch):
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"CERT")
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"token": "t"}}],
        "contexts": [{"name": "admin", "context": {"cluster": "t", "user": "admin"}}]}))
    monkeypatch.setenv("MLP_STANDIN_KUBECONFIG", str(kubeconfig))
    _, _, outputs = created(provider, urn("aws:eks/cluster:Cluster", "c"), {
        "name": "c", "roleArn": "r", "vpcConfig": {"subnetIds": ["a"]}})
    assert outputs["endpoint"] == "https://127.0.0.1:6443"
    assert outputs["certificateAuthority"] == {"data": "Q0VSVA=="}
    assert outputs["arn"] == f"arn:aws:eks:us-west-2:{ACCOUNT}:cluster/c"


# -- Invoke --------------------------------------------------------------------------------------
def test_invokes_answer_with_the_providers_account_and_region_and_refuse_the_rest(provider):
    from tools.engine.standins.wire import decode, encode

    answer = provider.Invoke(provider_pb2.InvokeRequest(tok="aws:index/getCallerIdentity:getCallerIdentity",
                                                        args=encode({})), Context())
    assert decode(getattr(answer, "return"))["accountId"] == ACCOUNT
    region = provider.Invoke(provider_pb2.InvokeRequest(tok="aws:index/getRegion:getRegion", args=encode({})), Context())
    assert decode(getattr(region, "return"))["name"] == "us-west-2"
    one, two = (decode(getattr(provider.Invoke(provider_pb2.InvokeRequest(
        tok="aws:secretsmanager/getRandomPassword:getRandomPassword", args=encode({"passwordLength": 48})),
        Context()), "return"))["randomPassword"] for _ in range(2))
    assert one != two  # every call draws, as Secrets Manager's GetRandomPassword does
    with pytest.raises(Refused, match="does not answer invoke aws:ec2/getAmi:getAmi"):
        provider.Invoke(provider_pb2.InvokeRequest(tok="aws:ec2/getAmi:getAmi", args=encode({})), Context())


# -- the executable --------------------------------------------------------------------------
def test_the_plugin_prints_its_port_and_answers_the_engines_first_calls(tmp_path):
    """What the engine does first (pulumi/pulumi sdk/go/common/resource/plugin/plugin.go): start
    ``pulumi-resource-aws <engine address>`` from PATH, read one line with the port, dial it, ask
    for the plugin's version."""
    env = {**os.environ, "MLP_STANDIN_PYTHON": sys.executable, "MLP_STANDIN_STATE_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    plugin = ROOT / "tools" / "engine" / "standins" / "pulumi-resource-aws"
    process = subprocess.Popen([str(plugin), "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               text=True)
    try:
        port = int(process.stdout.readline().strip())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            assert stub.GetPluginInfo(empty_pb2.Empty(), timeout=30).version == standin.VERSION == "7.51.1"
            handshake = stub.Handshake(provider_pb2.ProviderHandshakeRequest(engine_address="127.0.0.1:1"), timeout=30)
            assert handshake.accept_secrets is False and handshake.accept_resources is False
    finally:
        process.kill()
        process.wait(timeout=30)
