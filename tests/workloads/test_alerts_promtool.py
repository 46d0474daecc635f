"""Every platform alert, proven with `promtool test rules`: a synthetic series that fires it and
one that must not.

promtool comes from Debian's `prometheus` package (`apt-get install prometheus`; .ci/run installs
it). The rule file under test is the one the platform renders (workloads/monitoring/alerts.py);
`promtool check rules` runs on it as shipped. The unit-test copy drops only the annotations:
promtool compares expected annotations exactly, and the summaries are templates of $value.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from workloads.monitoring.alerts import FATAL_XIDS, AlertThresholds, all_alerts, rule_groups

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: `apt-get install prometheus` (Debian) provides it; CI installs it")

T = AlertThresholds()
GPU = 'gpu="0",UUID="GPU-1",node="ip-10-0-0-1"'
GPU_LABELS = {"gpu": "0", "UUID": "GPU-1", "node": "ip-10-0-0-1"}
JOB = 'namespace="team-research",job_name="gpt2",pod="gpt2-master-0"'
JOB_LABELS = {"namespace": "team-research", "job_name": "gpt2", "pod": "gpt2-master-0"}


def s(series: str, values: str) -> dict[str, str]:
    return {"series": series, "values": values}


def case(alert: str, series: list[dict[str, str]], eval_time: str, expected: list[dict[str, str]]) -> dict[str, Any]:
    severity = {a.name: a.severity for a in all_alerts(T)}[alert]
    return {"interval": "1m", "input_series": series, "alert_rule_test": [{
        "eval_time": eval_time, "alertname": alert,
        "exp_alerts": [{"exp_labels": {**labels, "severity": severity}} for labels in expected]}]}


# (alert, fires: (series, eval_time, expected label sets), must not fire: (series, eval_time))
CASES: list[tuple[str, tuple, tuple]] = [
    ("GpuFatalXid",
     ([s(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", "0 0 79x10")], "5m", [GPU_LABELS]),
     # XID 13 (graphics engine exception) and 31 (MMU fault) are application errors: no reset.
     ([s(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", "0 31 31 13x10")], "5m")),
    ("GpuUncorrectableEcc",
     ([s(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}", "0 0 1x10")], "5m", [GPU_LABELS]),
     ([s(f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU}}}", "0+5x10"),
       s(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}", "0x10"),
       s(f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{GPU}}}", "2x10")], "5m")),
    ("GpuRowRemapFailure",
     ([s(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}", "0 1x5")], "3m", [GPU_LABELS]),
     ([s(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}", "0x5")], "3m")),
    # 18e6 us of throttling per minute = 30% of the time; 1e6 per minute = 1.7%.
    ("GpuThermalThrottling",
     ([s(f"DCGM_FI_DEV_THERMAL_VIOLATION{{{GPU}}}", "0+18000000x40")], "30m", [GPU_LABELS]),
     ([s(f"DCGM_FI_DEV_THERMAL_VIOLATION{{{GPU}}}", "0+1000000x40")], "30m")),
    ("GpuPowerThrottling",
     ([s(f"DCGM_FI_DEV_POWER_VIOLATION{{{GPU}}}", "0+18000000x40")], "30m", [GPU_LABELS]),
     # Throttled, but only for 5 minutes: shorter than the `for`.
     ([s(f"DCGM_FI_DEV_POWER_VIOLATION{{{GPU}}}", "0x20 0+18000000x5 90000000x15")], "30m")),
    ("GpuNvlinkErrors",
     ([s(f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{GPU}}}", "0 0 4x10")], "5m", [GPU_LABELS]),
     ([s(f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{GPU}}}", "0x10"),
       s(f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{GPU}}}", "0x10")], "5m")),
    ("GpuNodeNotReadyWithPods",
     ([s('kube_node_status_condition{condition="Ready",status="true",node="gpu-1"}', "1 0x20"),
       s('kube_pod_container_resource_requests{resource="nvidia_com_gpu",namespace="team-research",pod="p",node="gpu-1"}', "1x20"),
       s('kube_pod_status_phase{phase="Running",namespace="team-research",pod="p"}', "1x20")],
      "10m", [{"condition": "Ready", "status": "true", "node": "gpu-1"}]),
     # The not-ready node holds no GPU pod (it runs on another node).
     ([s('kube_node_status_condition{condition="Ready",status="true",node="gpu-1"}', "1 0x20"),
       s('kube_node_status_condition{condition="Ready",status="true",node="gpu-2"}', "1x20"),
       s('kube_pod_container_resource_requests{resource="nvidia_com_gpu",namespace="team-research",pod="p",node="gpu-2"}', "1x20"),
       s('kube_pod_status_phase{phase="Running",namespace="team-research",pod="p"}', "1x20")], "10m")),
    ("GpuNodeNeverReady",
     ([s('kube_node_spec_taint{key="node.mlplatform.io/gpu-not-ready",effect="NoSchedule",node="gpu-1"}', "1x50")],
      "40m", [{"node": "gpu-1"}]),
     # The deep check's re-taint (a few minutes), then lifted again; another node untainted.
     ([s('kube_node_spec_taint{key="node.mlplatform.io/gpu-not-ready",effect="NoSchedule",node="gpu-1"}', "1x10 0x40"),
       s('kube_node_spec_taint{key="nvidia.com/gpu",effect="NoSchedule",node="gpu-2"}', "1x50")], "40m")),
    ("GpuAllocatedIdle",
     ([s(f'DCGM_FI_DEV_GPU_UTIL{{{GPU},pod="p",namespace="team-research"}}', "0x40")], "35m",
      [{**GPU_LABELS, "pod": "p", "namespace": "team-research"}]),
     # Idle but held by no pod (the node-level CloudWatch alarm covers that), and a busy GPU.
     ([s(f'DCGM_FI_DEV_GPU_UTIL{{{GPU},pod=""}}', "0x40"),
       s('DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",node="ip-10-0-0-1",pod="p",namespace="team-research"}', "0x20 50 0x19")],
      "35m")),
    # time() at eval_time 30m is 1800 s; the last step at t=60 s with 2 s steps is 29 minutes old.
    ("TrainingJobStalled",
     ([s(f"mlp_trainer_last_step_timestamp_seconds{{{JOB}}}", "60x40"), s(f"mlp_trainer_step_seconds{{{JOB}}}", "2x40")],
      "30m", [JOB_LABELS]),
     ([s(f"mlp_trainer_last_step_timestamp_seconds{{{JOB}}}", "0+60x40"), s(f"mlp_trainer_step_seconds{{{JOB}}}", "2x40")],
      "30m")),
    ("TrainingCheckpointTooOld",
     ([s(f"mlp_trainer_last_checkpoint_timestamp_seconds{{{JOB}}}", "0x40"),
       s(f"mlp_trainer_checkpoint_interval_steps{{{JOB}}}", "100x40"), s(f"mlp_trainer_step_seconds{{{JOB}}}", "2x40")],
      "30m", [JOB_LABELS]),
     # Checkpoints every 5 minutes with a 200 s interval (x3 = 600 s): never too old.
     ([s(f"mlp_trainer_last_checkpoint_timestamp_seconds{{{JOB}}}", "0x4 300x5 600x5 900x5 1200x5 1500x5 1800x5"),
       s(f"mlp_trainer_checkpoint_interval_steps{{{JOB}}}", "100x40"), s(f"mlp_trainer_step_seconds{{{JOB}}}", "2x40")],
      "30m")),
    ("TrainingLossNotFinite",
     ([s(f"mlp_trainer_loss{{{JOB}}}", "3.1 2.9 NaN NaN")], "3m", [JOB_LABELS]),
     ([s(f"mlp_trainer_loss{{{JOB}}}", "3.1 2.9 2.8 2.7")], "3m")),
    ("TrainingLossDiverging",
     ([s(f"mlp_trainer_loss{{{JOB}}}", "2x60 5x30")], "80m", [JOB_LABELS]),
     ([s(f"mlp_trainer_loss{{{JOB}}}", "5-0.02x90")], "80m")),
    ("TrainingPodRestartLoop",
     ([s('kube_pod_container_status_restarts_total{namespace="team-research",pod="p",container="trainer"}', "0+1x60")],
      "30m", [{"namespace": "team-research", "pod": "p", "container": "trainer"}]),
     # A restarting system pod is not a training job; one team restart is a spot recovery.
     ([s('kube_pod_container_status_restarts_total{namespace="kube-system",pod="q",container="x"}', "0+1x60"),
       s('kube_pod_container_status_restarts_total{namespace="team-research",pod="p",container="trainer"}', "0x20 1x40")],
      "30m")),
    ("PyTorchJobFailed",
     ([s('kube_pytorchjob_status_condition{type="Failed",name="gpt2",namespace="team-research"}', "0 1x5")], "3m",
      [{"type": "Failed", "name": "gpt2", "namespace": "team-research"}]),
     ([s('kube_pytorchjob_status_condition{type="Failed",name="gpt2",namespace="team-research"}', "0x5"),
       s('kube_pytorchjob_status_condition{type="Succeeded",name="gpt2",namespace="team-research"}', "0 1x5")], "3m")),
    ("GpuPodsUnschedulable",
     ([s('kube_pod_status_unschedulable{namespace="team-research",pod="p"}', "1x30"),
       s('kube_pod_container_resource_requests{resource="nvidia_com_gpu",namespace="team-research",pod="p",container="t"}', "8x30")],
      "20m", [{"namespace": "team-research", "pod": "p"}]),
     ([s('kube_pod_status_unschedulable{namespace="team-research",pod="q"}', "1x30"),
       s('kube_pod_container_resource_requests{resource="cpu",namespace="team-research",pod="q",container="t"}', "2x30")],
      "20m")),
    ("KueueWorkloadsWaiting",
     ([s('kueue_pending_workloads{cluster_queue="research",status="active"}', "2x300"),
       s('kueue_admitted_workloads_total{cluster_queue="research",priority_class="default"}', "5x300")],
      "250m", [{"cluster_queue": "research"}]),
     # Pending workloads, but the queue admits one every 30 minutes.
     ([s('kueue_pending_workloads{cluster_queue="research",status="active"}', "2x300"),
       s('kueue_admitted_workloads_total{cluster_queue="research",priority_class="default"}',
         " ".join(f"{i // 30}" for i in range(301)))], "250m")),
    ("KueueWorkloadsEvicted",
     ([s('kueue_evicted_workloads_total{cluster_queue="research",reason="PodsReadyTimeout"}', "0 0 1x10")], "5m",
      [{"cluster_queue": "research", "reason": "PodsReadyTimeout"}]),
     ([s('kueue_evicted_workloads_total{cluster_queue="research",reason="Preempted"}', "0 0 1 2 3x10")], "5m")),
    ("KarpenterLaunchFailures",
     ([s('karpenter_nodeclaims_disrupted_total{reason="insufficient_capacity",nodepool="gpu-h100",capacity_type="spot"}',
         "0 0 1x10")], "5m", [{"nodepool": "gpu-h100"}]),
     ([s('karpenter_nodeclaims_disrupted_total{reason="empty",nodepool="gpu-h100",capacity_type="spot"}', "0 0 1 2x10"),
       s('karpenter_cloudprovider_errors_total{method="Delete",error="NotFound",controller="c",provider="aws"}', "0 1 2x10")],
      "5m")),
    ("SpotInterruptionRateHigh",
     ([s('karpenter_nodeclaims_disrupted_total{reason="spot_interrupted",nodepool="gpu-l4",capacity_type="spot"}', "0+1x60")],
      "30m", [{"nodepool": "gpu-l4"}]),
     ([s('karpenter_nodeclaims_disrupted_total{reason="spot_interrupted",nodepool="gpu-l4",capacity_type="spot"}', "0x10 1x50")],
      "30m")),
]


def write_rules(directory: Path, *, annotations: bool) -> Path:
    groups = rule_groups(T)
    if not annotations:
        groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]
    path = directory / ("rules.yaml" if annotations else "rules-under-test.yaml")
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_every_alert_has_a_firing_and_a_quiet_case():
    assert sorted(name for name, _, _ in CASES) == sorted(a.name for a in all_alerts(T))


def test_fatal_xids_follow_the_xid_catalog():
    """NVIDIA's Xid catalog, "Resolution Bucket (Immediate Action)": 79 RESTART_BM; 62, 64, 95,
    119, 120 RESET_GPU; 13, 31 RESTART_APP; 43, 63, 92 IGNORE (workloads/xid_actions.json)."""
    assert {48, 62, 64, 74, 79, 95, 119, 120} <= set(FATAL_XIDS)
    assert not {13, 31, 43, 63, 92} & set(FATAL_XIDS)


@needs_promtool
def test_promtool_check_rules(tmp_path):
    result = subprocess.run([PROMTOOL, "check", "rules", str(write_rules(tmp_path, annotations=True))],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("alert,fires,quiet", CASES, ids=[c[0] for c in CASES])
def test_promtool_alert_fires_and_stays_quiet(tmp_path, alert, fires, quiet):
    rules = write_rules(tmp_path, annotations=False)
    series, eval_time, expected = fires
    quiet_series, quiet_time = quiet
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m",
             "tests": [case(alert, series, eval_time, expected), case(alert, quiet_series, quiet_time, [])]}
    path = tmp_path / f"{alert}.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
