"""CloudWatch Container Insights (enhanced observability) for the platform cluster.

The CloudWatch agent runs as a DaemonSet on every node, GPU nodes included, and publishes
per-node metrics to the ``ContainerInsights`` namespace. The operations capability alarms on
one of them (``node_gpu_reserved_capacity``, see ``components.gpu_idle_alarm``); the rest feed
CloudWatch's Container Insights dashboards.

Installed from AWS's own Helm chart (aws-observability/helm-charts ``amazon-cloudwatch-observability``,
the chart behind the EKS add-on of the same name): its ``values.yaml`` and templates are what the
values below were checked against, which the add-on's configuration schema could not be offline.
What is switched off, and why:

- Container logs (Fluent Bit): it would create ``/aws/containerinsights/<cluster>/*`` log groups
  itself (``auto_create_group``), without a retention or a KMS key.
- Application Signals: with it the operator auto-instruments every Java/Python/.NET/Node
  workload in the cluster (``manager.applicationSignals.autoMonitor.monitorAllServices``).
- The chart's DCGM exporter and Neuron monitor: ``gpu_enablement`` already runs the DCGM exporter
  on GPU nodes, and two embedded DCGM host engines on one GPU fail to load the profiling module
  (NVIDIA/dcgm-exporter issues #7 and #61). The GPU *allocation* metrics the alarm uses come from
  the Kubernetes API, not DCGM (amazon-contributing/opentelemetry-collector-contrib
  ``awscontainerinsightreceiver/internal/stores/podstore.go``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pulumi
import pulumi_aws as aws

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects
from components.charts import ChartSource
from catalog.versions import CLOUDWATCH_OBSERVABILITY
from workloads.placement import system_node_selector, system_tolerations
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

NAMESPACE = "amazon-cloudwatch"
RELEASE = "amazon-cloudwatch-observability"
# The chart names the agent's ServiceAccount after the agent ("cloudwatch-agent.serviceAccountName"
# in its _helpers.tpl); AWS's add-on guide associates this name with the Pod Identity role.
AGENT_SERVICE_ACCOUNT = "cloudwatch-agent"
# The AWS-managed policy the Container Insights guides attach to the agent's role.
AGENT_MANAGED_POLICY = "CloudWatchAgentServerPolicy"
# The chart's operator: admission webhook (manager.ports.webhookPort) and health probes.
OPERATOR_WEBHOOK_PORT = 9443
OPERATOR_HEALTH_PORT = 8081
POD_SECURITY_REASON = (
    "node agent: the CloudWatch agent DaemonSet runs with hostNetwork and mounts the node's root "
    "filesystem, container runtime socket and /sys (hostPath) to read cgroup and kubelet stats; "
    "baseline forbids host namespaces and hostPath"
)


def performance_log_group_name(cluster_name: str) -> str:
    """Where the agent writes its performance events (embedded metric format), from which CloudWatch
    extracts the metrics: amazon-cloudwatch-agent ``awsemf_default_kubernetes.yaml``. The agent
    creates it when missing, with no retention and no key, so the platform creates it first."""
    return f"/aws/containerinsights/{cluster_name}/performance"


def namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    # The agent itself uses the host network, where NetworkPolicy does not apply; these
    # policies govern the operator, which only talks to the API server.
    return SystemNamespaceSpec(
        name=NAMESPACE, pod_security=PodSecurityLevel.PRIVILEGED, pod_security_reason=POD_SECURITY_REASON,
        vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        api_server_ingress_ports=(OPERATOR_WEBHOOK_PORT,), probe_ports=(OPERATOR_HEALTH_PORT,),
    )


def agent_config() -> dict[str, Any]:
    """The CloudWatch agent's JSON config: Container Insights with enhanced observability and
    the accelerated-compute (GPU) metrics, nothing else (no Application Signals).

    ``node_gpu_*`` metrics are only published with both flags on (amazon-cloudwatch-agent
    ``translator/translate/otel/exporter/awsemf/kubernetes.go``, getNodeMetricDeclarations).
    """
    return {"logs": {"metrics_collected": {"kubernetes": {
        "enhanced_container_insights": True,
        "accelerated_compute_metrics": True,
    }}}}


def helm_values(*, cluster_name: pulumi.Input[str], region: str) -> dict[str, Any]:
    """Values of the amazon-cloudwatch-observability chart (keys as in its values.yaml)."""
    return {
        # Container Insights names every metric's ClusterName dimension after this value.
        "clusterName": cluster_name,
        "region": region,
        "containerLogs": {"enabled": False},
        "dcgmExporter": {"enabled": False},
        "neuronMonitor": {"enabled": False},
        # An explicit agent config replaces the chart's default one, which is the only thing its
        # containerInsights.enabled / applicationSignals.enabled flags build (templates/_helpers.tpl
        # cloudwatch-agent.build-default-config): Container Insights is on and Application Signals
        # off because this config has logs.metrics_collected.kubernetes and no application_signals,
        # which also turns the operator's auto-monitor off (manager.modify-auto-monitor-config sets
        # monitorAllServices false unless an agent's config collects application_signals).
        "agent": {"config": agent_config()},
        # The operator runs on the static system nodes. The chart's root toleration
        # (operator: Exists) stays for the agent DaemonSet, which must reach tainted GPU nodes;
        # the operator's own list defaults to [] and would not tolerate the system taint.
        "manager": {
            "nodeSelector": system_node_selector(),
            "tolerations": system_tolerations(),
        },
    }


@dataclass(frozen=True)
class ContainerInsightsArgs:
    """The CloudWatch agent (Container Insights) on the platform cluster.

    cluster: the platform cluster; the release waits for its system nodes, CoreDNS and the Pod
        Identity agent.
    region: the cluster's region (the chart requires it; the agent publishes there).
    log_retention_days: retention of the performance log group.
    log_kms_key: the key of the account's log groups (it must admit
        ``performance_log_group_name(cluster name)``); None: CloudWatch Logs' own encryption.
    tags: on every AWS resource.
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    region: str
    log_retention_days: int = 30
    log_kms_key: Optional[aws.kms.Key] = None
    tags: Mapping[str, str] = field(default_factory=dict)
    charts: ChartSource = ChartSource()

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError("ContainerInsightsArgs.region: the chart needs the cluster's region, e.g. us-west-2")


class ContainerInsights(pulumi.ComponentResource):
    """The amazon-cloudwatch-observability release with its Pod Identity role and namespace."""

    def __init__(self, name: str, args: ContainerInsightsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:container_insights:ContainerInsights", name, None, opts)
        cluster = args.cluster
        tags = dict(args.tags)
        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition

        agent = cluster.pod_identity(
            f"{name}-agent", namespace=NAMESPACE, service_account=AGENT_SERVICE_ACCOUNT, parent=self, tags=tags,
            managed_policy_arns=[pulumi.Output.concat("arn:", partition, ":iam::aws:policy/", AGENT_MANAGED_POLICY)])
        self.agent_role = agent.role
        self.pod_identity = agent.association

        self.performance_logs = aws.cloudwatch.LogGroup(
            f"{name}-performance-logs", name=performance_log_group_name(cluster.args.cluster_name),
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key.arn if args.log_kms_key is not None else None, tags=tags,
            opts=pulumi.ResourceOptions(parent=self))

        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)

        self.release = helm_addon(
            f"{name}-chart", parent=self, cluster=cluster, release=RELEASE, chart=CLOUDWATCH_OBSERVABILITY,
            source=args.charts, namespace=NAMESPACE,
            values=helm_values(cluster_name=cluster.cluster_name, region=args.region),
            # The agent must start with its credentials (no node-role fallback is granted).
            depends_on=[self.namespace, *self.network_policies, self.pod_identity, self.performance_logs],
        )
        self.cluster_name = cluster.cluster_name
        self.register_outputs({"release_status": self.release.status, "agent_role_arn": self.agent_role.arn})
