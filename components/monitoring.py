"""The metrics stack: Prometheus Operator CRDs first, then kube-prometheus-stack on the system
nodes, then the platform's scrape objects, alerts and dashboards (all after the CRDs release).

Alertmanager publishes to an SNS topic with SigV4 credentials from EKS Pod Identity; with
``managed`` Prometheus also remote-writes to Amazon Managed Service for Prometheus (AMP) and an
Amazon Managed Grafana workspace reads it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.helm_addon import helm_addon, system_ready
from components.gpu_idle_alarm import email_suffix
from components.names import IAM_ROLE_NAME_MAX, fitted_name
from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from workloads.problems import accepts_enum_values
from components.charts import ChartSource
from catalog.versions import KUBE_PROMETHEUS_STACK, PROMETHEUS_OPERATOR_CRDS
from workloads.monitoring import alerts, dashboards, stack
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

POD_SECURITY_REASON = ("node-exporter (a DaemonSet of the chart) reads the host's /proc, /sys and root file "
                       "system through hostPath with hostNetwork and hostPID; baseline forbids all three")


@accepts_enum_values
@dataclass(frozen=True)
class MonitoringArgs:
    """cluster: the platform cluster. region: for SigV4 (SNS, AMP).
    stack_spec: retention, volume, replicas (workloads.monitoring.stack.StackSpec without the
        AWS-derived fields, which this component fills in).
    thresholds: the alerts' thresholds.
    sns_topic: where Alertmanager publishes (with its KMS key); None keeps alerts in its UI.
    managed: AMP workspace + remote write, and a Managed Grafana workspace.
    team_namespaces: a trainer PodMonitor in each.
    trainjob_monitors: also a TrainJob PodMonitor in each (only where Kubeflow Trainer v2 runs:
        without it no TrainJob pod exists, and the monitor would select nothing).
    component_namespaces: where the scraped controllers run (gpu, karpenter, kueue, training).
    gpu_operator: the GPU Operator runs the DCGM exporter (GPU enablement mode gpu-operator), not
        the standalone chart: its Service has other labels and another port name.
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    heartbeat_topic: where Alertmanager sends its Watchdog (the dead man's switch's topic, encrypted
        with ``sns_topic_key``); None routes Watchdog nowhere.
    team_alert_emails: team namespace -> who gets that team's alerts: a topic per team (encrypted
        with ``sns_topic_key``) with those e-mail subscriptions, and an Alertmanager route to it.
    """

    cluster: Cluster
    region: str
    stack_spec: stack.StackSpec
    thresholds: alerts.AlertThresholds = field(default_factory=alerts.AlertThresholds)
    sns_topic: Optional[aws.sns.Topic] = None
    sns_topic_key: Optional[aws.kms.Key] = None
    managed: bool = False
    team_namespaces: Sequence[str] = ()
    trainjob_monitors: bool = False
    component_namespaces: Mapping[str, str] = field(default_factory=dict)
    gpu_operator: bool = False
    heartbeat_topic: Optional[aws.sns.Topic] = None
    team_alert_emails: Mapping[str, Sequence[str]] = field(default_factory=dict)
    depends_on: Sequence[pulumi.Resource] = ()  # what creates the team namespaces
    tags: Mapping[str, str] = field(default_factory=dict)
    charts: ChartSource = ChartSource()

    def __post_init__(self) -> None:
        missing = {"gpu", "karpenter", "kueue", "training_operator"} - set(self.component_namespaces)
        if missing:
            raise ValueError(f"MonitoringArgs.component_namespaces: missing {sorted(missing)}; name the namespace "
                             "of each scraped controller")
        if (self.sns_topic is None) != (self.sns_topic_key is None):
            raise ValueError("MonitoringArgs.sns_topic_key: give the topic's KMS key with the topic (Alertmanager "
                             "must encrypt with it), or neither")
        if (self.team_alert_emails or self.heartbeat_topic is not None) and self.sns_topic is None:
            raise ValueError("MonitoringArgs.team_alert_emails / heartbeat_topic: Alertmanager publishes to SNS only "
                             "with sns_topic and its key; give them, or route nothing")
        unknown = sorted(set(self.team_alert_emails) - set(self.team_namespaces))
        if unknown:
            raise ValueError(f"MonitoringArgs.team_alert_emails: {unknown} are not among team_namespaces")


def namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    return SystemNamespaceSpec(
        name=stack.NAMESPACE, pod_security=PodSecurityLevel.PRIVILEGED, pod_security_reason=POD_SECURITY_REASON,
        vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        api_server_ingress_ports=(stack.OPERATOR_WEBHOOK_PORT,),
        metrics_ports=(stack.PROMETHEUS_PORT, stack.ALERTMANAGER_PORT, stack.GRAFANA_PORT,
                       stack.KUBE_STATE_METRICS_PORT, stack.NODE_EXPORTER_PORT),
        uses_aws=True, same_namespace=True,
    )


def scrape_egress_policy(vpc_cidr: str) -> dict[str, Any]:
    """Prometheus scrapes pods and nodes anywhere in the VPC, on whatever port each exposes."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-prometheus-scrapes", "namespace": stack.NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                     "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": vpc_cidr}}]}]}}


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:monitoring:Monitoring", name, None, opts)
        tags = dict(args.tags)
        ready = self._namespace(name, args.cluster)
        # CRDs first, as their own release so Helm upgrades them (a chart's crds/ never upgrade).
        self.crds = helm_addon(
            f"{name}-prometheus-operator-crds", parent=self, cluster=args.cluster, release="prometheus-operator-crds",
            chart=PROMETHEUS_OPERATOR_CRDS, source=args.charts, namespace=stack.NAMESPACE, values={}, depends_on=ready)
        identities: list[pulumi.Resource] = []
        remote_write = None
        self.amp_workspace: Optional[aws.amp.Workspace] = None
        self.grafana_workspace: Optional[aws.grafana.Workspace] = None
        self.team_topics: dict[str, aws.sns.Topic] = {}
        if args.sns_topic is not None and args.sns_topic_key is not None:
            self.team_topics = self._team_topics(name, args.team_alert_emails, args.sns_topic_key, tags)
            identities.append(self._alertmanager_identity(name, args, args.sns_topic, args.sns_topic_key, tags))
        if args.managed:
            remote_write, writer = self._managed_prometheus(name, args, tags)
            identities.append(writer)
            self.grafana_workspace = self._managed_grafana(name, self.amp_workspace, tags)
        self.release = self._kube_prometheus_stack(name, args, remote_write, depends_on=[*ready, self.crds, *identities])
        self._scrape_objects(name, args)
        self.register_outputs({"release_status": self.release.status,
                               "amp_workspace": self.amp_workspace.id if self.amp_workspace else None})

    def _namespace(self, name: str, cluster: Cluster) -> list[pulumi.Resource]:
        """The namespace with its network policies (Prometheus's scrapes included); what the
        releases wait for."""
        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        self.network_policies.append(
            apply_object(f"{name}-netpol-scrapes", scrape_egress_policy(cluster.vpc_cidr), in_namespace))
        return [self.namespace, *self.network_policies, *system_ready(cluster)]

    def _team_topics(self, name: str, team_alert_emails: Mapping[str, Sequence[str]], key: aws.kms.Key,
                     tags: dict) -> dict[str, aws.sns.Topic]:
        """A team's own alerts (its jobs') go to the team: a topic per team, its e-mails subscribed."""
        topics = {}
        for namespace, emails in sorted(team_alert_emails.items()):
            topic = aws.sns.Topic(f"{name}-{namespace}-alerts", name=fitted_name(f"{name}-{namespace}-alerts", 256),
                                  kms_master_key_id=key.arn, tags=tags, opts=pulumi.ResourceOptions(parent=self))
            for email in emails:
                aws.sns.TopicSubscription(f"{name}-{namespace}-alerts-{email_suffix(email)}", topic=topic.arn,
                                          protocol="email", endpoint=email, opts=pulumi.ResourceOptions(parent=topic))
            topics[namespace] = topic
        return topics

    def _alertmanager_identity(self, name: str, args: MonitoringArgs, topic: aws.sns.Topic, key: aws.kms.Key,
                               tags: dict) -> pulumi.Resource:
        """Alertmanager may publish to the platform's, the teams' and the heartbeat topics."""
        published = [topic.arn, *(t.arn for t in self.team_topics.values()),
                     *([args.heartbeat_topic.arn] if args.heartbeat_topic is not None else [])]
        publish = pulumi.Output.json_dumps({
            "Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "sns:Publish",
                 "Resource": published[0] if len(published) == 1 else published},
                # An encrypted topic needs the publisher to use its key (SNS developer guide, SSE).
                {"Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"], "Resource": key.arn},
            ]})
        return args.cluster.pod_identity(
            f"{name}-alertmanager", namespace=stack.NAMESPACE, service_account=stack.ALERTMANAGER_SERVICE_ACCOUNT,
            parent=self, tags=tags, policies={"publish": publish}).association

    def _managed_prometheus(self, name: str, args: MonitoringArgs,
                            tags: dict) -> tuple[stack.RemoteWriteSpec, pulumi.Resource]:
        """An AMP workspace and Prometheus's identity to remote-write to it."""
        self.amp_workspace = aws.amp.Workspace(f"{name}-amp", alias=f"{name}", tags=tags,
                                               opts=pulumi.ResourceOptions(parent=self))
        remote_write_policy = pulumi.Output.json_dumps({
            "Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "aps:RemoteWrite", "Resource": self.amp_workspace.arn}]})
        writer = args.cluster.pod_identity(
            f"{name}-prometheus", namespace=stack.NAMESPACE, service_account=stack.PROMETHEUS_SERVICE_ACCOUNT,
            parent=self, tags=tags, policies={"remote-write": remote_write_policy})
        # AMP remote-write endpoint: <workspace prometheusEndpoint>api/v1/remote_write (AMP user guide).
        remote_write = stack.RemoteWriteSpec(
            url=pulumi.Output.concat(self.amp_workspace.prometheus_endpoint, "api/v1/remote_write"),
            region=args.region)
        return remote_write, writer.association

    def _managed_grafana(self, name: str, amp_workspace: aws.amp.Workspace, tags: dict) -> aws.grafana.Workspace:
        """A Managed Grafana workspace whose service role may query the AMP workspace."""
        grafana_role = aws.iam.Role(
            f"{name}-grafana-role", name=fitted_name(f"{name}-grafana-role", IAM_ROLE_NAME_MAX), tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "grafana.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
        aws.iam.RolePolicy(f"{name}-grafana-query", role=grafana_role.id, policy=pulumi.Output.json_dumps({
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Resource": amp_workspace.arn,
                "Action": ["aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata"]}]}),
            opts=pulumi.ResourceOptions(parent=grafana_role))
        return aws.grafana.Workspace(
            f"{name}-grafana", account_access_type="CURRENT_ACCOUNT", authentication_providers=["AWS_SSO"],
            permission_type="SERVICE_MANAGED", data_sources=["PROMETHEUS"], role_arn=grafana_role.arn, tags=tags,
            opts=pulumi.ResourceOptions(parent=self))

    def _kube_prometheus_stack(self, name: str, args: MonitoringArgs, remote_write: Optional[stack.RemoteWriteSpec],
                               depends_on: list[pulumi.Resource]) -> pulumi.Resource:
        """The kube-prometheus-stack release, its spec completed with the AWS-derived fields."""
        spec = stack.StackSpec(**{**args.stack_spec.__dict__,
                                  "sns_topic_arn": args.sns_topic.arn if args.sns_topic is not None else None,
                                  "heartbeat_topic_arn": args.heartbeat_topic.arn if args.heartbeat_topic is not None else None,
                                  "team_topic_arns": {ns: t.arn for ns, t in self.team_topics.items()},
                                  "remote_write": remote_write, "region": args.region})
        return helm_addon(
            f"{name}-kube-prometheus-stack", parent=self, cluster=args.cluster, release=stack.RELEASE,
            chart=KUBE_PROMETHEUS_STACK, source=args.charts,
            namespace=stack.NAMESPACE, values=stack.helm_values(spec), timeout_seconds=900,
            # Every object with a ServiceMonitor/PodMonitor/PrometheusRule kind needs the CRDs release.
            depends_on=depends_on)

    def _scrape_objects(self, name: str, args: MonitoringArgs) -> None:
        """The platform's monitors, alert rules, control-plane RBAC and dashboards."""
        after_crds = pulumi.ResourceOptions(parent=self, depends_on=[self.crds, self.namespace])
        ns = args.component_namespaces
        self.monitors = [apply_object(f"{name}-servicemonitor-{t.name}", stack.service_monitor(t), after_crds)
                         for t in stack.platform_scrape_targets(
                             gpu_namespace=ns["gpu"], karpenter_namespace=ns["karpenter"], kueue_namespace=ns["kueue"],
                             training_operator_namespace=ns["training_operator"], gpu_operator=args.gpu_operator)]
        # Team namespaces come from the scheduling component (``depends_on``).
        in_teams = pulumi.ResourceOptions(parent=self, depends_on=[self.crds, *args.depends_on])
        self.monitors += [apply_object(f"{name}-podmonitor-{team_ns}", stack.trainer_pod_monitor(team_ns), in_teams)
                          for team_ns in args.team_namespaces]
        self.monitors += [apply_object(f"{name}-podmonitor-{team_ns}-trainjob", stack.trainjob_pod_monitor(team_ns), in_teams)
                          for team_ns in args.team_namespaces if args.trainjob_monitors]
        self.team_policies = [apply_object(f"{name}-netpol-{team_ns}-trainer-health", stack.trainer_scrape_policy(team_ns),
                                           pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)))
                              for team_ns in args.team_namespaces]
        self.rules = apply_object(f"{name}-rules", stack.prometheus_rule("mlplatform-alerts",
                                                                          alerts.rule_groups(args.thresholds)), after_crds)
        self.rbac = [apply_object(f"{name}-{obj['kind'].lower()}-eks-control-plane", obj,
                                  pulumi.ResourceOptions(parent=self))
                     for obj in stack.eks_control_plane_rbac()]
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        self.dashboards = [apply_object(f"{name}-{cm['metadata']['name']}", cm, in_namespace)
                           for cm in dashboards.config_maps(stack.NAMESPACE, stack.DASHBOARD_LABEL)]
