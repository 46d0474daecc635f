"""The GPU node readiness agent's manifests: schemas, RBAC, placement, the NodePool taint it lifts,
and Karpenter's node repair (pinned 1.14.1) acting on the condition it sets."""
from __future__ import annotations

import pytest
import yaml

from tests.workloads.golden_files import assert_golden
from workloads import node_health, node_health_agent
from workloads.gpu_catalog import GPU_TYPES
from workloads.karpenter import READINESS_STARTUP_TAINT, STORAGE_STARTUP_TAINTS, GpuPoolSpec, gpu_node_pool
from tests.support.validation import validate_core, validate_custom_resource

IMAGE = "example.com/node-health@sha256:" + "0" * 64


def objects():
    return node_health.node_health_objects(image=IMAGE)


def test_golden():
    assert_golden("node-health", yaml.safe_dump_all(objects(), sort_keys=True))


def test_every_object_validates_against_kubernetes_1_32():
    for obj in objects():
        assert validate_core(obj) == [], obj["kind"]


def test_rbac_is_least_privilege():
    """The agent reads and patches nodes (taints, cordon, label), patches node status (the
    AcceleratedHardwareReady condition), lists and watches pods (its node's, for a GPU-fault
    exit) and creates Events in ``default``: nothing else (no get, log, exec or write on pods)."""
    rules = {(o["kind"], o["metadata"].get("namespace")): o for o in objects()}
    cluster_rules = rules[("ClusterRole", None)]["rules"]
    assert cluster_rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    assert rules[("Role", "default")]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = next(o for o in objects() if o["kind"] == kind)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": node_health.NAME, "namespace": node_health.NAMESPACE}]
    pod = next(o for o in objects() if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == node_health.NAME
    container = pod["containers"][0]
    # SYS_ADMIN for DCGM diagnostics, SYSLOG for the kernel log (the host's record of GPU faults).
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYSLOG"]}
    assert not container["securityContext"].get("privileged")
    assert all(m["readOnly"] for m in container["volumeMounts"])
    assert "nvidia.com/gpu" not in container["resources"]["requests"]  # it must not take a GPU from jobs


def test_daemonset_runs_on_every_gpu_node_through_the_taints():
    pod = node_health.daemon_set(image=IMAGE)["spec"]["template"]["spec"]
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"]}
    pool = GpuPoolSpec(name="h100", gpu_type="h100", gpus_per_node=8, capacity_types=["on-demand"], max_gpus=16, efa=True)
    template = gpu_node_pool(pool, storage_startup_taints=STORAGE_STARTUP_TAINTS)["spec"]["template"]
    node_taints = {(t["key"], t["effect"]) for t in template["spec"]["taints"] + template["spec"]["startupTaints"]}
    assert node_taints <= tolerated
    assert _schedules(pod, template["metadata"]["labels"])
    assert template["metadata"]["labels"]["node.mlplatform.io/role"] == "gpu"


def test_every_gpu_pool_starts_with_the_readiness_startup_taint_the_agent_lifts(schemas):
    """Karpenter 1.14.1 pkg/apis/v1/nodepool.go: "startupTaints are taints that are applied to nodes
    upon startup which are expected to be removed automatically within a short period of time,
    typically by a DaemonSet that tolerates the taint [...] pods are not required to tolerate a
    StartupTaint in order to have nodes provisioned for them." So it must be a startup taint (a
    plain taint would stop provisioning for pods that do not tolerate it) and jobs must not tolerate it."""
    assert READINESS_STARTUP_TAINT == node_health_agent.READINESS_TAINT
    for gpu in GPU_TYPES:
        pool = GpuPoolSpec(name=gpu, gpu_type=gpu, gpus_per_node=GPU_TYPES[gpu].shapes[0].num_gpus,
                           capacity_types=["on-demand"], max_gpus=64)
        manifest = gpu_node_pool(pool)
        assert validate_custom_resource(manifest, schemas) == []
        spec = manifest["spec"]["template"]["spec"]
        assert READINESS_STARTUP_TAINT in spec["startupTaints"]
        assert READINESS_STARTUP_TAINT not in spec["taints"]


def test_instance_table_matches_the_catalog_and_the_efa_interfaces():
    table = node_health.instance_expectations()
    assert table["p5.48xlarge"] == {"gpus": 8, "efa_devices": 32}
    assert table["p4d.24xlarge"] == {"gpus": 8, "efa_devices": 4}
    assert table["g6.xlarge"]["efa_devices"] == 0
    config = next(o for o in objects() if o["kind"] == "ConfigMap")["data"]
    assert yaml.safe_load(config[node_health.INSTANCES_FILE]) == table
    assert config[node_health.AGENT_FILE] == node_health.agent_source()
    command = node_health.daemon_set(image=IMAGE)["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "nv-hostengine && exec python3 /opt/mlplatform/node_health_agent.py --instances /opt/mlplatform/instances.json" in command


def test_karpenter_node_repair_acts_on_the_condition_the_agent_sets():
    """aws/karpenter-provider-aws v1.14.1 pkg/cloudprovider/cloudprovider.go RepairPolicies():
    {ConditionType: "AcceleratedHardwareReady", ConditionStatus: corev1.ConditionFalse,
    TolerationDuration: 10 * time.Minute}; the policies only run with the NodeRepair feature gate
    (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/controllers.go: ``if
    len(cloudProvider.RepairPolicies()) != 0 && options.FromContext(ctx).FeatureGates.NodeRepair``),
    which the chart sets from settings.featureGates.nodeRepair (default false)."""
    from components.karpenter import helm_values

    values = helm_values(cluster_name="c", queue_name="q", replicas=1, log_level="info")
    assert values["settings"]["featureGates"]["nodeRepair"] is True
    patch = node_health_agent.condition_patch(False, "ecc", node_health_agent.dt.datetime(2026, 1, 1))
    assert patch["status"]["conditions"][0]["type"] == "AcceleratedHardwareReady"
    assert patch["status"]["conditions"][0]["status"] == "False"


def test_the_agents_event_is_a_valid_core_event():
    failures = [node_health_agent.Failure(node_health_agent.EFA_COUNT, "expected 32 EFA devices, /sys/class/infiniband has 31")]
    event = node_health_agent.failure_event("ip-10-0-1-2", "u-1", failures, node_health_agent.dt.datetime(2026, 11, 25, 12, 0))
    event = {**event, "metadata": {**event["metadata"], "name": "ip-10-0-1-2.gpu-health-x"}}  # the server fills generateName
    assert validate_core(event) == []
    assert node_health_agent.failure_label_value(failures) == "efa-count"


def test_checkov_skips_carry_a_reason_checkov_can_read():
    """checkov splits a skip annotation on '=' (its k8s runner: ``check_id, reason = value.split('=')``):
    a reason with '=' or none at all would be read wrong, so building one is refused."""
    import pytest

    from workloads.scan_skips import skip_annotations

    assert skip_annotations([("CKV_K8S_8", "no server")]) == {"checkov.io/skip1": "CKV_K8S_8=no server"}
    for reason in ("a=b", " "):
        with pytest.raises(ValueError, match="CKV_K8S_8"):
            skip_annotations([("CKV_K8S_8", reason)])


def _schedules(pod: dict, node_labels: dict) -> bool:
    """Kubernetes NodeSelector semantics (k8s.io/component-helpers/scheduling/corev1/nodeaffinity):
    terms are ORed, expressions within a term ANDed; NotIn matches a node without the key."""
    def matches(expr):
        value = node_labels.get(expr["key"])
        if expr["operator"] == "In":
            return value in expr["values"]
        if expr["operator"] == "NotIn":
            return value not in expr["values"]
        raise AssertionError(expr["operator"])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(all(matches(e) for e in term["matchExpressions"]) for term in terms)


@pytest.mark.parametrize("labels, lands", [
    ({"node.mlplatform.io/role": "gpu"}, True),
    ({"node.mlplatform.io/role": "gpu", "mlplatform.io/gpu-sharing": "time-slicing"}, True),
    ({"node.mlplatform.io/role": "gpu", "mlplatform.io/gpu-sharing": "mig"}, False),
    ({"node.mlplatform.io/role": "gpu", "mlplatform.io/gpu-sharing": "mig", "nvidia.com/mig.config.state": "pending"}, False),
    ({"node.mlplatform.io/role": "gpu", "mlplatform.io/gpu-sharing": "mig", "nvidia.com/mig.config.state": "failed"}, False),
    ({"node.mlplatform.io/role": "gpu", "mlplatform.io/gpu-sharing": "mig", "nvidia.com/mig.config.state": "success"}, True),
    ({"node.mlplatform.io/role": "system"}, False),
    ({"node.mlplatform.io/role": "general", "nvidia.com/mig.config.state": "success"}, False),
])
def test_the_agent_keeps_its_host_engine_off_a_mig_node_until_the_mig_manager_succeeded(labels, lands):
    """aws-readiness-4 R4: NVML nvmlDeviceSetMigMode returns NVML_ERROR_IN_USE when the GPU is not
    idle, and the agent's nv-hostengine holds every GPU open; mig-parted v0.12.1
    reconfigure-mig.sh pauses only the GPU Operator's own clients. The agent lands on a MIG node
    only once nvidia.com/mig.config.state=success."""
    pod = node_health.daemon_set(image=IMAGE)["spec"]["template"]["spec"]
    assert _schedules(pod, labels) is lands
