"""GPU sharing per pool (issue 25 items 1-4, 7): config rules, MIG layouts, device-plugin and
MIG-manager configs, NodeOverlays, Kueue slice flavors, the MIG gate and $/slice-hour."""
from __future__ import annotations

import os
from fractions import Fraction
import stat
import subprocess
import pytest
import yaml

from catalog.gpu_sharing import MIG_PROFILES, pack
from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config
from workloads import gpu_sharing
from workloads.gpu_sharing import GpuSharing, PoolSharing
from tests.support.validation import validate_core, validate_custom_resource, validate_pod_template


def _inputs(plan, kind):
    return [{k: r.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in r.inputs}
            for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.inputs.get("kind") == kind]


def _release(plan, name):
    return next(r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == name)


# -- MIG profiles, from NVIDIA's MIG user guide -------------------------------------------------------
def test_mig_profiles_are_the_guides():
    """MIG User Guide, Supported MIG Profiles: A100-SXM4-80GB "MIG 1g.10gb ... 7", "MIG 3g.40gb ... 2",
    "MIG 7g.80gb ... 1"; A100-SXM4-40GB "MIG 1g.5gb ... 7", "MIG 1g.10gb ... 4"; H200-SXM5-141GB
    "MIG 1g.18gb ... 7". The GPU Operator's default mig-parted config says the same:
    ``all-1g.10gb: ... # A100-40GB ... "1g.10gb": 4`` and 7 on A100-80GB/H100-80GB."""
    assert MIG_PROFILES["a100-80gb"]["1g.10gb"].max_instances == 7
    assert MIG_PROFILES["h100"]["3g.40gb"].max_instances == 2
    assert MIG_PROFILES["h100"]["7g.80gb"].max_instances == 1
    assert MIG_PROFILES["a100"]["1g.5gb"].max_instances == 7
    assert MIG_PROFILES["a100"]["1g.10gb"].max_instances == 4
    assert MIG_PROFILES["h200"]["1g.18gb"].max_instances == 7
    assert "l4" not in MIG_PROFILES and "l40s" not in MIG_PROFILES and "a10g" not in MIG_PROFILES
    # Every "all-<profile>" layout is the profile's maximum and packs on one GPU.
    for gpu, profiles in MIG_PROFILES.items():
        for name, profile in profiles.items():
            assert pack(gpu, {name: profile.max_instances}) is not None, (gpu, name)
            assert pack(gpu, {name: profile.max_instances + 1}) is None, (gpu, name)


@pytest.mark.parametrize("layout, fits", [
    ({"4g.40gb": 1, "3g.40gb": 1}, True),          # guide: 4g + 3g is a valid combination
    ({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, True),
    ({"2g.20gb": 3, "1g.10gb": 1}, True),           # 7 compute slices, 7 memory slices
    ({"3g.40gb": 2, "1g.10gb": 1}, False),          # 9 memory slices of 8
    ({"4g.40gb": 1, "2g.20gb": 2}, False),          # 8 compute slices of 7
    ({"1g.20gb": 4, "1g.10gb": 1}, False),          # the 1g.20gb placements leave no free slice at 0-6
])
def test_mixed_layouts_pack_like_the_guides_placements(layout, fits):
    assert (pack("h100", layout) is not None) is fits


# -- config rules --------------------------------------------------------------------------------------
def _pool(**overrides):
    pool = {"name": "p", "gpuType": "h100", "gpusPerNode": 1, "capacityTypes": ["on-demand"], "maxGpus": 4,
            "checkpointSeconds": 60, "terminationGracePeriodSeconds": 110}
    pool.update(overrides)
    return pool


def _problems(raw):
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    return {p.path: p for p in info.value.problems}


def test_every_sharing_mistake_is_reported_at_once_with_the_allowed_values():
    raw = stack_config("dev")  # gpuEnablement.mode: device-plugin
    raw["gpuPools"] = [
        _pool(name="a", gpuType="l4", sharing="mig", migLayout="all-1g.10gb"),
        _pool(name="b", gpuType="h100", gpusPerNode=8, maxGpus=16, efa=True, sharing="time-slicing", timeSlicingReplicas=4),
        _pool(name="c", gpuType="l4", sharing="time-slicing"),
        _pool(name="d", gpuType="h100", sharing="mig", migLayout={"3g.40gb": 2, "1g.10gb": 1}),
        _pool(name="e", gpuType="h100", sharing="none", migLayout="all-1g.10gb", timeSlicingReplicas=2),
        _pool(name="f", gpuType="a100-80gb", gpusPerNode=8, maxGpus=8, sharing="mig", migLayout="all-1g.5gb"),
    ]
    raw["scheduling"]["teams"] = []
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    found: dict[str, list] = {}
    for p in info.value.problems:
        found.setdefault(p.path, []).append(p)

    def said(path, text):
        return any(text in p.message or text in p.fix for p in found.get(path, []))

    assert said("gpuPools[0].sharing", "have no MIG") and said("gpuPools[0].sharing", "a100, a100-80gb, h100, h200")
    assert said("gpuPools[1].sharing", "EFA pool")
    assert said("gpuPools[2].timeSlicingReplicas", "2 to 16")
    assert said("gpuPools[3].migLayout", "does not fit one h100 GPU")
    assert said("gpuPools[3].sharing", "gpuEnablement.mode: gpu-operator")
    assert said("gpuPools[4].migLayout", "only applies to sharing: mig")
    assert said("gpuPools[4].timeSlicingReplicas", "only applies to sharing: time-slicing")
    assert said("gpuPools[5].migLayout", "1g.10gb")  # the a100-80gb profiles are listed


def test_an_unknown_sharing_mode_names_the_allowed_ones():
    raw = stack_config("dev")
    raw["gpuPools"][0]["sharing"] = "slicing"
    problem = _problems(raw)["gpuPools[0].sharing"]
    assert problem.value == "slicing"
    assert all(mode in problem.message + problem.fix for mode in ("none", "time-slicing", "mig"))


def test_quota_on_a_shared_pool_counts_slices():
    raw = stack_config("dev")
    raw["scheduling"]["teams"][0]["gpuQuota"]["l4-shared"] = 9  # 2 GPUs x 4 replicas = 8 slices
    problems = _problems(raw)
    assert problems["scheduling.teams[0].gpuQuota.l4-shared"].value == 9
    assert "(8)" in problems["scheduling.teams[0].gpuQuota.l4-shared"].message


def test_the_stacks_share_as_the_issue_asks(dev_plan, prod_plan):
    dev_shared = [p for p in dev_plan.config.gpu_pools if p.sharing is not GpuSharing.NONE]
    assert [(p.sharing, p.gpu_type) for p in dev_shared] == [(GpuSharing.TIME_SLICING, "l4")]
    prod_shared = [p for p in prod_plan.config.gpu_pools if p.sharing is not GpuSharing.NONE]
    assert [(p.sharing, p.efa) for p in prod_shared] == [(GpuSharing.MIG, False)]


# -- NVIDIA device plugin / GPU Operator -----------------------------------------------------------------
# k8s-device-plugin v0.17.1 api/config/v1: Config{version, flags, resources, sharing, imex};
# Flags{migStrategy, failOnInitError, ...}; Sharing{timeSlicing, mps}; ReplicatedResources
# {renameByDefault, failRequestsGreaterThanOne, resources}; ReplicatedResource{name, rename,
# devices, replicas}. The plugin reads the file with yaml.Unmarshal into these types: a key it
# does not know is silently dropped, so an unknown key here is a setting that never applies.
_CONFIG_KEYS = {"version", "flags", "resources", "sharing", "imex"}
_FLAGS_KEYS = {"migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot", "gdsEnabled",
               "mofedEnabled", "useNodeFeatureAPI", "deviceDiscoveryStrategy", "plugin", "gfd"}
_REPLICATED_KEYS = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
_RESOURCE_KEYS = {"name", "rename", "devices", "replicas"}


def _check_plugin_config(text):
    config = yaml.safe_load(text)
    assert set(config) <= _CONFIG_KEYS and config["version"] == "v1"
    assert set(config["flags"]) <= _FLAGS_KEYS and config["flags"]["migStrategy"] in ("none", "single", "mixed")
    for mode, replicated in config.get("sharing", {}).items():
        assert mode in ("timeSlicing", "mps") and set(replicated) <= _REPLICATED_KEYS
        assert all(set(r) <= _RESOURCE_KEYS for r in replicated["resources"])
    return config


def test_dev_device_plugin_time_slices_the_shared_pool_by_node_label(dev_plan):
    """Chart 0.17.1 values.yaml: "Use "map" to build an integrated ConfigMap from a set of
    configurations"; validation.yml fails the install when "more than one configuration is set in
    'config.map'" without 'config.default'. The config-manager picks the config named by the node
    label (daemonset-device-plugin.yml: NODE_LABEL "nvidia.com/device-plugin.config")."""
    values = _release(dev_plan, "nvidia-device-plugin").inputs["values"]
    configs = values["config"]["map"]
    assert values["config"]["default"] in configs and "name" not in values["config"]
    pools = {p["metadata"]["name"]: p for p in _inputs(dev_plan, "NodePool")}
    shared = pools["gpu-l4-shared"]["spec"]["template"]
    label = shared["metadata"]["labels"]["nvidia.com/device-plugin.config"]
    config = _check_plugin_config(configs[label])
    slicing = config["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] is True and slicing["failRequestsGreaterThanOne"] is True
    assert slicing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    # A whole-GPU pool's nodes carry no config label: they get the default (no sharing).
    assert "nvidia.com/device-plugin.config" not in pools["gpu-l4"]["spec"]["template"]["metadata"]["labels"]
    assert "sharing" not in _check_plugin_config(configs[values["config"]["default"]])
    # Only slice pods (Kueue's shared flavor tolerates it) land on shared nodes; the plugin tolerates it.
    assert {"key": "mlplatform.io/gpu-sharing", "effect": "NoSchedule"} in shared["spec"]["taints"]
    assert {"key": "mlplatform.io/gpu-sharing", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]


def test_prod_gpu_operator_runs_the_mig_manager_with_the_pools_layout(prod_plan):
    """gpu-operator v25.3.0 values.yaml: ``mig.strategy``, ``migManager.config`` {default, create,
    name, data} and ``devicePlugin.config`` {create, name, default, data}; the MIG manager applies
    the config named by the node label nvidia.com/mig.config (mig-parted cmd/nvidia-mig-manager
    MigConfigLabel)."""
    values = _release(prod_plan, "gpu-operator").inputs["values"]
    assert values["mig"] == {"strategy": "mixed"}
    assert values["driver"] == {"enabled": False} and values["toolkit"] == {"enabled": False}
    mig_config = values["migManager"]["config"]
    assert mig_config["create"] is True and mig_config["default"] == "all-disabled"
    parted = yaml.safe_load(mig_config["data"]["config.yaml"])
    pool = next(p for p in _inputs(prod_plan, "NodePool") if p["metadata"]["name"] == "gpu-h100-mig")
    labels = pool["spec"]["template"]["metadata"]["labels"]
    layout = parted["mig-configs"][labels["nvidia.com/mig.config"]]
    assert layout == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    plugin = values["devicePlugin"]["config"]
    assert plugin["create"] is True and plugin["default"] in plugin["data"]
    assert _check_plugin_config(plugin["data"][labels["nvidia.com/device-plugin.config"]])["flags"]["migStrategy"] == "mixed"
    # The node starts tainted until the MIG gate sees success; operands tolerate that taint.
    assert {"key": "mlplatform.io/mig-pending", "effect": "NoSchedule"} in pool["spec"]["template"]["spec"]["startupTaints"]
    assert {"key": "mlplatform.io/mig-pending", "operator": "Exists", "effect": "NoSchedule"} in values["daemonsets"]["tolerations"]


def test_mig_needs_the_gpu_operator_in_the_component_too():
    from components.gpu_enablement import GpuEnablementArgs
    mig = PoolSharing(GpuSharing.MIG, mig_layout=(("1g.10gb", 7),))
    with pytest.raises(ValueError, match="gpu-operator"):
        GpuEnablementArgs(cluster=None, mode="device-plugin", pool_sharing={"m": mig})


# -- the MIG gate, run as the kubelet would run it, against a fake kubectl -------------------------------
FAKE_KUBECTL = """#!/bin/bash
# A node with a state label file and a taints file; records every call.
echo "$*" >> "$STATE_DIR/calls"
case "$1 $4 $5" in
  "get -o jsonpath={.metadata.labels.nvidia\\.com/mig\\.config\\.state}") cat "$STATE_DIR/state" ;;
esac
if [ "$1" = get ] && [[ "$5" == *spec.taints* ]]; then cat "$STATE_DIR/taints"; fi
if [ "$1" = taint ]; then
  case "$4" in
    *-) : > "$STATE_DIR/taints" ;;
    *) echo -n "mlplatform.io/mig-pending" > "$STATE_DIR/taints" ;;
  esac
fi
"""


@pytest.fixture
def node(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "taints").write_text("mlplatform.io/mig-pending")  # Karpenter's startup taint
    (tmp_path / "state").write_text("")

    def poll(state):
        (tmp_path / "state").write_text(state)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE_DIR": str(tmp_path),
               "NODE_NAME": "ip-10-0-0-1", "GATE_ONCE": "1"}
        result = subprocess.run(["bash", "-c", gpu_sharing.mig_gate_script()], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return (tmp_path / "taints").read_text(), result
    return poll


def test_the_gate_lifts_the_taint_only_on_success_and_puts_it_back(node):
    """reconfigure-mig.sh sets nvidia.com/mig.config.state to pending, rebooting, success or failed."""
    for state in ("", "pending", "rebooting"):
        taints, _ = node(state)
        assert taints == "mlplatform.io/mig-pending", state
    taints, result = node("failed")
    assert taints == "mlplatform.io/mig-pending" and "stays tainted" in result.stderr
    taints, result = node("success")
    assert taints == "" and "lifted" in result.stdout
    taints, _ = node("success")
    assert taints == ""
    taints, result = node("pending")  # a new layout is being applied: no new pods meanwhile
    assert taints == "mlplatform.io/mig-pending" and "put back" in result.stdout


def test_the_gate_objects_are_valid_and_least_privilege(prod_plan):
    recorded = [r for r in prod_plan.recording.resources if "mig-gate" in r.name]
    kinds = {r.inputs.get("kind") or r.type.split(":")[-1] for r in recorded}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                     # narrows the ClusterRole's patch to the gate's own node (test_node_agent_attacks)
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    objects = gpu_sharing.mig_gate_objects("gpu-system", "example:1", [])
    for obj in objects:
        assert validate_core(obj) == [], obj["kind"]
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    assert validate_pod_template(daemonset["spec"]["template"]) == []


# -- Karpenter NodeOverlay ---------------------------------------------------------------------------------
def test_node_overlays_declare_slices_and_validate_against_the_pinned_crd(plan, schemas):
    """karpenter.sh_nodeoverlays.yaml (v1.14.1): "Capacity adds extended resources only"; requirements
    "can match ... karpenter.sh/nodepool"; the chart's settings.featureGates.nodeOverlay is "ALPHA and
    is disabled by default"."""
    overlays = _inputs(plan, "NodeOverlay")
    shared = {p.name: p for p in plan.config.gpu_pools if p.sharing is not GpuSharing.NONE}
    assert sorted(o["metadata"]["name"] for o in overlays) == sorted(f"gpu-{n}-slices" for n in shared)
    pools = {p["metadata"]["name"]: p for p in _inputs(plan, "NodePool")}
    for overlay in overlays:
        assert validate_custom_resource(overlay, schemas) == [], overlay["metadata"]["name"]
        requirements = {r["key"]: r["values"] for r in overlay["spec"]["requirements"]}
        pool_name = requirements["karpenter.sh/nodepool"][0]
        pool = pools[pool_name]
        instance_types = next(r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]
                              if r["key"] == "karpenter.k8s.aws/instance-family")
        assert all(t.split(".")[0] in instance_types for t in requirements["node.kubernetes.io/instance-type"])
        config = shared[pool["metadata"]["labels"]["mlplatform.io/pool"]]
        expected = config.sharing_spec().slices_per_node(config.gpus_per_node)
        assert overlay["spec"]["capacity"] == {k: str(v) for k, v in expected.items()}
        # Scale to zero still holds: capacity only, no price change, and the pool has no floor.
        assert set(overlay["spec"]) == {"requirements", "capacity"}
        assert "replicas" not in pool["spec"] and pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    values = _release(plan, "karpenter").inputs["values"]
    assert values["settings"].get("featureGates", {}).get("nodeOverlay", False) is bool(overlays)


def test_a_pending_slice_request_matches_exactly_one_pool(dev_plan):
    """What Karpenter's simulation sees: a pod asking for nvidia.com/gpu.shared fits only instance types
    with that capacity (the overlay's), and tolerates the sharing taint only through its flavor."""
    overlays = _inputs(dev_plan, "NodeOverlay")
    offering = [o for o in overlays if "nvidia.com/gpu.shared" in o["spec"]["capacity"]]
    assert [o["spec"]["requirements"][0]["values"] for o in offering] == [["gpu-l4-shared"]]


# -- Kueue -----------------------------------------------------------------------------------------------------
def test_kueue_shared_flavors_take_slices_never_whole_gpus_or_efa(plan, schemas):
    flavors = {f["metadata"]["name"]: f for f in _inputs(plan, "ResourceFlavor")}
    queues = _inputs(plan, "ClusterQueue")
    shared = {f"gpu-{p.name}": p for p in plan.config.gpu_pools if p.sharing is not GpuSharing.NONE}
    assert shared
    for name in shared:
        tolerations = flavors[name]["spec"]["tolerations"]
        assert {"key": "mlplatform.io/gpu-sharing", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    for name, flavor in flavors.items():
        if name not in shared:
            assert all(t["key"] != "mlplatform.io/gpu-sharing" for t in flavor["spec"].get("tolerations", []))
    for queue in queues:
        assert validate_custom_resource(queue, schemas) == []
        group = queue["spec"]["resourceGroups"][0]
        covered = group["coveredResources"]
        for entry in group["flavors"]:
            # Kueue: each flavor lists the group's coveredResources, in order.
            assert [r["name"] for r in entry["resources"]] == covered
            quota = {r["name"]: r["nominalQuota"] for r in entry["resources"]}
            slices = [r for r in covered if r.startswith("nvidia.com/mig-") or r == "nvidia.com/gpu.shared"]
            if entry["name"] in shared:
                assert quota["nvidia.com/gpu"] == "0" and quota["vpc.amazonaws.com/efa"] == "0"
                team = next(t for t in plan.config.scheduling.teams if t.name == queue["metadata"]["name"])
                pool = shared[entry["name"]]
                own = pool.sharing_spec().slices_per_gpu()
                assert {r: quota[r] for r in own} == {r: str(team.gpu_quota.get(pool.name, 0)) for r in own}
            else:
                assert all(quota[r] == "0" for r in slices)


def test_team_namespaces_quota_slices_separately(dev_plan):
    quotas = [r.inputs for r in dev_plan.recording.resources if r.inputs.get("kind") == "ResourceQuota"
              and r.inputs["metadata"]["name"] == "gpu-quota"]
    for quota in quotas:
        assert validate_core({"apiVersion": "v1", **quota}) == []
        hard = quota["spec"]["hard"]
        # research (borrowing) sees the cohort's: 2+8+2 whole GPUs and 4+4 slices.
        assert hard["requests.nvidia.com/gpu"] == "12" and hard["requests.nvidia.com/gpu.shared"] == "8"


# -- cost ---------------------------------------------------------------------------------------------------------
def test_plan_prices_a_slice_as_its_share_of_the_instance(dev_plan, prod_plan):
    from catalog.prices import PRICES
    sharing = PoolSharing(GpuSharing.TIME_SLICING, time_slicing_replicas=4)
    assert gpu_sharing.usd_per_slice_hour(PRICES["g6.xlarge"].on_demand_usd_per_hour, 1, sharing, "nvidia.com/gpu.shared") == \
        pytest.approx(0.8048 / 4)
    mig = PoolSharing(GpuSharing.MIG, mig_layout=(("3g.40gb", 1), ("1g.10gb", 4)))
    # A 3g slice is 3 of the 7 compute slices of one of the node's 8 GPUs.
    assert gpu_sharing.usd_per_slice_hour(55.04, 8, mig, "nvidia.com/mig-3g.40gb") == pytest.approx(55.04 / 8 * 3 / 7)
    from infra.gpu_capacity import pool_lines
    pool = next(p for p in prod_plan.config.gpu_pools if p.name == "h100-mig")
    lines = pool_lines(prod_plan.config, pool)
    assert any(f"nvidia.com/mig-1g.10gb: ${6.88 / 7:.4f}/slice-hour" in line for line in lines), lines
    dev_pool = next(p for p in dev_plan.config.gpu_pools if p.name == "l4-shared")
    assert any(f"nvidia.com/gpu.shared: ${0.8048 / 4:.4f}/slice-hour" in line for line in pool_lines(dev_plan.config, dev_pool))


# -- a job asking for a slice -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def facts(dev_plan, prod_plan):
    from jobs.facts import facts_from_plan
    return {"dev": facts_from_plan(dev_plan), "prod": facts_from_plan(prod_plan)}


def _model_name(team: str = "applied") -> str:
    """The model the job registers, under its team's prefix (preflight refuses the config's own name)."""
    return f"export.registered_model_name=team-{team}.gpt2-124m"


def _spec(**overrides):
    from workloads.jobspec import parse_job_spec
    team = overrides.get("team") or "applied"
    raw = {"name": "small", "team": team, "image": "example.com/trainer:1.0.0",
           "trainer": {"config": "trainer/configs/gpt2-124m.yaml",
                       "overrides": ["data.micro_batch_size=4", _model_name(team)]},
           "gpu": {"type": "h100", "slice": "1g.10gb"}, "nodes": 1, "gpusPerNode": 1, "spot": False,
           "dataset": "/fsx/datasets/tinystories/gpt2-v1"}
    raw.update(overrides)
    return parse_job_spec({k: v for k, v in raw.items() if v is not None})


def test_a_mig_slice_job_renders_one_slice_on_the_mig_pool(facts, schemas):
    from workloads.trainingjob import render, resolve
    spec = _spec()
    job = resolve(spec, facts["prod"])
    assert job.pool.name == "h100-mig"
    manifest = render(spec, facts["prod"])
    assert validate_custom_resource(manifest, schemas) == []
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert validate_pod_template(pod) == []
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1" and "nvidia.com/gpu" not in limits
    assert {"key": "mlplatform.io/gpu-sharing", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_slice_pods_are_sized_by_the_same_node_model_as_whole_gpu_pods(facts):
    """design-4 §1.3: slice pods took `vcpus - max(2, vcpus // 24)` and `memory * 0.9 - 4` while
    whole-GPU pods took Karpenter's model. Both now read catalog/node_model.py: a slice pod is the
    GPU node's pod allocatable (kube-reserved, eviction, VM overhead, DaemonSets) / every slice."""
    from catalog.node_model import gpu_pod_allocatable
    from workloads.nodefit import node_allocatable
    from workloads.trainingjob import resolve
    job = resolve(_spec(), facts["prod"])
    slices = sum(job.pool.slices_per_node.values())
    cpu_m, memory_mib = (min(v) for v in zip(*(gpu_pod_allocatable(t) for t in job.pool.instance_types)))
    want_cpu_m = cpu_m // slices // 100 * 100
    assert job.cpu == (str(want_cpu_m // 1000) if want_cpu_m % 1000 == 0 else f"{want_cpu_m}m")
    assert job.memory_gib == memory_mib // slices // 1024
    whole = node_allocatable(job.pool.instance_types[0], job.pool.gpus_per_node)
    assert job.memory_gib * 1024 * slices <= whole.memory_mib


def test_slices_are_one_pod_and_go_only_where_offered(facts):
    from workloads.jobspec import JobSpecError
    from workloads.trainingjob import resolve
    with pytest.raises(JobSpecError) as info:
        _spec(nodes=2)
    assert "multi-node and multi-GPU jobs take whole GPUs" in str(info.value)
    with pytest.raises(JobSpecError) as info:
        _spec(gpu={"type": "h100", "slice": "1g.10gb"}, shared=True)
    assert "not both" in str(info.value)
    with pytest.raises(JobSpecError) as info:  # prod has no 3g.40gb slices
        resolve(_spec(gpu={"type": "h100", "slice": "3g.40gb"}), facts["prod"])
    assert "offers nvidia.com/mig-3g.40gb" in str(info.value) and "nvidia.com/mig-1g.10gb" in str(info.value)
    with pytest.raises(JobSpecError) as info:  # a whole-GPU job never lands on a shared pool
        resolve(_spec(gpu=None, pool="h100-mig"), facts["prod"])
    assert "runs slice requests only" in str(info.value)
    # and a whole-H100 job by type goes to the whole-GPU pool, not the MIG one
    assert resolve(_spec(gpu=None, gpuType="h100", gpusPerNode=8, team="research"), facts["prod"]).pool.name == "h100"


def test_preflight_checks_memory_against_the_slice_not_the_gpu(facts):
    """A 1g.10gb slice has 9.75 GB (MIG guide, H100-SXM5-80GB); the same model that fits the
    slice at micro-batch 4 does not at micro-batch 16, though it would fit the whole 80 GB GPU."""
    from pathlib import Path
    from jobs.preflight import preflight
    root = str(Path(__file__).resolve().parents[2])
    fits = preflight(_spec(), facts["prod"], repo_root=root)
    assert fits.ok, fits.render()
    assert fits.figures["gpu_memory_gib"] == pytest.approx(9.75)
    assert fits.figures["usd_per_slice_hour"] == pytest.approx(6.88 / 7, abs=1e-4)
    big = _spec(trainer={"config": "trainer/configs/gpt2-124m.yaml", "overrides": ["data.micro_batch_size=16", _model_name()]})
    refused = preflight(big, facts["prod"], repo_root=root)
    assert not refused.ok and refused.figures["memory_per_gpu_gib"] < 80 * 0.95
    assert any("usable on one nvidia.com/mig-1g.10gb" in p.message for p in refused.problems)


def test_pods_without_a_gpu_request_have_a_cpu_flavor_first_in_every_team_queue(plan, schemas):
    """Kueue assigns the first flavor, in the ClusterQueue's order, where every resource the pod
    requests fits (kueue v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go,
    ``findFlavorForPodSets``: ``for ; idx < len(resourceGroup.Flavors); idx++`` over the requests
    filtered to the group's resources). A pod that requests only cpu and memory (the restore
    drill, data preparation) therefore took the first GPU flavor, with its GPU pool selector and
    GPU toleration, which the gpu-less-pods policy refuses: the pod was never created. The general
    CPU pool's flavor comes first, with no GPU, EFA or slice quota, so GPU requests never fit it."""
    flavors = {f["metadata"]["name"]: f for f in _inputs(plan, "ResourceFlavor")}
    pool = plan.config.karpenter.cpu_pool
    assert pool.enabled
    cpu_flavor = flavors["cpu-general"]
    assert validate_custom_resource(cpu_flavor, schemas) == []
    assert cpu_flavor["spec"] == {"nodeLabels": {"mlplatform.io/pool": "general"}}
    node_pools = {r.inputs["metadata"]["name"]: r.inputs for r in plan.recording.resources
                  if r.inputs.get("kind") == "NodePool"}
    general = [p for p in node_pools.values()
               if p["spec"]["template"]["metadata"]["labels"].get("mlplatform.io/pool") == "general"]
    assert len(general) == 1 and not general[0]["spec"]["template"]["spec"].get("taints")
    teams = plan.config.scheduling.teams
    for queue in _inputs(plan, "ClusterQueue"):
        first = queue["spec"]["resourceGroups"][0]["flavors"][0]
        assert first["name"] == "cpu-general", queue["metadata"]["name"]
        quota = {r["name"]: r["nominalQuota"] for r in first["resources"]}
        assert quota.pop("cpu") == str(pool.max_cpu // len(teams))
        assert quota.pop("memory") == f"{pool.max_memory_gib // len(teams)}Gi"
        assert set(quota.values()) == {"0"}, quota


# -- a team's slice quota covers the slice pods it admits ----------------------------------------------------------
_DECIMAL = {"m": Fraction(1, 1000), "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
            "T": Fraction(10**12)}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def _quantity(text) -> Fraction:
    """A Kubernetes quantity (k8s.io/apimachinery resource.Quantity: decimal or binary SI suffix) as a number."""
    text = str(text)
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return Fraction(text[: -len(suffix)]) * factor
    suffix = text[-1] if text[-1] in "mkMGT" else ""
    return Fraction(text[: len(text) - len(suffix)]) * _DECIMAL[suffix]


def _pod_requests(pod_spec) -> dict[str, Fraction]:
    """What Kueue charges a pod (k8s.io/component-helpers resource.PodRequests, which Kueue's
    workload accounting uses): the containers' requests summed, each init container's as a floor."""
    total: dict[str, Fraction] = {}
    for container in pod_spec["containers"]:
        for name, value in (container.get("resources", {}).get("requests") or {}).items():
            total[name] = total.get(name, Fraction(0)) + _quantity(value)
    for container in pod_spec.get("initContainers") or []:
        for name, value in (container.get("resources", {}).get("requests") or {}).items():
            total[name] = max(total.get(name, Fraction(0)), _quantity(value))
    return total


def _slice_pod_specs(facts, pool, team):
    """Every slice pod the renderers give a team on a shared pool: a training job per slice resource
    the pool offers, and a dev pod."""
    from workloads import devpod
    from workloads.jobspec import parse_job_spec
    from workloads.trainingjob import render
    specs = {}
    for resource in sorted(pool.slices_per_node):
        raw = {"name": "slice", "team": team, "image": "example.com/trainer:1.0.0", "pool": pool.name, "nodes": 1,
               "gpusPerNode": 1, "spot": not set(pool.capacity_types) - {"spot"}, "dataset": "/fsx/datasets/tinystories/gpt2-v1",
               "command": ["python", "-m", "trainer", "train"]}
        if resource.startswith("nvidia.com/mig-"):
            raw["slice"] = resource.removeprefix("nvidia.com/mig-")
        else:
            raw["shared"] = True
        manifest = render(parse_job_spec(raw), facts)
        specs[f"training job on {resource}"] = (resource, manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])
    dev = devpod.render(devpod.DevPodSpec(name="devpod-x", team=team, image="example.com/trainer:1.0.0", owner="someone",
                                          pool=pool.name), facts)
    pod = dev["spec"]["template"]["spec"]
    specs["dev pod"] = (next(r for r in pool.slices_per_node if r in pod["containers"][0]["resources"]["limits"]), pod)
    return specs


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_slice_a_team_is_granted_fits_its_cpu_and_memory_quota(stack, facts, dev_plan, prod_plan):
    """Kueue admits a workload on a flavor only while every resource it requests fits the
    ClusterQueue's quota there (kueue pkg/scheduler/flavorassigner: "insufficient unused quota for
    memory in flavor ..."). A shared flavor's quota is N slices, so it must hold the CPU and memory
    of N slice pods as the renderers size them; else a team runs only part of its slices and the
    rest wait forever for quota that exists."""
    plan = {"dev": dev_plan, "prod": prod_plan}[stack]
    stack_facts = facts[stack]
    shared = [p for p in stack_facts.pools if p.shared]
    assert shared, f"stack {stack} has no shared pool"
    checked = 0
    for queue in _inputs(plan, "ClusterQueue"):
        team = queue["metadata"]["name"]
        for entry in queue["spec"]["resourceGroups"][0]["flavors"]:
            pool = next((p for p in shared if p.kueue_flavor == entry["name"]), None)
            if pool is None:
                continue
            quota = {r["name"]: _quantity(r["nominalQuota"]) for r in entry["resources"]}
            slices = max(quota[r] for r in pool.slices_per_node)
            if slices == 0:
                continue
            for what, (resource, pod) in _slice_pod_specs(stack_facts, pool, team).items():
                requests = _pod_requests(pod)
                assert requests[resource] == 1, (what, requests)
                for name in ("cpu", "memory"):
                    assert slices * requests[name] <= quota[name], (
                        f"{stack}: team {team} has {slices} slices on {entry['name']}, but {slices} slice pods ({what}) "
                        f"request {float(slices * requests[name]):g} {name} and the quota grants {float(quota[name]):g}")
                checked += 1
    assert checked
