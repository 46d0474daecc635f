"""The metrics stack against its upstreams: chart values, DCGM field names, dashboard queries."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from workloads.monitoring import alerts, dashboards, dcgm, stack

UPSTREAM = Path(__file__).resolve().parents[1] / "infra" / "upstream"
KPS = UPSTREAM / "kube-prometheus-stack-88.5.3"
DCGM = UPSTREAM / "dcgm-exporter-4.1.1"
SUBCHARTS = {"kube-state-metrics": "kube-state-metrics-8.4.0-values.yaml",
             "prometheus-node-exporter": "prometheus-node-exporter-4.56.1-values.yaml"}
# grafana 12.11.1 (grafana-community/helm-charts) is not vendored: its standard pod-placement
# and service-account keys are accepted; everything else under grafana must exist in the
# parent chart's grafana section.
GRAFANA_SUBCHART_KEYS = {"nodeSelector", "tolerations"}


def spec(**overrides: Any) -> stack.StackSpec:
    return stack.StackSpec(**{"region": "us-west-2", "retention_days": 15, "volume_gib": 100,
                              "sns_topic_arn": "arn:aws:sns:us-west-2:111122223333:t", **overrides})


def unknown_keys(ours: Any, upstream: Any, path: str) -> Iterator[str]:
    """Key paths we set that the upstream values.yaml does not have. Below an upstream {} / []
    / null (a free-form map such as prometheusSpec.externalLabels) anything goes."""
    if not isinstance(ours, dict) or not isinstance(upstream, dict) or not upstream:
        return
    for key, value in ours.items():
        if key not in upstream:
            yield f"{path}.{key}"
        else:
            yield from unknown_keys(value, upstream[key], f"{path}.{key}")


def test_values_keys_exist_in_the_pinned_chart():
    """Helm silently ignores an unknown key (a typo'd retentionSize would keep nothing bounded):
    every key must exist in kube-prometheus-stack 88.5.3's values.yaml or its subchart's."""
    ours = stack.helm_values(spec(remote_write=stack.RemoteWriteSpec("https://aps/api/v1/remote_write", "us-west-2")))
    upstream = yaml.safe_load((KPS / "values.yaml").read_text())
    problems = []
    for key, value in ours.items():
        if key in SUBCHARTS:
            sub = yaml.safe_load((KPS / SUBCHARTS[key]).read_text())
            problems += list(unknown_keys(value, sub, key))
        elif key == "grafana":
            problems += [p for p in unknown_keys(value, upstream["grafana"], key)
                         if p.split(".")[1] not in GRAFANA_SUBCHART_KEYS]
        elif key not in upstream:
            problems.append(key)
        else:
            problems += list(unknown_keys(value, upstream[key], key))
    assert problems == []


def test_unknown_key_is_caught():
    upstream = yaml.safe_load((KPS / "values.yaml").read_text())
    assert list(unknown_keys({"prometheus": {"prometheusSpec": {"retentionSise": "1GiB"}}}, upstream, "")) == [
        ".prometheus.prometheusSpec.retentionSise"]


def test_crds_belong_to_their_own_release_and_retention_fits_the_volume():
    values = stack.helm_values(spec(volume_gib=100))
    assert values["crds"] == {"enabled": False}
    prom = values["prometheus"]["prometheusSpec"]
    assert prom["retentionSize"] == "85GiB"
    assert prom["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert prom["nodeSelector"] == {"node.mlplatform.io/role": "system"}


def test_alertmanager_routes_to_sns_or_nowhere():
    routed = stack.alertmanager_config("arn:aws:sns:us-west-2:111122223333:t", "us-west-2")
    assert routed["route"]["receiver"] == "sns"
    assert routed["receivers"][1]["sns_configs"][0]["sigv4"] == {"region": "us-west-2"}
    assert stack.alertmanager_config(None, "us-west-2")["route"]["receiver"] == "null"


def _upstream_fields() -> set[str]:
    fields = set()
    for name in ("default-counters.csv", "dcp-metrics-included.csv"):
        for line in (DCGM / name).read_text().splitlines():
            match = re.match(r"^#?\s*(DCGM_[A-Z0-9_]+)\s*,", line)
            if match:
                fields.add(match.group(1))
    return fields


def test_dcgm_fields_are_ones_the_pinned_exporter_knows():
    """dcgm-exporter refuses to start on an unknown field name; ours are all in its 4.1.1 lists."""
    assert {c.field for c in dcgm.COUNTERS} - _upstream_fields() == set()


def test_dcgm_counters_cover_the_alerts():
    needed = {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
              "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
              "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_POWER_VIOLATION",
              "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
              "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
              "DCGM_FI_PROF_DRAM_ACTIVE"}
    assert needed <= dcgm.metric_names()
    assert next(c for c in dcgm.COUNTERS if c.field == "DCGM_FI_DEV_XID_ERRORS").kind == "gauge"


# Metrics each exporter in the stack produces, from its source at the pinned version.
KUBE_STATE_METRICS = {"kube_pod_container_resource_requests", "kube_pod_status_phase", "kube_node_status_condition",
                      "kube_node_status_allocatable", "kube_node_status_capacity", "kube_pod_status_unschedulable",
                      "kube_pod_container_status_restarts_total", "kube_node_labels"}
KUEUE = {"kueue_pending_workloads", "kueue_admitted_workloads_total", "kueue_evicted_workloads_total",
         "kueue_admission_wait_time_seconds_bucket", "kueue_cluster_queue_resource_usage",
         "kueue_cluster_queue_nominal_quota"}
KARPENTER = {"karpenter_nodeclaims_created_total", "karpenter_nodeclaims_disrupted_total",
             "karpenter_cloudprovider_errors_total", "karpenter_nodepools_usage", "karpenter_nodepools_limit"}


def known_metrics() -> set[str]:
    from trainer.health import METRIC_NAMES
    return (set(dcgm.metric_names()) | KUBE_STATE_METRICS | set(stack.CUSTOM_RESOURCE_METRICS) | KUEUE | KARPENTER
            | set(METRIC_NAMES))


PROMQL_WORDS = {"sum", "by", "avg", "max", "min", "rate", "increase", "time", "histogram_quantile", "count", "on",
                "group_left", "and", "or", "unless", "abs", "max_over_time", "min_over_time", "sum_over_time",
                "label_replace", "without", "offset", "bool", "le", "humanizePercentage"}


def metric_names(expr: str) -> set[str]:
    stripped = re.sub(r'"[^"]*"', '""', expr)  # label values
    stripped = re.sub(r"\{[^}]*\}", "", stripped)  # matchers
    stripped = re.sub(r"\((?:[a-z_, ]*)\)", "()", stripped)  # by (...) / on (...) label lists
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # ranges
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped))
    return {w for w in words - PROMQL_WORDS if not re.fullmatch(r"e\d*|[0-9]+[smhd]", w)}


def all_queries() -> list[tuple[str, str, str]]:
    return [(stem, title, expr) for stem, board in dashboards.load().items() for title, expr in dashboards.queries(board)]


def test_dashboards_reference_only_metrics_the_stack_produces():
    known = known_metrics()
    unknown = {(stem, title): sorted(metric_names(expr) - known) for stem, title, expr in all_queries()
               if metric_names(expr) - known}
    assert unknown == {}
    alert_unknown = {a.name: sorted(metric_names(a.expr) - known) for a in alerts.all_alerts(alerts.AlertThresholds())
                     if metric_names(a.expr) - known}
    assert alert_unknown == {}


def test_metric_name_check_can_fail():
    assert metric_names('sum by (node) (rate(DCGM_FI_DEV_GPU_UTILL{pod!=""}[5m]))') - known_metrics() == {
        "DCGM_FI_DEV_GPU_UTILL"}


def test_dashboards_are_sidecar_configmaps():
    maps = dashboards.config_maps(stack.NAMESPACE, stack.DASHBOARD_LABEL)
    assert {m["metadata"]["name"] for m in maps} == {
        "dashboard-gpu-fleet", "dashboard-training-job", "dashboard-kueue", "dashboard-karpenter",
        "dashboard-cost-per-team"}
    assert all(m["metadata"]["labels"] == {"grafana_dashboard": "1"} for m in maps)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed: `apt-get install prometheus` (Debian) provides it; CI installs it")
def test_every_dashboard_query_parses(tmp_path):
    """promtool parses PromQL in rule files: each panel query becomes a recording rule."""
    rules = [{"record": f"dashboard:{stem.replace('-', '_')}:{i}", "expr": expr}
             for i, (stem, _, expr) in enumerate(all_queries())]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_its_runbook_section():
    root = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
    missing = [a.name for a in alerts.all_alerts(alerts.AlertThresholds())
               if f"## {a.name}\n" not in (root / f"{a.runbook}.md").read_text()]
    assert missing == []


def test_fluent_bit_values_exist_in_the_pinned_chart_and_reach_gpu_nodes():
    from components.container_logs import helm_values as fluent_bit_values
    ours = fluent_bit_values(region="us-west-2", group="/aws/eks/c/containers")
    upstream = yaml.safe_load((UPSTREAM / "aws-for-fluent-bit-0.2.0" / "values.yaml").read_text())
    assert [k for k in ours if k not in upstream] == []
    assert list(unknown_keys(ours, upstream, "")) == []
    assert ours["cloudWatchLogs"]["autoCreateGroup"] is False  # the platform's group: retention + key
    assert {"operator": "Exists"} in ours["tolerations"]  # tolerates the GPU and FSx taints


def test_both_gpu_enablement_modes_ship_the_counters_file():
    from components.gpu_enablement import dcgm_exporter_values, gpu_operator_values
    assert dcgm_exporter_values(service_monitor=False)["customMetrics"] == dcgm.counters_csv()
    config = gpu_operator_values(service_monitor=False)["dcgmExporter"]["config"]
    assert config["create"] is True and config["name"] and config["data"] == dcgm.counters_csv()
