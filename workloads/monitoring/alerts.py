"""The platform's alerts: PrometheusRule groups, each alert with its runbook.

Every alert names a runbook under docs/runbooks/ (``runbook_url`` annotation) and has a
``promtool test rules`` case that fires it and one that must not (tests/workloads/
test_alerts_promtool.py). Thresholds come from ``AlertThresholds`` (the ``monitoring`` config).

Metric sources: DCGM exporter (workloads/monitoring/dcgm.py), kube-state-metrics (pods, nodes,
custom resource state for PyTorchJob), Kueue 0.19.2 (pkg/metrics/metrics.go), Karpenter 1.14.1
(pkg/metrics/metrics.go; nodeclaims_disrupted_total reasons "insufficient_capacity" from
pkg/controllers/nodeclaim/lifecycle/launch.go and the AWS provider's interruption message kinds,
e.g. "spot_interrupted"), and the trainer's health endpoint (trainer/health.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.node_health_agent import READINESS_TAINT
from workloads.xid import actionable_xids

RUNBOOK_BASE = "https://github.com/example-org/ml-training-platform/blob/main/docs/runbooks"

# XIDs after which the node leaves service (action drain, reset or replace): read from the
# XID -> action table (workloads/xid_actions.json, sourced from NVIDIA's Xid catalog).
FATAL_XIDS: tuple[int, ...] = actionable_xids()

TEAM_NAMESPACE_REGEX = "team-.*"
GPU_RESOURCE = "nvidia_com_gpu"  # kube-state-metrics' sanitised name of nvidia.com/gpu
READINESS_TAINT_KEY = READINESS_TAINT["key"]


@dataclass(frozen=True)
class AlertThresholds:
    """gpu_idle_minutes: allocated GPUs at 0% for this long. stall_step_multiple: no step for
    N x the job's recent step time (and at least ``stall_min_minutes``). checkpoint_age_multiple:
    last checkpoint older than K x its interval. kueue_wait_minutes: a ClusterQueue with pending
    workloads and no admission for this long. spot_interruptions_per_hour: per pool.
    restarts_per_hour: container restarts of a training pod."""

    gpu_idle_minutes: int = 30
    stall_step_multiple: int = 10
    stall_min_minutes: int = 10
    checkpoint_age_multiple: int = 3
    kueue_wait_minutes: int = 240
    spot_interruptions_per_hour: int = 3
    restarts_per_hour: int = 3
    throttle_ratio: float = 0.2
    throttle_minutes: int = 15


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str  # critical pages; warning goes to the channel
    summary: str
    runbook: str  # docs/runbooks/<runbook>.md, anchor = alert name lower-cased

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE}/{self.runbook}.md#{self.name.lower()}"

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr,
                               "labels": {"severity": self.severity},
                               "annotations": {"summary": self.summary, "runbook_url": self.runbook_url}}
        if self.for_ != "0m":
            out["for"] = self.for_
        return out


def _xid_expr() -> str:
    # The gauge holds the last XID code: compare values, never rate() it.
    return " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {code}" for code in FATAL_XIDS)


def gpu_alerts(t: AlertThresholds) -> list[Alert]:
    gpu_pods = (f'sum by (node) (kube_pod_container_resource_requests{{resource="{GPU_RESOURCE}"}} '
                f'* on (namespace, pod) group_left () (kube_pod_status_phase{{phase="Running"}} == 1)) > 0')
    return [
        Alert("GpuFatalXid", _xid_expr(), "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} raised XID {{ $value }}: reset the GPU or replace the node",
              "gpu-health"),
        Alert("GpuUncorrectableEcc",
              "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0 or increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[10m]) > 0",
              "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} had uncorrectable ECC errors", "gpu-health"),
        Alert("GpuRowRemapFailure", "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a memory row: replace the node",
              "gpu-health"),
        Alert("GpuThermalThrottling",
              f"rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) / 1e6 > {t.throttle_ratio}", f"{t.throttle_minutes}m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} is thermally throttled {{ $value | humanizePercentage }} of the time",
              "gpu-health"),
        Alert("GpuPowerThrottling",
              f"rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) / 1e6 > {t.throttle_ratio}", f"{t.throttle_minutes}m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.node }} is power throttled {{ $value | humanizePercentage }} of the time",
              "gpu-health"),
        Alert("GpuNvlinkErrors",
              "increase(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL[10m]) > 0 "
              "or increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[10m]) > 0",
              "0m", "warning", "NVLink errors on GPU {{ $labels.gpu }} of {{ $labels.node }}", "gpu-health"),
        Alert("GpuNodeNotReadyWithPods",
              f'((kube_node_status_condition{{condition="Ready",status="true"}} == 0) '
              f'or (kube_node_status_allocatable{{resource="{GPU_RESOURCE}"}} '
              f'< kube_node_status_capacity{{resource="{GPU_RESOURCE}"}})) and on (node) ({gpu_pods})',
              "5m", "critical",
              "GPU node {{ $labels.node }} is not ready or lost GPUs while GPU pods run on it", "gpu-health"),
        # A GPU node that keeps the readiness taint (workloads/node_health_agent.py READINESS_TAINT)
        # takes no job and is never consolidated (Karpenter 1.14.1: an un-Initialized node is no
        # disruption candidate), and node repair does not act: the agent never set
        # AcceleratedHardwareReady=False (it crashed, never started, or hit a tool error). The
        # periodic deep check re-adds the taint for the few minutes of `dcgmi diag -r 2`.
        Alert("GpuNodeNeverReady",
              f'max by (node) (kube_node_spec_taint{{key="{READINESS_TAINT_KEY}"}}) == 1', "30m", "critical",
              "GPU node {{ $labels.node }} has kept the readiness taint for 30 minutes: its agent crashed, never ran or "
              "hit a tool error; the node costs money and takes no job", "gpu-health"),
        Alert("GpuAllocatedIdle",
              f'max_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{t.gpu_idle_minutes}m]) == 0', "0m", "warning",
              f"GPU {{{{ $labels.gpu }}}} held by {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} has been idle "
              f"for {t.gpu_idle_minutes} minutes", "gpu-node-idle"),
    ]


def job_alerts(t: AlertThresholds) -> list[Alert]:
    since_step = "(time() - mlp_trainer_last_step_timestamp_seconds)"
    since_ckpt = "(time() - mlp_trainer_last_checkpoint_timestamp_seconds)"
    return [
        Alert("TrainingJobStalled",
              f"{since_step} > {t.stall_step_multiple} * mlp_trainer_step_seconds "
              f"and {since_step} > {t.stall_min_minutes * 60}",
              "0m", "critical",
              "{{ $labels.namespace }}/{{ $labels.job_name }} made no step for {{ $value | humanizeDuration }}",
              "training-jobs"),
        Alert("TrainingCheckpointTooOld",
              f"{since_ckpt} > {t.checkpoint_age_multiple} * mlp_trainer_checkpoint_interval_steps "
              "* mlp_trainer_step_seconds and mlp_trainer_checkpoint_interval_steps > 0",
              "0m", "warning",
              "{{ $labels.namespace }}/{{ $labels.job_name }}: last checkpoint is {{ $value | humanizeDuration }} old",
              "training-jobs"),
        Alert("TrainingLossNotFinite",
              "mlp_trainer_loss != mlp_trainer_loss or abs(mlp_trainer_loss) > 1e30", "0m", "critical",
              "{{ $labels.namespace }}/{{ $labels.job_name }}: loss is not finite", "training-jobs"),
        Alert("TrainingLossDiverging",
              "mlp_trainer_loss > 2 * min_over_time(mlp_trainer_loss[2h])", "15m", "warning",
              "{{ $labels.namespace }}/{{ $labels.job_name }}: loss doubled from its 2-hour minimum", "training-jobs"),
        Alert("TrainingPodRestartLoop",
              f'increase(kube_pod_container_status_restarts_total{{namespace=~"{TEAM_NAMESPACE_REGEX}"}}[1h]) '
              f">= {t.restarts_per_hour}",
              "0m", "warning",
              "{{ $labels.namespace }}/{{ $labels.pod }} restarted {{ $value }} times in an hour", "training-jobs"),
        Alert("PyTorchJobFailed",
              'kube_pytorchjob_status_condition{type="Failed"} == 1', "0m", "warning",
              "PyTorchJob {{ $labels.namespace }}/{{ $labels.name }} failed", "training-jobs"),
        Alert("GpuPodsUnschedulable",
              f'(kube_pod_status_unschedulable == 1) and on (namespace, pod) '
              f'(sum by (namespace, pod) (kube_pod_container_resource_requests{{resource="{GPU_RESOURCE}"}}) > 0)',
              "15m", "warning",
              "GPU pod {{ $labels.namespace }}/{{ $labels.pod }} has been unschedulable for 15 minutes", "training-jobs"),
    ]


def capacity_alerts(t: AlertThresholds) -> list[Alert]:
    wait = f"{t.kueue_wait_minutes}m"
    return [
        Alert("KueueWorkloadsWaiting",
              f'sum by (cluster_queue) (kueue_pending_workloads{{status="active"}}) > 0 '
              f"and on (cluster_queue) sum by (cluster_queue) (increase(kueue_admitted_workloads_total[{wait}])) == 0",
              wait, "warning",
              "ClusterQueue {{ $labels.cluster_queue }} has pending workloads and admitted none for "
              f"{t.kueue_wait_minutes} minutes", "kueue"),
        Alert("KueueWorkloadsEvicted",
              'sum by (cluster_queue, reason) (increase(kueue_evicted_workloads_total{reason!="Preempted"}[30m])) > 0',
              "0m", "warning",
              "ClusterQueue {{ $labels.cluster_queue }} evicted workloads ({{ $labels.reason }})", "kueue"),
        Alert("KarpenterLaunchFailures",
              'sum by (nodepool) (increase(karpenter_nodeclaims_disrupted_total{reason="insufficient_capacity"}[30m])) > 0 '
              'or label_replace(sum by (error) (increase(karpenter_cloudprovider_errors_total{method="Create"}[30m])) > 0, '
              '"nodepool", "unknown", "", "")',
              "0m", "warning",
              "Karpenter could not launch nodes for pool {{ $labels.nodepool }}", "gpu-pools"),
        Alert("SpotInterruptionRateHigh",
              'sum by (nodepool) (increase(karpenter_nodeclaims_disrupted_total{reason="spot_interrupted"}[1h])) '
              f">= {t.spot_interruptions_per_hour}",
              "0m", "warning",
              "Pool {{ $labels.nodepool }} lost {{ $value }} spot nodes in an hour", "gpu-pools"),
    ]


def all_alerts(t: AlertThresholds) -> list[Alert]:
    return [*gpu_alerts(t), *job_alerts(t), *capacity_alerts(t)]


def rule_groups(t: AlertThresholds) -> list[dict[str, Any]]:
    return [
        {"name": "mlplatform-gpu", "rules": [a.rule() for a in gpu_alerts(t)]},
        {"name": "mlplatform-training-jobs", "rules": [a.rule() for a in job_alerts(t)]},
        {"name": "mlplatform-capacity", "rules": [a.rule() for a in capacity_alerts(t)]},
    ]
