"""What the foundation asks AWS for: assertions on recorded resource inputs."""
from __future__ import annotations

import importlib
import inspect
import json
from functools import lru_cache

import pytest

CONTROL_PLANE_LOGS = {"api", "audit", "authenticator", "controllerManager", "scheduler"}
ADDONS = {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-ebs-csi-driver"}


def nodes(plan, resource_type):
    return [n for n in plan.graph if n["type"] == resource_type]


def test_eks_cluster_version_and_explicit_upgrade_policy(plan):
    (cluster,) = nodes(plan, "eks:index:Cluster")
    inputs = cluster["inputs"]
    assert cluster["remote"] is True
    assert inputs["version"] == "1.32"
    assert inputs["upgradePolicy"] == {"supportType": plan.config.cluster.upgrade_policy.value}


def test_cluster_endpoint_encryption_logging_and_access(plan):
    inputs = nodes(plan, "eks:index:Cluster")[0]["inputs"]
    assert inputs["endpointPrivateAccess"] is True
    assert set(inputs["enabledClusterLogTypes"]) == CONTROL_PLANE_LOGS
    assert inputs["authenticationMode"] == "API"
    assert inputs["skipDefaultNodeGroup"] is True
    secrets_key = plan.recording.one("aws:kms/key:Key", f"{plan.config.name}-cluster-secrets-key")
    assert secrets_key.inputs["enableKeyRotation"] is True
    assert inputs["encryptionConfigKeyArn"] == secrets_key.outputs["arn"]
    assert "accessEntries" not in inputs  # every entry is a visible aws:eks resource
    admin_policy = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    admins = {r.inputs["principalArn"] for r in plan.recording.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
              if r.inputs["policyArn"] == admin_policy and r.inputs["accessScope"] == {"type": "cluster"}}
    assert set(plan.config.cluster.admin_role_arns) <= admins
    if plan.config.cluster.deploy_role_arn:
        assert plan.config.cluster.deploy_role_arn in admins


def test_prod_endpoint_is_private_dev_public_only_to_listed_cidrs(dev_plan, prod_plan):
    prod = nodes(prod_plan, "eks:index:Cluster")[0]["inputs"]
    assert prod["endpointPublicAccess"] is False and "publicAccessCidrs" not in prod
    assert prod["deletionProtection"] is True
    dev = nodes(dev_plan, "eks:index:Cluster")[0]["inputs"]
    assert dev["endpointPublicAccess"] is True
    assert dev["publicAccessCidrs"] == [str(c) for c in dev_plan.config.cluster.public_access_cidrs]
    assert "0.0.0.0/0" not in dev["publicAccessCidrs"]


def test_managed_node_group_imdsv2_hop_limit_one_and_encrypted_gp3(plan):
    (group,) = nodes(plan, "aws:eks/nodeGroup:NodeGroup")
    (template,) = nodes(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    metadata = template["inputs"]["metadataOptions"]
    assert metadata["httpTokens"] == "required" and metadata["httpPutResponseHopLimit"] == 1
    (disk,) = template["inputs"]["blockDeviceMappings"]
    assert disk["ebs"]["volumeType"] == "gp3" and disk["ebs"]["encrypted"] == "true"
    inputs = group["inputs"]
    assert inputs["amiType"].startswith("AL2023")
    assert inputs["launchTemplate"]["id"] == plan.recording.one("aws:ec2/launchTemplate:LaunchTemplate").id
    sizes = plan.config.cluster.system_node_group
    assert inputs["scalingConfig"] == {"minSize": sizes.min_size, "maxSize": sizes.max_size,
                                       "desiredSize": sizes.desired_size}
    assert {"key": "CriticalAddonsOnly", "value": "true", "effect": "NO_SCHEDULE"} in inputs["taints"]
    assert inputs["labels"] == {"node.mlplatform.io/role": "system"}


def test_five_pinned_managed_addons_and_ebs_csi_through_pod_identity(plan):
    from catalog.versions import EKS_ADDON_VERSIONS

    addons = {n["inputs"]["addonName"]: n for n in nodes(plan, "aws:eks/addon:Addon")}
    assert ADDONS <= set(addons)
    for name, node in addons.items():
        assert node["inputs"]["addonVersion"] == EKS_ADDON_VERSIONS[name]
    (association,) = addons["aws-ebs-csi-driver"]["inputs"]["podIdentityAssociations"]
    role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.outputs["arn"] == association["roleArn"])
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(trust["Action"]) == {"sts:AssumeRole", "sts:TagSession"}


def test_network_policies_are_enforced_by_the_cni_from_the_pods_first_packet(plan):
    """EKS User Guide, "Restrict Pod network traffic with Kubernetes network policies", step 1: "Set
    up policy enforcement at Pod startup ... in the aws-node container"; amazon-vpc-cni-k8s v1.20.1
    README, NETWORK_POLICY_ENFORCING_MODE: in ``standard`` mode "containers in the new pod will start
    with a default allow policy" until the pod's policies are configured, in ``strict`` mode "with a
    default deny policy". The add-on takes it as the chart value ``env.NETWORK_POLICY_ENFORCING_MODE``
    (charts/aws-vpc-cni/values.yaml at v1.20.1: ``env:`` ... ``NETWORK_POLICY_ENFORCING_MODE: "standard"``)."""
    cni = next(r for r in plan.recording.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "vpc-cni")
    values = json.loads(cni.inputs["configurationValues"])
    assert values["enableNetworkPolicy"] == "true"
    assert values["env"]["NETWORK_POLICY_ENFORCING_MODE"] == "strict"


def _selects_every_pod(policy) -> bool:
    return policy.inputs.get("spec", {}).get("podSelector") in ({}, None)


def test_under_strict_enforcement_every_namespace_that_runs_pods_has_a_policy_first(plan):
    """"In Strict Mode, you must have a network policy defined for every pod in your cluster. Host
    Networking pods are exempted" (amazon-vpc-cni-k8s README). A namespace where the plan puts pods
    (a Helm release's, kube-system's EKS add-ons, a team's) must have a policy selecting every pod,
    created before what runs the pods: otherwise they start without a network (CoreDNS cannot reach
    the API and its add-on never turns ACTIVE). kubeflow's policy comes with the Training Operator's
    overlay (tests/infra/test_first_deploy.py); the team namespaces' default-deny is theirs."""
    policies: dict[str, list] = {}
    for policy in plan.recording.by_type("kubernetes:networking.k8s.io/v1:NetworkPolicy"):
        if _selects_every_pod(policy):
            policies.setdefault(policy.inputs["metadata"]["namespace"], []).append(policy)
    runs_pods = {r.inputs["namespace"]: r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release")}
    missing = sorted(ns for ns in [*runs_pods, "kube-system", *plan.config.team_namespaces] if ns not in policies)
    assert not missing, f"namespaces whose pods would have no network under strict enforcement: {missing}"
    for namespace, release in runs_pods.items():
        waited = {p.urn for p in policies[namespace]} & set(release.dependencies)
        assert waited, f"{release.name} may start pods in {namespace} before their policy exists"
    kube_system = {p.urn for p in policies["kube-system"]}
    for addon in plan.recording.by_type("aws:eks/addon:Addon"):
        if addon.inputs["addonName"] in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
            continue  # hostNetwork DaemonSets: exempt, and the nodes need them first
        assert kube_system & set(addon.dependencies), f"{addon.inputs['addonName']} starts pods before kube-system's policy"


def test_node_group_waits_for_the_cni(plan):
    group = plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    cni = next(r for r in plan.recording.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "vpc-cni")
    assert cni.urn in group.dependencies


def test_flow_logs_go_to_the_log_archive(plan):
    (flow_log,) = nodes(plan, "aws:ec2/flowLog:FlowLog")
    archive = plan.recording.one("aws:s3/bucket:Bucket", f"{plan.config.name}-log-archive-logs-bucket")
    assert flow_log["inputs"]["logDestinationType"] == "s3"
    assert flow_log["inputs"]["logDestination"].startswith(archive.outputs["arn"] + "/")
    assert flow_log["account"] == "workload"
    policy = json.loads(plan.recording.one("aws:s3/bucketPolicy:BucketPolicy",
                                          f"{plan.config.name}-log-archive-logs-policy").inputs["policy"])
    delivery = next(s for s in policy["Statement"] if s.get("Sid") == "FlowLogDeliveryWrite")
    # Only the account whose VPC writes flow logs (see test_security_aws for the delivery path).
    assert delivery["Condition"]["StringEquals"]["aws:SourceAccount"] == [plan.config.accounts.workload.id]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in policy["Statement"])


def test_log_archive_bucket_is_encrypted_private_versioned_and_in_logging_account(plan):
    archive = f"{plan.config.name}-log-archive-logs"
    by_name = {n["name"]: n for n in plan.graph}
    encryption = by_name[f"{archive}-encryption"]["inputs"]["rules"][0]
    assert encryption["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    access = by_name[f"{archive}-public-access"]["inputs"]
    assert all(access[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                          "restrictPublicBuckets"))
    assert by_name[f"{archive}-ownership"]["inputs"]["rule"] == {"objectOwnership": "BucketOwnerEnforced"}
    assert by_name[f"{archive}-versioning"]["inputs"]["versioningConfiguration"] == {"status": "Enabled"}
    lifecycle = by_name[f"{archive}-lifecycle"]["inputs"]["rules"][0]
    assert lifecycle["expiration"] == {"days": plan.config.log_archive.expiration_days}
    assert by_name[f"{archive}-bucket"]["account"] == "logging"


def test_network_layout_follows_config(plan):
    net = plan.config.network
    subnets = nodes(plan, "aws:ec2/subnet:Subnet")
    private = [s for s in subnets if s["inputs"]["tags"].get("subnet-tier") == "private"]
    public = [s for s in subnets if s["inputs"]["tags"].get("subnet-tier") == "public"]
    # Sorted: Pulumi registers the subnets concurrently, so the recording's order varies under load.
    assert sorted(s["inputs"]["cidrBlock"] for s in private) == sorted(str(c) for c in net.private_subnet_cidrs)
    assert sorted(s["inputs"]["cidrBlock"] for s in public) == sorted(str(c) for c in net.public_subnet_cidrs)
    assert all(s["inputs"]["tags"]["karpenter.sh/discovery"] == plan.config.cluster_name for s in private)
    assert all(s["inputs"]["tags"]["kubernetes.io/role/internal-elb"] == "1" for s in private)
    # Nothing needs public load balancers discovered by tag: the MLflow ALB names its subnets.
    assert all("kubernetes.io/role/elb" not in s["inputs"]["tags"] for s in public)
    assert all(s["inputs"]["mapPublicIpOnLaunch"] is False for s in public)
    num_nats = {"none": 0, "single": 1, "one_per_az": len(net.availability_zones)}[net.nat.value]
    assert len(nodes(plan, "aws:ec2/natGateway:NatGateway")) == num_nats
    services = {n["inputs"]["serviceName"].split(f"{plan.config.region}.", 1)[1] for n in nodes(plan, "aws:ec2/vpcEndpoint:VpcEndpoint")}
    interface = {"ecr.api", "ecr.dkr", "sts", "logs", "sqs", "ec2"} if plan.config.interface_endpoints else set()
    assert services == {"s3"} | interface


def test_interface_endpoints_default_on_in_prod_off_in_dev(dev_plan, prod_plan, plan_config):
    from infra.config import load_platform_config
    from tests.conftest import stack_config

    assert dev_plan.config.interface_endpoints is False and prod_plan.config.interface_endpoints is True
    for stack in ("dev", "prod"):
        raw = stack_config(stack)
        raw["network"].pop("interfaceEndpoints", None)
        assert load_platform_config(raw).interface_endpoints is (stack == "prod")
    raw = stack_config("dev")
    raw["network"]["interfaceEndpoints"] = True  # asked for explicitly
    endpoints = plan_config("dev", raw).recording.by_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert len([e for e in endpoints if e.inputs["vpcEndpointType"] == "Interface"]) == 6


def test_one_nat_per_az_in_prod_routes_each_az_to_its_own_gateway(prod_plan):
    nats = {r.name: r for r in prod_plan.recording.by_type("aws:ec2/natGateway:NatGateway")}
    tables = [r for r in prod_plan.recording.by_type("aws:ec2/routeTable:RouteTable") if "private" in r.name]
    targets = {t.inputs["routes"][0]["natGatewayId"] for t in tables}
    assert len(targets) == len(tables) == len(nats) == 3


def test_no_security_group_ingress_from_the_internet(plan):
    for node in plan.graph:
        if node["type"] == "aws:ec2/securityGroup:SecurityGroup":
            for rule in node["inputs"].get("ingress", []):
                assert "0.0.0.0/0" not in rule.get("cidrBlocks", []), node["name"]
        if node["type"] in ("aws:ec2/securityGroupRule:SecurityGroupRule",
                            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
            if node["inputs"].get("type", "ingress") == "ingress":
                assert node["inputs"].get("cidrIpv4") != "0.0.0.0/0", node["name"]
                assert "0.0.0.0/0" not in node["inputs"].get("cidrBlocks", []), node["name"]
    default_sg = next(n for n in plan.graph if n["type"] == "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert default_sg["inputs"]["ingress"] == [] and default_sg["inputs"]["egress"] == []


def test_every_aws_and_kubernetes_resource_has_an_explicit_provider(plan):
    for node in plan.graph:
        if node["type"].startswith(("aws:", "kubernetes:")):
            assert node["provider"], f"{node['type']} {node['name']} has no provider"
        if node["type"].startswith("aws:"):
            assert node["account"] in ("automation", "workload", "logging"), node["name"]


def test_resources_live_in_the_account_they_belong_to(plan):
    accounts = {n["name"]: n["account"] for n in plan.graph}
    name = plan.config.name
    assert accounts[f"{name}-log-archive-logs-bucket"] == "logging"
    assert accounts[f"{name}-log-archive-key"] == "logging"
    assert accounts[f"{name}-network-vpc"] == "workload"
    assert accounts[f"{name}-cluster-eks"] == "workload"
    providers = {n["name"]: n["inputs"] for n in plan.graph if n["type"] == "pulumi:providers:aws"}
    for key in ("automation", "workload", "logging"):
        account = getattr(plan.config.accounts, key)
        inputs = providers[f"{key}-account"]
        assert inputs["allowedAccountIds"] == [account.id]
        assert inputs["assumeRoles"][0]["roleArn"] == account.role_arn
        assert inputs["region"] == plan.config.region


@lru_cache(maxsize=None)
def is_taggable(resource_type: str) -> bool:
    """True when the pulumi-aws resource class takes a `tags` argument."""
    _, module_path, class_name = resource_type.split(":")
    module = importlib.import_module(f"pulumi_aws.{module_path.split('/')[0]}")
    resource_class = getattr(module, class_name)
    return "tags" in inspect.signature(resource_class._internal_init).parameters


def test_tags_on_every_taggable_resource(plan):
    expected = plan.config.resource_tags
    checked = 0
    for node in plan.graph:
        if node["type"].startswith("aws:") and is_taggable(node["type"]):
            tags = node["inputs"].get("tags") or {}
            missing = {k: v for k, v in expected.items() if tags.get(k) != v}
            assert not missing, f"{node['type']} {node['name']} lacks tags {missing}"
            checked += 1
    assert checked >= 20


def test_stateful_resources_protected_in_prod_only(dev_plan, prod_plan):
    stateful = ("aws:s3/bucket:Bucket", "aws:kms/key:Key", "eks:index:Cluster")
    for resource_type in stateful:
        assert all(r.protect for r in prod_plan.recording.by_type(resource_type)), resource_type
        assert not any(r.protect for r in dev_plan.recording.by_type(resource_type)), resource_type


def test_kubernetes_provider_and_default_storage_class(plan):
    # The platform's own provider; pulumi-eks registers another, `<component>-eks-k8s`, that
    # nothing of ours uses (nodejs/eks/cluster/cluster.ts).
    (eks,) = nodes(plan, "eks:index:Cluster")
    (provider,) = [n for n in plan.graph if n["type"] == "pulumi:providers:kubernetes" and n["parent"] != eks["name"]]
    assert provider["inputs"]["kubeconfig"]
    (storage,) = nodes(plan, "kubernetes:storage.k8s.io/v1:StorageClass")
    assert storage["provider"] == provider["name"]
    assert storage["inputs"]["parameters"]["encrypted"] == "true"
    assert storage["inputs"]["parameters"]["type"] == "gp3"
    assert storage["inputs"]["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"


def test_stack_outputs(plan):
    outputs = plan.recording.stack_outputs
    assert outputs["clusterName"] == plan.config.cluster_name
    assert outputs["kubeconfig"] == "[secret]"
    assert outputs["clusterEndpoint"].startswith("https://")
    assert len(outputs["privateSubnetIds"]) == len(plan.config.network.availability_zones)
    for key in ("vpcId", "nodeSecurityGroupId", "logArchiveBucket", "oidcIssuer"):
        assert outputs[key], key


def test_pulumi_eks_inputs_match_the_pinned_schema(plan, schemas):
    schema = json.loads((schemas / "pulumi" / "pulumi-eks-schema.json").read_text())
    resource = schema["resources"]["eks:index:Cluster"]
    allowed = resource["inputProperties"]
    inputs = nodes(plan, "eks:index:Cluster")[0]["inputs"]
    unknown = set(inputs) - set(allowed)
    assert not unknown, f"inputs pulumi-eks does not declare: {unknown}"
    for key, value in inputs.items():
        declared = allowed[key].get("type")
        python_types = {"boolean": bool, "string": str, "array": list, "object": dict, "integer": int}
        if declared in python_types:
            assert isinstance(value, python_types[declared]), f"{key}: {value!r} is not {declared}"
    assert set(resource.get("requiredInputs", [])) <= set(inputs)
