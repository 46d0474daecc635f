"""Pure builders of GPU capacity manifests: golden files, training-safety invariants, CRD schemas.

Regenerate golden files after an intended change with ``UPDATE_GOLDEN=1 pytest tests/workloads``
and review the diff.
"""
from __future__ import annotations


import pytest
import yaml

from workloads import kueue, scheduling
from workloads.karpenter import (
    EFS_STARTUP_TAINT, FSX_STARTUP_TAINT, GPU_TAINT, S3_MOUNTPOINT_STARTUP_TAINT, CapacityType, ConsolidationPolicy, CpuPoolSpec, GpuPoolSpec, NodeClassSpec,
    cpu_node_class, cpu_node_pool, efa_network_interfaces, gpu_node_class, gpu_node_pool,
)
from tests.support.validation import validate_core, validate_custom_resource
from tests.workloads.golden_files import assert_golden

NODE_CLASS = NodeClassSpec(cluster_name="mlp-test-eks", node_role_name="mlp-test-karpenter-node",
                           cluster_security_group_id="sg-0123456789abcdef0", tags={"team": "ml-platform"})
H100 = GpuPoolSpec(name="h100", gpu_type="h100", gpus_per_node=8,
                   capacity_types=(CapacityType.SPOT, CapacityType.ON_DEMAND), max_gpus=64, efa=True,
                   zones=("us-west-2a", "us-west-2b"), root_volume_gib=500, consolidate_after="15m",
                   expire_after="720h", termination_grace_period_seconds=110, ami_alias="al2023@v20251023")
L4 = GpuPoolSpec(name="l4", gpu_type="l4", gpus_per_node=1, capacity_types=(CapacityType.SPOT,), max_gpus=4)
RESERVED = GpuPoolSpec(name="a100-reserved", gpu_type="a100-80gb", gpus_per_node=8,
                       capacity_types=(CapacityType.RESERVED, CapacityType.ON_DEMAND), max_gpus=32,
                       capacity_reservation_ids=("cr-0a1b2c3d4e5f60718",), ami_alias="bottlerocket@v1.30.0")
TEAM_NS = scheduling.TeamNamespaceSpec(team="research", namespace="team-research", gpu_quota=24, vpc_cidr="10.50.0.0/16",
                                       s3_prefix_list_cidrs=("198.18.16.0/20", "198.18.0.0/20"))
FLAVORS = [kueue.FlavorSpec("h100", H100.node_labels, 64, 8, efa_devices_per_node=H100.shapes[0].num_efa_network_cards),
           kueue.FlavorSpec("l4", L4.node_labels, 4, 1)]
TEAM_Q = kueue.TeamQueueSpec(team="research", namespace="team-research", gpu_quota={"h100": 16, "l4": 2}, fair_sharing_weight=2)


def _golden(name: str, documents: list[dict]) -> None:
    assert_golden(name, yaml.safe_dump_all(documents, sort_keys=True))


FSX = (FSX_STARTUP_TAINT,)
CASES = {
    # Storage mode fsx: the FSx CSI driver's startup taint (the stack passes its storage mode's).
    "nodepool-h100-efa": lambda: [gpu_node_pool(H100, storage_startup_taints=FSX), gpu_node_class(H100, NODE_CLASS)],
    "nodepool-l4-spot": lambda: [gpu_node_pool(L4, storage_startup_taints=FSX), gpu_node_class(L4, NODE_CLASS)],
    "nodepool-a100-reserved": lambda: [gpu_node_pool(RESERVED, storage_startup_taints=FSX), gpu_node_class(RESERVED, NODE_CLASS)],
    "nodepool-cpu-general": lambda: [cpu_node_pool(CpuPoolSpec(), storage_startup_taints=FSX),
                                     cpu_node_class(CpuPoolSpec(), NODE_CLASS)],
    "kueue-research": lambda: [*(kueue.resource_flavor(f) for f in FLAVORS), kueue.cluster_queue(TEAM_Q, FLAVORS),
                               kueue.local_queue(TEAM_Q)],
    "team-research": lambda: [*scheduling.priority_classes(), *scheduling.team_objects(TEAM_NS)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    _golden(case, CASES[case]())


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_validates(case, schemas):
    for obj in CASES[case]():
        if "." in obj["apiVersion"].split("/")[0] and not obj["apiVersion"].startswith(("scheduling.k8s.io", "networking.k8s.io")):
            assert validate_custom_resource(obj, schemas) == [], obj["metadata"]["name"]
        else:
            assert validate_core(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("pool", [H100, L4, RESERVED], ids=lambda p: p.name)
def test_gpu_pool_is_training_safe(pool):
    spec = gpu_node_pool(pool, storage_startup_taints=FSX)["spec"]
    template = spec["template"]["spec"]
    assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert {"nodes": "0", "reasons": ["Drifted", "Underutilized"]} in spec["disruption"]["budgets"]
    assert GPU_TAINT in template["taints"]
    assert FSX_STARTUP_TAINT in template["startupTaints"]
    assert FSX_STARTUP_TAINT not in template["taints"]
    assert spec["limits"] == {"nvidia.com/gpu": str(pool.max_gpus)}
    assert template["terminationGracePeriod"] == f"{pool.termination_grace_period_seconds}s"
    node_class = gpu_node_class(pool, NODE_CLASS)["spec"]
    assert node_class["metadataOptions"]["httpTokens"] == "required"
    assert node_class["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert all(b["ebs"]["encrypted"] and b["ebs"]["volumeType"] == "gp3" for b in node_class["blockDeviceMappings"])
    assert node_class["instanceStorePolicy"] == "RAID0"
    assert node_class["role"] == NODE_CLASS.node_role_name


def test_requirements_pin_gpu_name_family_count_and_capacity():
    reqs = {r["key"]: r for r in gpu_node_pool(H100)["spec"]["template"]["spec"]["requirements"]}
    assert reqs["karpenter.k8s.aws/instance-gpu-name"]["values"] == ["h100"]
    assert reqs["karpenter.k8s.aws/instance-family"]["values"] == ["p5"]
    assert reqs["karpenter.k8s.aws/instance-gpu-count"]["values"] == ["8"]
    assert reqs["node.kubernetes.io/instance-type"]["values"] == ["p5.48xlarge"]  # EFA-capable size only
    assert reqs["karpenter.sh/capacity-type"]["values"] == ["spot", "on-demand"]
    assert reqs["topology.kubernetes.io/zone"]["values"] == ["us-west-2a", "us-west-2b"]
    assert reqs["kubernetes.io/arch"]["values"] == ["amd64"]


def test_a100_80gb_is_told_apart_from_a100_by_family():
    a100 = GpuPoolSpec(name="x", gpu_type="a100", gpus_per_node=8, capacity_types=(CapacityType.ON_DEMAND,), max_gpus=8)
    reqs = lambda p: {r["key"]: r["values"] for r in gpu_node_pool(p)["spec"]["template"]["spec"]["requirements"]}
    assert reqs(a100)["karpenter.k8s.aws/instance-gpu-name"] == reqs(RESERVED)["karpenter.k8s.aws/instance-gpu-name"] == ["a100"]
    assert reqs(a100)["karpenter.k8s.aws/instance-family"] == ["p4d"]
    assert reqs(RESERVED)["karpenter.k8s.aws/instance-family"] == ["p4de"]


def test_efa_interfaces_follow_ec2_layout():
    interfaces = gpu_node_class(H100, NODE_CLASS)["spec"]["networkInterfaces"]
    assert interfaces[0] == {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    assert interfaces[1] == {"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"}
    assert len(interfaces) == 33  # p5.48xlarge: 32 network cards, each with one EFA-only interface
    assert {i["networkCardIndex"] for i in interfaces if i["interfaceType"] == "efa-only"} == set(range(32))
    assert "networkInterfaces" not in gpu_node_class(L4, NODE_CLASS)["spec"]
    assert efa_network_interfaces(1) == interfaces[:2]


def test_reserved_pool_selects_its_reservations():
    spec = gpu_node_class(RESERVED, NODE_CLASS)["spec"]
    assert spec["capacityReservationSelectorTerms"] == [{"id": "cr-0a1b2c3d4e5f60718"}]
    assert spec["amiSelectorTerms"] == [{"alias": "bottlerocket@v1.30.0"}]
    assert spec["blockDeviceMappings"][0]["deviceName"] == "/dev/xvdb"  # Bottlerocket data volume


def test_selectors_use_discovery_tag_and_cluster_security_group():
    spec = gpu_node_class(L4, NODE_CLASS)["spec"]
    assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "mlp-test-eks"}}]
    assert spec["securityGroupSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "mlp-test-eks"}},
                                                  {"id": "sg-0123456789abcdef0"}]


def test_pools_start_with_only_the_storage_taints_they_are_given():
    """aws-readiness-4 R1: without a storage driver no storage taint (nothing would lift it)."""
    for manifest in (gpu_node_pool(L4), cpu_node_pool(CpuPoolSpec())):
        keys = [t["key"] for t in manifest["spec"]["template"]["spec"].get("startupTaints", [])]
        assert not [k for k in keys if k.endswith(".csi.aws.com/agent-not-ready")], keys
    both = (EFS_STARTUP_TAINT, S3_MOUNTPOINT_STARTUP_TAINT)
    assert gpu_node_pool(L4, storage_startup_taints=both)["spec"]["template"]["spec"]["startupTaints"][:2] == list(both)
    assert cpu_node_pool(CpuPoolSpec(), storage_startup_taints=both)["spec"]["template"]["spec"]["startupTaints"] == list(both)


def test_cpu_pool_may_consolidate_and_has_no_gpu_taint():
    spec = cpu_node_pool(CpuPoolSpec())["spec"]
    assert spec["disruption"]["consolidationPolicy"] == ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED.value
    assert "taints" not in spec["template"]["spec"]
    capacity = next(r for r in spec["template"]["spec"]["requirements"] if r["key"] == "karpenter.sh/capacity-type")
    assert capacity["values"] == ["spot", "on-demand"]


def test_kueue_queue_quota_and_flavor_selection():
    cq = kueue.cluster_queue(TEAM_Q, FLAVORS)["spec"]
    assert cq["cohortName"] == kueue.COHORT
    flavors = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in cq["resourceGroups"][0]["flavors"]}
    assert flavors["gpu-h100"]["nvidia.com/gpu"] == "16" and flavors["gpu-l4"]["nvidia.com/gpu"] == "2"
    flavor = kueue.resource_flavor(FLAVORS[0])["spec"]
    # Kueue copies nodeLabels into admitted pods' nodeSelector: never the node-role label the team policy refuses.
    assert flavor["nodeLabels"] == {k: v for k, v in H100.node_labels.items() if k != "node.mlplatform.io/role"}
    assert flavor["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    no_borrow = kueue.cluster_queue(kueue.TeamQueueSpec("x", "team-x", {"h100": 8}, borrowing=False), FLAVORS)
    assert all(r["borrowingLimit"] == "0" for f in no_borrow["spec"]["resourceGroups"][0]["flavors"] for r in f["resources"])


def test_kueue_manager_admits_all_or_nothing():
    config = yaml.safe_load(kueue.manager_config_yaml())
    # v1beta2: present = on (tests/workloads/test_kueue_config_and_drift.py).
    assert config["waitForPodsReady"]["blockAdmission"] is True
    assert config["fairSharing"]["preemptionStrategies"]
    assert "kubeflow.org/pytorchjob" in config["integrations"]["frameworks"]


def test_team_namespace_guardrails():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in scheduling.team_objects(TEAM_NS)}
    labels = objects[("Namespace", "team-research")]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"  # root and added capabilities refused (C1, M1)
    assert objects[("ResourceQuota", "gpu-quota")]["spec"]["hard"]["requests.nvidia.com/gpu"] == "24"
    deny = objects[("NetworkPolicy", "default-deny")]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    same = objects[("NetworkPolicy", "allow-same-namespace")]["spec"]
    assert same["ingress"] == [{"from": [{"podSelector": {}}]}] and same["egress"] == [{"to": [{"podSelector": {}}]}]
    vpc = objects[("NetworkPolicy", "allow-vpc-services")]["spec"]["egress"][0]
    assert vpc["to"] == [{"ipBlock": {"cidr": "10.50.0.0/16"}}]
    assert vpc["ports"] == [{"protocol": "TCP", "port": 443}]  # no Lustre/NFS from pods (security-4 N8)
    priorities = {p["metadata"]["name"]: p for p in scheduling.priority_classes()}
    assert priorities["training-production"]["value"] > priorities["training-research"]["value"] > priorities["training-default"]["value"]
    assert [p["metadata"]["name"] for p in priorities.values() if p["globalDefault"]] == ["training-default"]
