"""kube-prometheus-stack values and the platform's scrape objects (pure functions).

Chart keys are checked against the chart's own values.yaml at the pinned version
(tests/infra/upstream/kube-prometheus-stack-88.5.3, tests/workloads/test_monitoring.py): the chart
(88.5.3) ships no values.schema.json, so the contract is "every key we set exists upstream".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from workloads.placement import system_node_selector, system_tolerations
from workloads import trainjob_runtime

NAMESPACE = "monitoring"
RELEASE = "kube-prometheus-stack"
# Short object names (the chart's cleanPrometheusOperatorObjectNames) and fixed service
# accounts, so Pod Identity associations and RBAC can name them.
FULLNAME = "kps"
PROMETHEUS_SERVICE_ACCOUNT = "prometheus"
ALERTMANAGER_SERVICE_ACCOUNT = "alertmanager"
# Objects carrying this label are picked up by the platform's Prometheus (rules, monitors).
SELECTOR_LABEL = {"mlplatform.io/monitoring": "platform"}
DASHBOARD_LABEL = "grafana_dashboard"
TRAINER_METRICS_LABEL = "mlplatform.io/trainer-metrics"
# PyTorchJob: only the Master pod (rank 0) carries the label, value "true", and declares the port.
# TrainJob: every node's pod shares one template and a TrainJob cannot declare container ports
# (runtimePatches containers take env/volumeMounts/securityContext only), so its pods carry
# "trainjob" and a second PodMonitor picks node rank 0 by the Indexed Job's pod label (Trainer
# v2.3 torch plugin: PET_NODE_RANK = the job-completion index; Kubernetes Jobs: "the pod label
# batch.kubernetes.io/job-completion-index", v1.28+) and sets the port by relabeling (Prometheus
# kubernetes_sd pod role: "If a container has no specified ports, a port-free target per
# container is created for manually adding a port via relabeling").
TRAINJOB_METRICS_LABEL_VALUE = "trainjob"
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
TRAINJOB_CONTAINER_NAME = trainjob_runtime.CONTAINER
TRAINING_OPERATOR_SERVICE_LABELS = {"app": "training-operator"}
TRAINING_OPERATOR_METRICS_PORT_NAME = "monitoring-port"
TRAINING_OPERATOR_METRICS_PORT = 8080
TRAINER_METRICS_PORT_NAME = "metrics"
TRAINER_METRICS_PORT = 9464
# Ports the stack listens on (ingress from the VPC: port-forwards through the kubelet, scrapes).
PROMETHEUS_PORT, ALERTMANAGER_PORT, GRAFANA_PORT, OPERATOR_WEBHOOK_PORT = 9090, 9093, 3000, 10250
KUBE_STATE_METRICS_PORT, NODE_EXPORTER_PORT = 8080, 9100

# EKS publishes the scheduler's and controller manager's metrics through the API server
# (EKS User Guide, "Fetch control plane raw metrics in Prometheus format": paths
# /apis/metrics.eks.amazonaws.com/v1/ksh/container/metrics and .../kcm/container/metrics, 1.28+,
# RBAC on apiGroup metrics.eks.amazonaws.com resources kcm/metrics and ksh/metrics, verb get).
EKS_CONTROL_PLANE_METRICS = {
    "kube-scheduler": "/apis/metrics.eks.amazonaws.com/v1/ksh/container/metrics",
    "kube-controller-manager": "/apis/metrics.eks.amazonaws.com/v1/kcm/container/metrics",
}


@dataclass(frozen=True)
class RemoteWriteSpec:
    """Amazon Managed Service for Prometheus: its remote-write URL and region (SigV4)."""

    url: Any  # str or pulumi Output
    region: str


@dataclass(frozen=True)
class StackSpec:
    """What the platform's Prometheus keeps and where alerts go.

    retention_days / volume_gib: local TSDB; retentionSize is kept below the volume so the
    WAL and compaction fit (Prometheus storage docs: size-based retention counts blocks, WAL
    and head chunks, "but it's recommended to keep retention size to 80-85% of the disk").
    sns_topic_arn: Alertmanager's receiver (SNS, SigV4 with Pod Identity); None: alerts stay
        in Alertmanager's UI.
    heartbeat_topic_arn: where the always-firing Watchdog goes, every few minutes: the dead man's
        switch (a CloudWatch alarm pages when its publishes stop; components/gpu_idle_alarm.py).
    team_topic_arns: team namespace -> the team's own SNS topic: alerts labelled with that
        namespace (its jobs') go there instead of to the platform's receiver.
    remote_write: managed Prometheus; None keeps everything in-cluster.
    grafana_amp_datasource_url: AMP query URL for Grafana (managed mode), else local Prometheus.
    """

    region: str
    retention_days: int
    volume_gib: int
    prometheus_replicas: int = 1
    alertmanager_replicas: int = 1
    sns_topic_arn: Any = None
    heartbeat_topic_arn: Any = None
    team_topic_arns: Mapping[str, Any] = field(default_factory=dict)
    remote_write: Optional[RemoteWriteSpec] = None
    grafana: bool = True
    team_namespaces: Sequence[str] = ()
    extra_labels: dict[str, str] = field(default_factory=dict)


def retention_size_gib(volume_gib: int) -> int:
    """85% of the volume, rounded down (the Prometheus docs' upper recommendation)."""
    return max(1, (volume_gib * 85) // 100)


def _placement() -> dict[str, Any]:
    return {"nodeSelector": system_node_selector(), "tolerations": system_tolerations()}


def _volume(gib: int) -> dict[str, Any]:
    return {"volumeClaimTemplate": {"spec": {
        "storageClassName": "gp3", "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{gib}Gi"}}}}}


HEARTBEAT_RECEIVER = "heartbeat"
# Watchdog is re-sent every 2 minutes, so each of SNS's 5-minute metric periods sees publishes even
# when a send slips to the next group_interval tick (Alertmanager resends on those ticks).
HEARTBEAT_REPEAT = "2m"


def team_receiver(namespace: str) -> str:
    return namespace  # "team-<name>": one receiver per team namespace


def _sns_receiver(name: str, topic_arn: Any, region: str) -> dict[str, Any]:
    return {"name": name, "sns_configs": [{
        "topic_arn": topic_arn, "sigv4": {"region": region}, "send_resolved": True,
        "subject": '[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}',
        "message": '{{ range .Alerts }}{{ .Annotations.summary }} {{ .Annotations.runbook_url }}\n{{ end }}',
    }]}


def alertmanager_config(sns_topic_arn: Any, region: str, *, heartbeat_topic_arn: Any = None,
                        team_topic_arns: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Route alerts to SNS (the GPU idle alarm's topic: the platform's on-call) or nowhere; a
    team's alerts (label ``namespace`` = its namespace: its jobs' stalls, restarts, failures) to
    the team's own topic; the always-firing Watchdog to the heartbeat topic.

    Alertmanager's sns_config signs with SigV4 from the default credential chain (Pod Identity
    here); Alertmanager docs, "<sns_config>": topic_arn, sigv4.region. Routes are matched in
    order and the first match wins unless it says ``continue`` ("<route>" in the Alertmanager
    configuration docs), so Watchdog is first and never reaches a person's receiver.
    """
    watchdog: dict[str, Any] = {"receiver": "null", "matchers": ['alertname="Watchdog"']}
    receivers: list[dict[str, Any]] = [{"name": "null"}]
    if heartbeat_topic_arn is not None:
        watchdog = {**watchdog, "receiver": HEARTBEAT_RECEIVER, "group_wait": "0s", "group_interval": "1m",
                    "repeat_interval": HEARTBEAT_REPEAT}
        receivers.append(_sns_receiver(HEARTBEAT_RECEIVER, heartbeat_topic_arn, region))
    routes = [watchdog]
    for namespace, topic in sorted((team_topic_arns or {}).items()):
        routes.append({"receiver": team_receiver(namespace), "matchers": [f'namespace="{namespace}"']})
        receivers.append(_sns_receiver(team_receiver(namespace), topic, region))
    route: dict[str, Any] = {"receiver": "null", "group_by": ["alertname", "namespace", "node"],
                             "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h", "routes": routes}
    if sns_topic_arn is not None:
        route["receiver"] = "sns"
        receivers.append(_sns_receiver("sns", sns_topic_arn, region))
    return {"route": route, "receivers": receivers, "inhibit_rules": [{
        "source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
        "equal": ["alertname", "namespace", "node"]}]}


def eks_control_plane_scrape_configs() -> list[dict[str, Any]]:
    """Scheduler and controller-manager metrics, read through the API server (default/kubernetes)."""
    out = []
    for job, path in EKS_CONTROL_PLANE_METRICS.items():
        out.append({
            "job_name": job, "scheme": "https", "metrics_path": path,
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": ["default"]}}],
            "authorization": {"credentials_file": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
            "tls_config": {"ca_file": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                           "insecure_skip_verify": False},
            "relabel_configs": [{"source_labels": ["__meta_kubernetes_service_name",
                                                   "__meta_kubernetes_endpoint_port_name"],
                                 "action": "keep", "regex": "kubernetes;https"}],
        })
    return out


def eks_control_plane_rbac() -> list[dict[str, Any]]:
    """Let Prometheus read the EKS control-plane metrics API."""
    name = "mlplatform-eks-control-plane-metrics"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": ["metrics.eks.amazonaws.com"], "resources": ["kcm/metrics", "ksh/metrics"],
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
    ]


def _status_condition_metrics(kind: str, group: str, version: str, prefix: str) -> dict[str, Any]:
    return {
        "groupVersionKind": {"group": group, "version": version, "kind": kind},
        "metricNamePrefix": prefix,
        "labelsFromPath": {"name": ["metadata", "name"], "namespace": ["metadata", "namespace"]},
        "metrics": [
            {"name": "status_condition", "help": f"{kind} status conditions (1 when the condition's status is True).",
             "each": {"type": "Gauge", "gauge": {"path": ["status", "conditions"], "labelsFromPath": {"type": ["type"]},
                                                  "valueFrom": ["status"]}}},
            {"name": "created", "help": f"{kind} creation time (unix seconds).",
             "each": {"type": "Gauge", "gauge": {"path": ["metadata", "creationTimestamp"]}}},
        ],
    }


def custom_resource_state() -> dict[str, Any]:
    """kube-state-metrics custom resource state: PyTorchJob and TrainJob conditions.

    Metric names are ``<metricNamePrefix>_<name>`` (kube-state-metrics docs,
    customresourcestate-metrics.md): kube_pytorchjob_status_condition{type="Failed"}, ...;
    the string "True"/"False" of a condition's status maps to 1/0.
    """
    return {"spec": {"resources": [
        _status_condition_metrics("PyTorchJob", "kubeflow.org", "v1", "kube_pytorchjob"),
        _status_condition_metrics("TrainJob", "trainer.kubeflow.org", "v1alpha1", "kube_trainjob"),
    ]}}


CUSTOM_RESOURCE_METRICS = frozenset({
    "kube_pytorchjob_status_condition", "kube_pytorchjob_created",
    "kube_trainjob_status_condition", "kube_trainjob_created",
})


def helm_values(spec: StackSpec) -> dict[str, Any]:
    placement = _placement()
    prometheus_spec: dict[str, Any] = {
        **placement,
        "replicas": spec.prometheus_replicas,
        "retention": f"{spec.retention_days}d",
        "retentionSize": f"{retention_size_gib(spec.volume_gib)}GiB",
        "storageSpec": _volume(spec.volume_gib),
        # Pick up every ServiceMonitor/PodMonitor/PrometheusRule, not only the chart's own.
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "scrapeInterval": "30s",
        "evaluationInterval": "30s",
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "additionalScrapeConfigs": eks_control_plane_scrape_configs(),
        "externalLabels": dict(spec.extra_labels),
    }
    if spec.remote_write is not None:
        prometheus_spec["remoteWrite"] = [{"url": spec.remote_write.url,
                                           "sigv4": {"region": spec.remote_write.region}}]
    gpu_and_system_tolerations = [{"operator": "Exists"}]  # node agents run on every node, GPU taints included
    values: dict[str, Any] = {
        "fullnameOverride": FULLNAME,
        "cleanPrometheusOperatorObjectNames": True,
        "crds": {"enabled": False},  # the prometheus-operator-crds release owns them (upgrades included)
        "prometheusOperator": {
            **placement,
            "admissionWebhooks": {"patch": {**placement}},
        },
        "prometheus": {
            "serviceAccount": {"create": True, "name": PROMETHEUS_SERVICE_ACCOUNT},
            "prometheusSpec": prometheus_spec,
        },
        "alertmanager": {
            "enabled": True,
            "serviceAccount": {"create": True, "name": ALERTMANAGER_SERVICE_ACCOUNT},
            "config": alertmanager_config(spec.sns_topic_arn, spec.region, heartbeat_topic_arn=spec.heartbeat_topic_arn,
                                          team_topic_arns=spec.team_topic_arns),
            "alertmanagerSpec": {**placement, "replicas": spec.alertmanager_replicas,
                                 "retention": "120h", "storage": _volume(2)},
        },
        "grafana": {
            "enabled": spec.grafana,
            **placement,
            "sidecar": {"dashboards": {"enabled": True, "label": DASHBOARD_LABEL, "labelValue": "1",
                                       "searchNamespace": NAMESPACE}},
        },
        "kube-state-metrics": {
            **placement,
            "customResourceState": {"enabled": True, "config": custom_resource_state()},
            # Instance type and pool as labels of kube_node_labels (the cost-per-team dashboard).
            "metricLabelsAllowlist": ["nodes=[node.kubernetes.io/instance-type,karpenter.sh/nodepool]"],
            "rbac": {"extraRules": [
                {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["list", "watch"]},
                {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["list", "watch"]},
            ]},
        },
        "prometheus-node-exporter": {"tolerations": gpu_and_system_tolerations},
        # EKS runs these off-cluster: the chart's endpoints-based scrapes would find nothing.
        "kubeControllerManager": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "kubeEtcd": {"enabled": False},
        # EKS's kube-proxy binds its metrics to 127.0.0.1:10249.
        "kubeProxy": {"enabled": False},
    }
    return values


# -- scrape objects ---------------------------------------------------------------------------
def _monitor(kind: str, name: str, namespace: str, selector: dict[str, str], endpoints: list[dict[str, Any]],
             namespaces: Sequence[str]) -> dict[str, Any]:
    key = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(SELECTOR_LABEL)},
            "spec": {"selector": {"matchLabels": dict(selector)},
                     "namespaceSelector": {"matchNames": list(namespaces)}, key: endpoints}}


NODE_RELABEL = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]


@dataclass(frozen=True)
class ScrapeTarget:
    """A platform component scraped through a ServiceMonitor in its own namespace."""

    name: str
    namespace: str
    selector: dict[str, str]
    port: str
    interval: str = "30s"
    scheme: str = "http"


def dcgm_exporter_target(gpu_namespace: str, *, gpu_operator: bool) -> ScrapeTarget:
    """The DCGM exporter's Service differs by GPU enablement mode."""
    if gpu_operator:
        # NVIDIA/gpu-operator v25.3.0 assets/state-dcgm-exporter/0600_service.yaml: Service
        # nvidia-dcgm-exporter in the operator's namespace, labels app=nvidia-dcgm-exporter, port
        # "gpu-metrics" (9400) (aws-readiness-4 R3: the standalone labels matched nothing there).
        return ScrapeTarget("dcgm-exporter", gpu_namespace, {"app": "nvidia-dcgm-exporter"}, "gpu-metrics", "15s")
    # dcgm-exporter chart 4.1.1: Service port "metrics" (9400), selector labels
    # app.kubernetes.io/name=dcgm-exporter (deployment/templates/service.yaml, _helpers.tpl).
    return ScrapeTarget("dcgm-exporter", gpu_namespace, {"app.kubernetes.io/name": "dcgm-exporter"}, "metrics", "15s")


def platform_scrape_targets(*, gpu_namespace: str, karpenter_namespace: str, kueue_namespace: str,
                            training_operator_namespace: str, gpu_operator: bool = False) -> list[ScrapeTarget]:
    """Services the charts create (selector labels from each chart's templates at its pinned version).
    ``gpu_operator``: GPU enablement mode gpu-operator (its own DCGM exporter Service)."""
    return [
        dcgm_exporter_target(gpu_namespace, gpu_operator=gpu_operator),
        # Karpenter chart 1.14.1: Service "karpenter", port "http-metrics" (8080).
        ScrapeTarget("karpenter", karpenter_namespace, {"app.kubernetes.io/name": "karpenter"}, "http-metrics"),
        # Kueue chart 0.19.2: Service <fullname>-controller-manager-metrics-service, port "https"
        # (8443), labels kueue.metricsService.labels (charts/kueue/templates/_helpers.tpl); the
        # controller's self-signed certificate and an authorized bearer token (the chart's
        # metrics-reader role is nonResourceURL /metrics, which kube-prometheus-stack's Prometheus
        # ClusterRole already grants).
        ScrapeTarget("kueue", kueue_namespace,
                     {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/component": "metrics-service"},
                     "https", scheme="https"),
        # Training Operator v1.9.4 (kubeflow/trainer at the pinned commit, manifests/base/service.yaml):
        # Service "training-operator" labelled app=training-operator (control-plane=... is its
        # *pod* selector, which a ServiceMonitor does not match), port "monitoring-port" 8080 ->
        # the manager's --metrics-bind-address default ":8080" (cmd/training-operator.v1/main.go).
        ScrapeTarget("training-operator", training_operator_namespace,
                     dict(TRAINING_OPERATOR_SERVICE_LABELS), TRAINING_OPERATOR_METRICS_PORT_NAME),
    ]


def service_monitor(target: ScrapeTarget) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"port": target.port, "interval": target.interval, "relabelings": NODE_RELABEL}
    if target.scheme == "https":
        endpoint.update({"scheme": "https", "tlsConfig": {"insecureSkipVerify": True},
                         "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"})
    return _monitor("ServiceMonitor", target.name, NAMESPACE, target.selector, [endpoint], [target.namespace])


# A team's pods are scraped by the shared Prometheus: a team (its own code, or bare pods carrying
# the label) must not be able to flood it with series (security-4 N12). The trainer's health
# endpoint serves about a dozen series from rank 0; a scrape over a limit fails whole (the target
# goes down and its samples are dropped), so an attacker only blinds its own team's dashboards.
# PodMonitor spec fields (prometheus-operator v0.93.1 monitoring.coreos.com/v1 PodMonitorSpec:
# sampleLimit, targetLimit, labelLimit, labelNameLengthLimit, labelValueLengthLimit). Teams cannot
# create monitors of their own (no monitoring.coreos.com rights in workloads/tenancy.py), so the
# limits sit on the platform's monitors and no global enforcedSampleLimit caps the platform's
# own exporters (kube-state-metrics serves far more per scrape).
TEAM_SCRAPE_LIMITS: dict[str, int] = {
    "sampleLimit": 500, "targetLimit": 100, "labelLimit": 30, "labelNameLengthLimit": 128, "labelValueLengthLimit": 512,
}


def trainer_pod_monitor(namespace: str) -> dict[str, Any]:
    """The trainer's rank-0 health endpoint (trainer/health.py) in one team namespace.

    Only rank 0 listens; other ranks' pods have no such port and are not scraped. The label
    ``mlplatform.io/trainer-metrics: "true"`` is set by the job template.
    """
    monitor = _monitor("PodMonitor", "trainer-health", namespace, {TRAINER_METRICS_LABEL: "true"},
                       [{"port": TRAINER_METRICS_PORT_NAME, "interval": "30s", "relabelings": NODE_RELABEL}],
                       [namespace])
    monitor["spec"].update(TEAM_SCRAPE_LIMITS)
    return monitor


def trainjob_pod_monitor(namespace: str) -> dict[str, Any]:
    """Rank 0 of a TrainJob (node index 0) in one team namespace, port set by relabeling."""
    monitor = _monitor("PodMonitor", "trainer-health-trainjob", namespace,
                       {TRAINER_METRICS_LABEL: TRAINJOB_METRICS_LABEL_VALUE, JOB_COMPLETION_INDEX_LABEL: "0"},
                       [{"interval": "30s", "path": "/metrics", "relabelings": [
                           {"sourceLabels": ["__meta_kubernetes_pod_container_name"], "regex": TRAINJOB_CONTAINER_NAME,
                            "action": "keep"},
                           {"sourceLabels": ["__meta_kubernetes_pod_ip"], "regex": "(.+)",
                            "targetLabel": "__address__", "replacement": f"$1:{TRAINER_METRICS_PORT}", "action": "replace"},
                           *NODE_RELABEL]}],
                       [namespace])
    monitor["spec"].update(TEAM_SCRAPE_LIMITS)
    return monitor


def trainer_scrape_policy(namespace: str) -> dict[str, Any]:
    """Team namespaces deny ingress by default: admit Prometheus to rank 0's health port only."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-prometheus-trainer-health", "namespace": namespace},
            "spec": {"podSelector": {"matchExpressions": [{"key": TRAINER_METRICS_LABEL, "operator": "In",
                                                           "values": ["true", TRAINJOB_METRICS_LABEL_VALUE]}]},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                                  "ports": [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}]}]}}


def prometheus_rule(name: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(SELECTOR_LABEL)},
            "spec": {"groups": groups}}
