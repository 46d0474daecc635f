"""The program's Helm releases rendered by real Helm from the pinned archives, with the exact values
the program passes (the recorded plan's ``kubernetes:helm.sh/v3:Release`` inputs), both stacks.

What only a render shows: a value the chart ignores (dead configuration), a ConfigMap a value fills
that no pod uses, a Fluent Bit output its own init refuses, a NetworkPolicy port no pod serves.
The checks themselves (tests/support/chart_checks.py) take plain objects, so the engine harness
runs them on the live objects after a real ``up`` too.

Needs Helm (`make engine-tools`) and the pinned archives (.ci/run seeds them); skips saying which
is missing. Argo CD 10.3.3 and Argo Workflows 1.1.1 have no verified archive: their releases are
listed, not rendered (test_only_the_charts_without_a_verified_archive_go_unrendered).
"""
from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path

import pytest

from catalog.versions import HELM_CHARTS
from components.container_logs import helm_values as fluent_bit_values
from tests.conftest import _plan
from tests.support import chart_checks
from tests.support.charts import PlannedRelease, helm_binary, planned_releases, value_effects
from workloads.monitoring.dcgm import counters_csv

STACKS = ("dev", "prod")


@functools.lru_cache(maxsize=None)
def releases(stack: str) -> tuple[PlannedRelease, ...]:
    return tuple(planned_releases(stack, _plan(stack)))


def renderable(stack: str) -> list[PlannedRelease]:
    return [r for r in releases(stack) if r.chart.sha256 is not None]


def release_ids() -> list[str]:
    # Parametrized by name; the plan itself is recorded inside the test (a session-cached fixture).
    return [f"{stack}:{name}" for stack, names in (
        ("dev", ["karpenter", "kueue", "nvidia-device-plugin", "dcgm-exporter", "amazon-cloudwatch-observability",
                 "aws-for-fluent-bit", "prometheus-operator-crds", "kube-prometheus-stack", "karpenter-crd"]),
        ("prod", ["karpenter", "kueue", "gpu-operator", "efa-device-plugin", "amazon-cloudwatch-observability",
                  "aws-for-fluent-bit", "prometheus-operator-crds", "kube-prometheus-stack", "karpenter-crd"]),
    ) for name in names]


def release(release_id: str) -> PlannedRelease:
    stack, name = release_id.split(":")
    found = [r for r in renderable(stack) if r.release == name]
    assert len(found) == 1, f"{release_id}: {len(found)} releases of that name in the {stack} plan"
    return found[0]


@pytest.fixture(scope="module")
def helm() -> Path:
    path = helm_binary()
    if path is None:
        pytest.skip("no helm at .cache/engine-tools/bin/helm: run `make engine-tools` (or set ML_PLATFORM_HELM)")
    return path


def test_every_release_with_a_verified_archive_is_rendered_here():
    """The parametrization above is the plans' releases, no more, no less (a new release is checked too)."""
    for stack in STACKS:
        listed = sorted(i.split(":")[1] for i in release_ids() if i.startswith(stack + ":"))
        assert listed == sorted(r.release for r in renderable(stack)), stack


def test_only_the_charts_without_a_verified_archive_go_unrendered():
    unrendered = {(r.chart.name, r.chart.version) for stack in STACKS for r in releases(stack) if r.chart.sha256 is None}
    assert unrendered == {("argo-cd", "10.3.3"), ("argo-workflows", "1.1.1")}
    assert all(c.sha256 is None for c in HELM_CHARTS if (c.name, c.version) in unrendered)


# -- dead configuration ----------------------------------------------------------------------------
@pytest.mark.parametrize("release_id", release_ids())
def test_every_value_the_program_sets_changes_the_render(release_id, helm, chart_archives):
    """Rendered without each top-level value, then with it changed: a value whose render is the
    same both times is one the chart never reads."""
    planned = release(release_id)
    _, effects = value_effects(planned, helm, chart_archives)
    dead = [e.key for e in effects if e.dead]
    assert not dead, (f"{release_id} ({planned.chart.name} {planned.chart.version}) ignores the values {dead}: "
                      "dead configuration (drop them, or use the keys this chart version reads)")


def test_the_dead_value_check_catches_a_value_the_chart_ignores(helm, chart_archives):
    """aws-efa-k8s-device-plugin v0.5.6 hard-codes priorityClassName and builds its affinity only
    from supportedInstanceLabels (templates/daemonset.yaml): values under those names are ignored."""
    planned = release("prod:efa-device-plugin")
    probe = PlannedRelease(**{**planned.__dict__, "values": {
        **planned.values, "priorityClassName": "system-cluster-critical",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "mlplatform.io/efa", "operator": "In", "values": ["true"]}]}]}}}}})
    _, effects = value_effects(probe, helm, chart_archives)
    assert sorted(e.key for e in effects if e.dead) == ["affinity", "priorityClassName"]


# -- EFA device plugin placement --------------------------------------------------------------------------
def test_the_efa_device_plugin_runs_on_the_platform_efa_nodes_only(helm, chart_archives):
    """The pinned chart reads node placement only from supportedInstanceLabels (a frozen instance
    list by default, so an EFA type newer than the chart gets no plugin); the platform names its own
    EFA node label there, and the chart's system-node-critical priority stays."""
    (daemonset,) = chart_checks_objects(release("prod:efa-device-plugin"), helm, chart_archives, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "mlplatform.io/efa", "operator": "In", "values": ["true"]},
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]}]}]
    assert spec["priorityClassName"] == "system-node-critical"
    tolerated = {t.get("key") for t in spec["tolerations"]}
    assert "nvidia.com/gpu" in tolerated, tolerated


def chart_checks_objects(planned: PlannedRelease, helm: Path, charts: Path, *kinds: str) -> list[dict]:
    return [o for o in planned.render(helm, charts) if o.get("kind") in kinds]


# -- ConfigMaps and Secrets a value fills ---------------------------------------------------------------
@pytest.mark.parametrize("release_id", release_ids())
def test_every_configmap_or_secret_a_value_fills_is_used_by_a_pod(release_id, helm, chart_archives):
    planned = release(release_id)
    noisy, effects = value_effects(planned, helm, chart_archives)
    filled = {k for e in effects for k in e.changed if k[0] in ("ConfigMap", "Secret")}
    assert chart_checks.unconsumed(planned.render(helm, chart_archives), filled) == []


def test_dcgm_exporter_loads_the_platform_metric_list(helm, chart_archives):
    """The published dcgm-exporter 4.1.1 archive (not its git tag, whose DaemonSet mounts only
    pod-gpu-resources, tls and web-config-yaml) mounts exporter-metrics-config-map over
    /etc/dcgm-exporter/default-counters.csv through its default extraConfigMapVolumes /
    extraVolumeMounts, and its default arguments read that file with -f: the platform's list
    (customMetrics) is what the exporter collects."""
    objects = release("dev:dcgm-exporter").render(helm, chart_archives)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "exporter-metrics-config-map"]
    assert config_map["data"]["metrics"].strip() == counters_csv().strip()
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    (exporter,) = spec["containers"]
    args = exporter["args"]
    counters_file = args[args.index("-f") + 1]
    (mount,) = [m for m in exporter["volumeMounts"] if m["mountPath"] == counters_file]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "exporter-metrics-config-map"
    item_path = mount.get("subPath") or Path(counters_file).name
    assert {"key": "metrics", "path": item_path} in volume["configMap"]["items"]


def test_the_unused_configmap_check_catches_the_exporter_that_never_mounts_its_list(helm, chart_archives):
    """The reading of the chart's git tag: a DaemonSet without the metrics volume. Rendering the
    published archive with its extra volumes emptied reproduces it; the check must name the ConfigMap."""
    planned = release("dev:dcgm-exporter")
    objects = planned.render(helm, chart_archives, {**planned.values, "extraConfigMapVolumes": [], "extraVolumeMounts": []})
    problems = chart_checks.unconsumed(objects, {("ConfigMap", "gpu-system", "exporter-metrics-config-map")})
    assert len(problems) == 1 and "exporter-metrics-config-map" in problems[0]


def test_gpu_operator_points_its_dcgm_exporter_at_the_platform_metric_list(helm, chart_archives):
    """Prod: the chart writes dcgmExporter.config.data into the ConfigMap the ClusterPolicy names;
    the operator mounts it into the exporter (gpu-operator controllers/object_controls.go)."""
    objects = release("prod:gpu-operator").render(helm, chart_archives)
    (policy,) = [o for o in objects if o["kind"] == "ClusterPolicy"]
    name = policy["spec"]["dcgmExporter"]["config"]["name"]
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    assert config_map["data"]["dcgm-metrics.csv"].strip() == counters_csv().strip()


# -- CloudWatch agent ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
def test_the_cloudwatch_agent_collects_container_insights_and_the_operator_instruments_nothing(stack, helm, chart_archives):
    """What the dropped containerInsights/applicationSignals flags would have meant, read from the
    render: the agent's config (the platform's, replacing the chart's default) and the operator's
    --auto-monitor-config (monitorAllServices false: no workload is auto-instrumented)."""
    import json

    (planned,) = [r for r in renderable(stack) if r.chart.name == "amazon-cloudwatch-observability"]
    objects = planned.render(helm, chart_archives)
    (agent,) = [o for o in objects if o["kind"] == "AmazonCloudWatchAgent" and o["metadata"]["name"] == "cloudwatch-agent"]
    config = json.loads(agent["spec"]["config"])
    assert config["logs"]["metrics_collected"]["kubernetes"]["enhanced_container_insights"] is True
    assert "application_signals" not in json.dumps(config) and "traces" not in config
    args = [a for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
            for a in c.get("args", []) if a.startswith("--auto-monitor-config=")]
    assert len(args) == 1 and json.loads(args[0].split("=", 1)[1])["monitorAllServices"] is False


# -- Fluent Bit ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
def test_fluent_bit_output_names_a_log_stream_and_keeps_the_per_container_template(stack, helm, chart_archives):
    """Fluent Bit's cloudwatch_logs init needs exactly one of log_stream_name / log_stream_prefix,
    even with log_stream_template (the template is tried per record first; the prefix + tag is the
    fallback when it cannot be resolved: cloudwatch_api.c get_log_stream, "templates take priority")."""
    (planned,) = [r for r in renderable(stack) if r.chart.name == "aws-for-fluent-bit"]
    objects = planned.render(helm, chart_archives)
    outputs = chart_checks.cloudwatch_outputs(objects)
    # The platform's namespaces go to the cluster's group; team namespaces (re-tagged team.*) to
    # their own group each, named by a template: two outputs, and Fluent Bit starts only if both pass.
    assert len(outputs) == 2, outputs
    assert chart_checks.cloudwatch_output_problems(objects) == []
    template = "$kubernetes['namespace_name'].$kubernetes['pod_name'].$kubernetes['container_name']"
    assert {props["log_stream_template"] for _, props in outputs} == {template}
    # log_group_name is required by the plugin's init; a team record whose template cannot resolve
    # falls back to the cluster's group, never to another team's.
    group = planned.values["cloudWatchLogs"]["logGroupName"]
    assert [props["log_group_name"] for _, props in outputs] == [group, group]
    assert [props.get("log_group_template") for _, props in outputs] == [
        None, f"{group}/$kubernetes['namespace_name']"]


def test_the_stream_check_catches_an_output_fluent_bit_refuses(helm, chart_archives):
    (planned,) = [r for r in renderable("dev") if r.chart.name == "aws-for-fluent-bit"]
    values = {**planned.values, "cloudWatchLogs": {**planned.values["cloudWatchLogs"], "logStreamPrefix": ""}}
    problems = chart_checks.cloudwatch_output_problems(planned.render(helm, chart_archives, values))
    assert len(problems) == 1 and "neither" in problems[0]


def test_the_components_fluent_bit_values_are_the_planned_ones():
    assert fluent_bit_values(region="us-west-2", group="g")["cloudWatchLogs"]["logStreamPrefix"]


# -- NetworkPolicy ports ------------------------------------------------------------------------------------
POLICY_TYPE = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
WORKLOAD_TYPES = ("kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet")


def namespaces(stack: str) -> list[str]:
    return sorted({r.namespace for r in renderable(stack)})


@pytest.mark.parametrize("stack", STACKS)
def test_network_policy_ports_match_the_ports_the_charts_serve(stack, helm, chart_archives):
    plan = _plan(stack)
    policies = [r.inputs for r in plan.recording.by_type(POLICY_TYPE)]
    own = [dict(r.inputs, kind=r.type.rsplit(":", 1)[1]) for t in WORKLOAD_TYPES for r in plan.recording.by_type(t)]
    by_namespace: dict[str, list] = defaultdict(list)
    for planned in renderable(stack):
        objects = planned.render(helm, chart_archives)
        by_namespace[planned.namespace] += [*objects, *operand_services(objects, planned.namespace)]
    problems = []
    for namespace, objects in sorted(by_namespace.items()):
        mine = [o for o in own if (o.get("metadata") or {}).get("namespace") == namespace]
        problems += chart_checks.policy_port_problems([*objects, *mine], policies, namespace,
                                                      unreachable_ok=UNREACHABLE_OK)
    assert problems == []


# Services whose port nothing outside their own pods needs to reach, each with why.
UNREACHABLE_OK: dict[str, str] = {}


def operand_services(objects: list, namespace: str) -> list[dict]:
    """Services an operator creates at run time from a rendered custom resource (not in the render):
    the GPU Operator's DCGM exporter operand, when its ClusterPolicy enables it, is Service
    nvidia-dcgm-exporter, labelled app=nvidia-dcgm-exporter, port gpu-metrics 9400 -> 9400 (NVIDIA/gpu-operator
    assets/state-dcgm-exporter/0600_service.yaml)."""
    found = []
    for obj in objects:
        if obj.get("kind") == "ClusterPolicy" and (obj["spec"].get("dcgmExporter") or {}).get("enabled"):
            found.append({"kind": "Service", "metadata": {"name": "nvidia-dcgm-exporter", "namespace": namespace,
                                                          "labels": {"app": "nvidia-dcgm-exporter"}},
                          "spec": {"selector": {"app": "nvidia-dcgm-exporter"},
                                   "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400}]}})
    return found


def test_the_port_check_catches_a_closed_webhook_port_and_a_port_nothing_serves(helm, chart_archives):
    """Kueue's webhook Service sends the API server to port 9443: without a policy admitting it,
    every admission call times out; a policy port no pod serves is a typo that leaves the real one closed."""
    plan = _plan("dev")
    (kueue,) = [r for r in renderable("dev") if r.chart.name == "kueue"]
    objects = kueue.render(helm, chart_archives)
    policies = [r.inputs for r in plan.recording.by_type(POLICY_TYPE)]
    assert chart_checks.policy_port_problems(objects, policies, kueue.namespace) == []
    closed = [{**p, "spec": {**p["spec"], "ingress": [
        {**rule, "ports": [port for port in rule.get("ports", []) if port.get("port") != 9443]}
        for rule in p["spec"].get("ingress", [])]}} for p in policies]
    closed.append({"metadata": {"name": "typo", "namespace": kueue.namespace},
                   "spec": {"ingress": [{"ports": [{"port": 9999, "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}})
    problems = chart_checks.policy_port_problems(objects, closed, kueue.namespace)
    assert any("targets port 9443, which no NetworkPolicy admits" in p for p in problems), problems
    assert any("admits port 9999, which no pod or Service of the namespace serves" in p for p in problems), problems
