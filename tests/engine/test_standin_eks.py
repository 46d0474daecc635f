"""The ``eks`` stand-in and the one model of pulumi-eks's ``Cluster`` it shares with the offline plan
(``infra/plan/pulumi_eks.py``), held to pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts.

The stand-in's ``Construct`` registers children through whatever resource monitor it is given; here
that is the recording engine, so the children it registers can be compared with the ones the offline
plan records for the program's remote ``eks.Cluster``: the two must be the same graph.
"""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2_grpc

from infra.plan import pulumi_eks
from infra.plan.mock_engine import EngineRefusal, run_recorded

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "222233334444"

# The platform's options (components/cluster.py), as wire inputs of eks:index:Cluster.
OPTIONS = {
    "name": "mlp-t-eks", "version": "1.32", "upgradePolicy": {"supportType": "EXTENDED"}, "vpcId": "vpc-1",
    "privateSubnetIds": ["subnet-a", "subnet-b"], "endpointPrivateAccess": True, "endpointPublicAccess": True,
    "publicAccessCidrs": ["203.0.113.0/24"], "encryptionConfigKeyArn": f"arn:aws:kms:us-west-2:{ACCOUNT}:key/k",
    "enabledClusterLogTypes": ["api", "audit"], "authenticationMode": "API",
    "kubernetesServiceIpAddressRange": "172.20.0.0/16", "skipDefaultNodeGroup": True, "skipDefaultSecurityGroups": True,
    "bootstrapSelfManagedAddons": False, "useDefaultVpcCni": True, "corednsAddonOptions": {"enabled": False},
    "kubeProxyAddonOptions": {"enabled": False}, "createOidcProvider": False, "deletionProtection": True,
    "providerCredentialOpts": {"roleArn": f"arn:aws:iam::{ACCOUNT}:role/deploy"}, "tags": {"team": "ml-platform"},
}


def _sdk_kwargs(options: dict) -> dict:
    """The same options as the program passes them to pulumi_eks.Cluster."""
    return dict(
        name=options["name"], version=options["version"], upgrade_policy={"support_type": "EXTENDED"},
        vpc_id=options["vpcId"], private_subnet_ids=options["privateSubnetIds"], endpoint_private_access=True,
        endpoint_public_access=True, public_access_cidrs=options["publicAccessCidrs"],
        encryption_config_key_arn=options["encryptionConfigKeyArn"], enabled_cluster_log_types=options["enabledClusterLogTypes"],
        authentication_mode=eks.AuthenticationMode.API, kubernetes_service_ip_address_range="172.20.0.0/16",
        skip_default_node_group=True, skip_default_security_groups=True, bootstrap_self_managed_addons=False,
        use_default_vpc_cni=True, coredns_addon_options={"enabled": False}, kube_proxy_addon_options={"enabled": False},
        create_oidc_provider=False, deletion_protection=True, provider_credential_opts={"role_arn": f"arn:aws:iam::{ACCOUNT}:role/deploy"},
        tags=options["tags"])


def _program(build):
    def program():
        provider = aws.Provider("workload", region="us-west-2",
                                assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=f"arn:aws:iam::{ACCOUNT}:role/deploy")])
        parent = pulumi.ComponentResource("mlplatform:test:Cluster", "mlp-t-cluster", {},
                                          pulumi.ResourceOptions(providers={"aws": provider}))
        component = build(parent)
        pulumi.export("kubeconfigJson", component.kubeconfig_json if hasattr(component, "kubeconfig_json")
                      else component.state["kubeconfigJson"])
    return program


def _record(build, config=None):
    return run_recorded(_program(build), project="p", stack="s",
                        config=config or {"pulumi:disable-default-providers": '["aws", "kubernetes"]'})


def _children(recording, component_type):
    """(type, name, parent name, inputs) of everything below the eks component, ids for references."""
    component = next(r for r in recording.resources if r.type == component_type)
    by_urn = {r.urn: r for r in recording.resources}
    ids = {r.urn: r.id for r in recording.resources}

    def below(resource):
        parent = by_urn.get(resource.parent)
        while parent is not None:
            if parent.urn == component.urn:
                return True
            parent = by_urn.get(parent.parent)
        return False

    def plain(value):
        if isinstance(value, str) and value in ids:
            return ids[value]  # a resource reference the SDK sent (the engine hands the provider its id)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return component, sorted(
        (r.type, r.name, by_urn[r.parent].name, json.dumps(plain(r.inputs), sort_keys=True),
         tuple(sorted(r.ignore_changes)), r.provider and by_urn[r.provider].name)
        for r in recording.resources if below(r))


@pytest.fixture
def no_healthz_wait(monkeypatch):
    from tools.engine.standins import eks as standin

    calls = []
    monkeypatch.setattr(standin, "wait_for_healthz", lambda endpoint, tries=0: calls.append(endpoint) or endpoint)
    return calls


def test_the_stand_in_registers_exactly_the_children_the_offline_plan_records(no_healthz_wait):
    from tools.engine.standins.eks import ClusterComponent

    offline = _record(lambda parent: eks.Cluster("mlp-t-cluster-eks", opts=pulumi.ResourceOptions(parent=parent),
                                                 **_sdk_kwargs(OPTIONS)))
    standin = _record(lambda parent: ClusterComponent("mlp-t-cluster-eks", OPTIONS, pulumi.ResourceOptions(parent=parent)))
    _, recorded = _children(offline, "eks:index:Cluster")
    _, registered = _children(standin, "eks:index:Cluster")
    assert registered == recorded
    assert [(t, n) for t, n, *_ in registered] == sorted([
        ("aws:eks/cluster:Cluster", "mlp-t-cluster-eks-eksCluster"),
        ("aws:iam/role:Role", "mlp-t-cluster-eks-eksRole-role"),
        ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "mlp-t-cluster-eks-eksRole-4b490823"),
        ("eks:index:ServiceRole", "mlp-t-cluster-eks-eksRole"),
        ("pulumi:providers:kubernetes", "mlp-t-cluster-eks-eks-k8s"),
    ])
    # Both the same kubeconfig for the program (no control plane configured here).
    assert standin.stack_outputs["kubeconfigJson"] == offline.stack_outputs["kubeconfigJson"]
    assert no_healthz_wait == [json.loads(offline.stack_outputs["kubeconfigJson"])["clusters"][0]["cluster"]["server"]]


def test_the_eks_cluster_child_takes_the_shape_cluster_ts_gives_it(dev_plan):
    """cluster.ts createCore: ``kubernetesNetworkConfig: {serviceIpv4Cidr, ipFamily}`` (not the
    component's flattened ``kubernetesServiceIpAddressRange``), ``roleArn`` of the ``-eksRole``
    ServiceRole's role, ``subnetIds`` = public then private, ``Name`` tag, two ignoreChanges."""
    component = dev_plan.recording.one("eks:index:Cluster")
    child = dev_plan.recording.one("aws:eks/cluster:Cluster")
    role = next(r for r in dev_plan.recording.resources if r.name == f"{component.name}-eksRole-role")
    assert "kubernetesServiceIpAddressRange" not in child.inputs
    assert child.inputs["kubernetesNetworkConfig"] == {
        "serviceIpv4Cidr": component.inputs["kubernetesServiceIpAddressRange"], "ipFamily": "ipv4"}
    assert child.inputs["roleArn"] == role.outputs["arn"]
    assert child.inputs["vpcConfig"]["subnetIds"] == component.inputs["privateSubnetIds"]
    assert child.inputs["tags"]["Name"] == f"{component.name}-eksCluster"
    assert child.ignore_changes == ["accessConfig.bootstrapClusterCreatorAdminPermissions", "bootstrapSelfManagedAddons"]
    assert role.urn in child.dependencies
    # The program's transform still reaches the child (components/cluster.py).
    assert child.inputs["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}


def test_the_offline_plan_refuses_an_input_a_transform_adds_that_the_sdk_does_not_declare():
    """One home for the input rules: a transform is invisible to the SDK's keyword arguments, so
    only the provider's Check (here, the recording engine's) can refuse its typo."""
    def typo(args: pulumi.ResourceTransformArgs):
        if args.type_ == "aws:eks/cluster:Cluster":
            return pulumi.ResourceTransformResult(props={**args.props, "kubernetesServiceIpv4Cidr": "10.0.0.0/16"},
                                                  opts=args.opts)
        return None

    with pytest.raises(EngineRefusal) as refusal:
        _record(lambda parent: eks.Cluster("c", opts=pulumi.ResourceOptions(parent=parent, transforms=[typo]),
                                           **_sdk_kwargs(OPTIONS)))
    assert "aws:eks/cluster:Cluster 'c-eksCluster' input `kubernetesServiceIpv4Cidr`" in str(refusal.value)


def test_construct_refuses_a_component_input_pulumi_eks_does_not_declare():
    from pulumi.errors import InputPropertiesError

    from tools.engine.standins.eks import EksStandIn

    with pytest.raises(InputPropertiesError) as refusal:
        EksStandIn().construct("c", "eks:index:Cluster", {**OPTIONS, "serviceIpv4Cidr": "10.0.0.0/16"})
    assert [e["property_path"] for e in refusal.value.errors] == ["serviceIpv4Cidr"]


def test_options_the_model_does_not_cover_are_refused_by_name():
    problems = pulumi_eks.unsupported_options({**OPTIONS, "skipDefaultNodeGroup": False, "createOidcProvider": True,
                                               "kubeProxyAddonOptions": {}})
    assert any(p.startswith("skipDefaultNodeGroup") for p in problems)
    assert any(p.startswith("createOidcProvider") for p in problems)
    assert any(p.startswith("kubeProxyAddonOptions") for p in problems)
    assert pulumi_eks.unsupported_options(OPTIONS) == []
    with pytest.raises(EngineRefusal, match="skipDefaultNodeGroup must be true"):
        _record(lambda parent: eks.Cluster("c", opts=pulumi.ResourceOptions(parent=parent),
                                           **{**_sdk_kwargs(OPTIONS), "skip_default_node_group": False}))


def test_public_access_cidrs_without_public_access_is_refused_as_cluster_ts_refuses_it():
    with pytest.raises(ValueError, match="`publicAccessCidrs` can only be set when `endpointPublicAccess` is true"):
        pulumi_eks._public_access_cidrs(["10.0.0.0/8"], False)


def test_kubeconfig_is_generate_kubeconfig_with_the_control_planes_user(no_healthz_wait, tmp_path, monkeypatch):
    """cluster.ts generateKubeconfig: cluster ``kubernetes``, context and user ``aws``; with a
    control plane configured, its admin credentials replace the ``aws eks get-token`` plugin."""
    from tools.engine.standins.eks import ClusterComponent

    key = tmp_path / "admin.key"
    key.write_bytes(b"KEY")
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": "Q0VSVA==", "client-key": str(key)}}],
        "contexts": [{"name": "admin", "context": {"cluster": "t", "user": "admin"}}]}))
    monkeypatch.setenv("MLP_STANDIN_KUBECONFIG", str(kubeconfig))
    recording = _record(lambda parent: ClusterComponent("c", OPTIONS, pulumi.ResourceOptions(parent=parent)))
    config = json.loads(recording.stack_outputs["kubeconfigJson"])
    assert config["users"] == [{"name": "aws", "user": {"client-certificate-data": "Q0VSVA==",
                                                          "client-key-data": "S0VZ"}}]
    assert config["contexts"] == [{"context": {"cluster": "kubernetes", "user": "aws"}, "name": "aws"}]
    exec_user = pulumi_eks.generate_kubeconfig("n", "https://e", "us-west-2", True, "Q0E=",
                                               {"roleArn": "arn:r", "profileName": "p"})["users"][0]["user"]["exec"]
    assert exec_user["args"] == ["--region", "us-west-2", "eks", "get-token", "--cluster-name", "n", "--output", "json",
                                 "--role", "arn:r", "--profile", "p"]


def test_the_healthz_wait_returns_once_the_endpoint_answers():
    from tools.engine.standins import eks as standin

    answers = iter([500, 200])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(next(answers))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        original = standin.HEALTHZ_PAUSE_S
        standin.HEALTHZ_PAUSE_S = 0.01
        endpoint = f"http://127.0.0.1:{server.server_port}"
        assert standin.wait_for_healthz(endpoint, tries=3) == endpoint
        with pytest.raises(StopIteration):
            next(answers)  # exactly two requests: one refused, one answered
    finally:
        standin.HEALTHZ_PAUSE_S = original
        server.shutdown()


def test_the_plugin_reports_the_pinned_pulumi_eks_version(tmp_path):
    env = {**os.environ, "MLP_STANDIN_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    plugin = ROOT / "tools" / "engine" / "standins" / "pulumi-resource-eks"
    process = subprocess.Popen([str(plugin), "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               text=True)
    try:
        port = int(process.stdout.readline().strip())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            assert stub.GetPluginInfo(empty_pb2.Empty(), timeout=60).version == pulumi_eks.VERSION == "4.4.0"
    finally:
        process.kill()
        process.wait(timeout=30)
