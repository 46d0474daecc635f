"""The `monitoring` section reaches what Prometheus and Alertmanager run: each setting an operator
changes shows up in the recorded PrometheusRule and kube-prometheus-stack values of the plan."""
from __future__ import annotations

import json

from tests.conftest import stack_config


def _recorded(plan, suffix: str) -> dict:
    (resource,) = [r for r in plan.recording.resources if r.name.endswith(suffix)]
    return resource.inputs


def test_changed_thresholds_and_retention_reach_the_rules_and_the_chart(plan_config):
    raw = stack_config("dev")
    raw["monitoring"] = {**raw["monitoring"], "gpuIdleMinutes": 47, "kueueWaitMinutes": 77, "retentionDays": 9,
                         "volumeGib": 200, "prometheusReplicas": 3, "stallStepMultiple": 13}
    plan = plan_config("dev", raw)

    rules = json.dumps(_recorded(plan, "-monitoring-rules")["spec"])
    assert "[47m]" in rules, "gpuIdleMinutes must reach the GPU idle alert's window"
    assert "[77m]" in rules, "kueueWaitMinutes must reach the Kueue wait alert"
    assert "> 13 * mlp_trainer_step_seconds" in rules, "stallStepMultiple must reach the stall alert"

    spec = _recorded(plan, "-monitoring-kube-prometheus-stack")["values"]["prometheus"]["prometheusSpec"]
    assert spec["replicas"] == 3 and spec["retention"] == "9d"
    # Prometheus storage docs: keep retentionSize at 80-85% of the disk (WAL and compaction).
    assert spec["retentionSize"] == "170GiB"


def test_replicas_default_to_two_in_prod_and_one_in_dev(dev_plan, prod_plan):
    for plan, replicas in ((dev_plan, 1), (prod_plan, 2)):
        values = _recorded(plan, "-monitoring-kube-prometheus-stack")["values"]
        assert values["prometheus"]["prometheusSpec"]["replicas"] == replicas
        assert values["alertmanager"]["alertmanagerSpec"]["replicas"] == replicas


def test_managed_monitoring_plans_a_remote_write_to_the_workspace_and_a_grafana_workspace(plan_config):
    """``monitoring.managed``: Prometheus remote-writes to the Amazon Managed Service for Prometheus
    workspace's endpoint (``<prometheusEndpoint>api/v1/remote_write``, the endpoint ending in "/"),
    with SigV4 in the workspace's region, and a Managed Grafana workspace reads it."""
    raw = stack_config("prod")
    raw["monitoring"] = {**raw["monitoring"], "managed": True}
    plan = plan_config("prod", raw)
    (workspace,) = plan.recording.by_type("aws:amp/workspace:Workspace")
    assert plan.recording.by_type("aws:grafana/workspace:Workspace")
    spec = _recorded(plan, "-monitoring-kube-prometheus-stack")["values"]["prometheus"]["prometheusSpec"]
    (remote,) = spec["remoteWrite"]
    assert remote["url"] == f"{workspace.outputs['prometheusEndpoint']}api/v1/remote_write"
    assert remote["url"].startswith(f"https://aps-workspaces.{plan.config.region}.amazonaws.com/workspaces/ws-")
    assert remote["sigv4"]["region"] == plan.config.region
