"""What a stack costs idle, per month, line by line, from the recorded graph and one price table.

"Idle" is the platform with no training job running: the control plane, the static nodes, the
network, MLflow, the file system. GPU pools scale to zero, so they appear as a rate per node-hour
(on-demand and the spot estimate) instead. Every line names its unit price, the price's source and
its date (``catalog/prices.py``). The offline plan prints the report for every stack.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterator, Union

from catalog.versions import EKS_VERSIONS
from infra.config import PlatformConfig
from infra.recording import Recording
from catalog.prices import HOURS_PER_MONTH, SPOT_DISCOUNT, STACK_PRICES, InstancePrice, UnitPrice, price

# Stated assumptions of an idle month (traffic that happens with no job running).
IDLE_NAT_GB_PER_MONTH = 20  # image pulls of restarted controllers, OS updates, API calls
IDLE_AURORA_STORAGE_GB = 1  # MLflow's metadata tables with a few hundred runs
IDLE_EFS_GB = 10  # a few small checkpoints kept in the teams' EFS subtrees (storage mode s3-mountpoint)
# All five control-plane log types of a small idle cluster; the audit log dominates (controllers'
# watches and leases). An assumption to check against the first month's bill.
IDLE_CONTROL_PLANE_LOG_GB = 30
IDLE_OTHER_LOG_GB = 1  # MLflow, the rotation function, FSx events: a few MB a day
# Container Insights (enhanced) samples each entity every 60 s: 2 system nodes (~100 metrics each),
# ~50 pods (~40 each) and ~70 containers (~15 each) with no job running, ~3,250 a minute.
IDLE_CONTAINER_INSIGHTS_OBSERVATIONS_PER_MINUTE = 3_250

# The operations issue's target for dev, with the control-plane fee set aside.
DEV_IDLE_GOAL_USD_PER_MONTH = 287.0


@dataclass(frozen=True)
class CostLine:
    item: str
    quantity: float
    unit_price: Union[UnitPrice, InstancePrice]
    usd_per_month: float

    @property
    def unit(self) -> str:
        if isinstance(self.unit_price, UnitPrice):
            return self.unit_price.unit
        return f"{self.unit_price.instance_type} instance-hour"

    @property
    def usd_per_unit(self) -> float:
        if isinstance(self.unit_price, UnitPrice):
            return self.unit_price.usd
        return self.unit_price.on_demand_usd_per_hour

    @property
    def source(self) -> str:
        return f"{self.unit_price.source} ({self.unit_price.as_of})"


def _hourly(item: str, count: float, key: str) -> CostLine:
    unit = STACK_PRICES[key]
    return CostLine(item, count, unit, count * unit.usd * HOURS_PER_MONTH)


def _monthly(item: str, count: float, key: str) -> CostLine:
    unit = STACK_PRICES[key]
    return CostLine(item, count, unit, count * unit.usd)


def eks_control_plane(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    for cluster in recording.by_type("eks:index:Cluster"):
        version = str(cluster.inputs.get("version") or "")
        support = EKS_VERSIONS.get(version)
        # Billed "from the beginning of the day" standard support ends (AWS EKS pricing): `>=`.
        extended = support is not None and today >= support.standard_support_ends
        key = "eks_extended_hour" if extended else "eks_standard_hour"
        yield _hourly(f"EKS control plane {version} ({'extended' if extended else 'standard'} support)", 1, key)


def static_nodes(recording: Recording) -> Iterator[CostLine]:
    templates = {t.urn: t for t in recording.by_type("aws:ec2/launchTemplate:LaunchTemplate")}
    for group in recording.by_type("aws:eks/nodeGroup:NodeGroup"):
        desired = int(group.inputs["scalingConfig"]["desiredSize"])
        instance = price(group.inputs["instanceTypes"][0])
        if group.inputs.get("capacityType") == "SPOT":
            # The project's spot assumption (catalog/prices.py SPOT_DISCOUNT), not a quote.
            spot = UnitPrice(instance.spot_usd_per_hour, f"{instance.instance_type} spot instance-hour (estimate: "
                             f"on-demand ${instance.on_demand_usd_per_hour:g} less {SPOT_DISCOUNT:.0%})",
                             "https://aws.amazon.com/ec2/spot/pricing/")
            yield CostLine(f"static nodes {group.name}: {desired} x {instance.instance_type} spot", desired, spot,
                           desired * spot.usd * HOURS_PER_MONTH)
        else:
            yield CostLine(f"static nodes {group.name}: {desired} x {instance.instance_type}", desired, instance,
                           desired * instance.on_demand_usd_per_hour * HOURS_PER_MONTH)
        for template in (templates[u] for u in group.dependencies if u in templates):
            disk_gib = sum(int(m["ebs"]["volumeSize"]) for m in template.inputs.get("blockDeviceMappings") or [])
            yield _monthly(f"root volumes {group.name}: {desired} x {disk_gib} GiB gp3", desired * disk_gib, "ebs_gp3_gb_month")


def network(recording: Recording) -> Iterator[CostLine]:
    nat = len(recording.by_type("aws:ec2/natGateway:NatGateway"))
    if nat:
        yield _hourly(f"NAT gateways ({nat})", nat, "nat_gateway_hour")
        yield _monthly(f"NAT processing, {IDLE_NAT_GB_PER_MONTH} GB assumed idle", IDLE_NAT_GB_PER_MONTH, "nat_gateway_gb")
    enis = sum(len(e.inputs.get("subnetIds") or []) for e in recording.by_type("aws:ec2/vpcEndpoint:VpcEndpoint")
               if e.inputs.get("vpcEndpointType") == "Interface")
    if enis:
        yield _hourly(f"interface endpoints ({enis} ENIs: endpoints x AZs)", enis, "interface_endpoint_hour")
    # An internet-facing ALB holds one public IPv4 address per subnet (AZ).
    public_ips = len(recording.by_type("aws:ec2/eip:Eip")) + sum(
        len(lb.inputs.get("subnets") or []) for lb in recording.by_type("aws:lb/loadBalancer:LoadBalancer")
        if not lb.inputs.get("internal"))
    if public_ips:
        yield _hourly(f"public IPv4 addresses ({public_ips})", public_ips, "public_ipv4_hour")
    albs = [lb for lb in recording.by_type("aws:lb/loadBalancer:LoadBalancer") if lb.inputs.get("loadBalancerType") == "application"]
    if albs:
        # LCUs at idle are a small fraction of one: not counted.
        yield _hourly(f"application load balancers ({len(albs)})", len(albs), "alb_hour")


def tracking(recording: Recording) -> Iterator[CostLine]:
    for db in recording.by_type("aws:rds/cluster:Cluster"):
        scaling = db.inputs.get("serverlessv2ScalingConfiguration") or {}
        instances = sum(1 for i in recording.by_type("aws:rds/clusterInstance:ClusterInstance") if db.urn in i.dependencies)
        min_acu = float(scaling.get("minCapacity") or 0)
        note = " (auto-pauses: 0 while idle)" if min_acu == 0 else ""
        yield _hourly(f"Aurora Serverless v2 {db.name}: {instances} x {min_acu:g} ACU minimum{note}",
                      instances * min_acu, "aurora_serverless_v2_acu_hour")
        yield _monthly(f"Aurora storage, {IDLE_AURORA_STORAGE_GB} GB assumed", IDLE_AURORA_STORAGE_GB, "aurora_storage_gb_month")
    tasks = {t.urn: t for t in recording.by_type("aws:ecs/taskDefinition:TaskDefinition")}
    for service in recording.by_type("aws:ecs/service:Service"):
        count = int(service.inputs.get("desiredCount") or 0)
        for task in (tasks[u] for u in service.dependencies if u in tasks):
            vcpu, gib = int(task.inputs["cpu"]) / 1024, int(task.inputs["memory"]) / 1024
            yield _hourly(f"Fargate {service.name}: {count} x {vcpu:g} vCPU", count * vcpu, "fargate_vcpu_hour")
            yield _hourly(f"Fargate {service.name}: {count} x {gib:g} GB", count * gib, "fargate_gb_hour")


def file_systems(recording: Recording) -> Iterator[CostLine]:
    for fs in recording.by_type("aws:fsx/lustreFileSystem:LustreFileSystem"):
        capacity, tier = int(fs.inputs["storageCapacity"]), int(fs.inputs["perUnitStorageThroughput"])
        yield _monthly(f"FSx for Lustre {fs.name}: {capacity} GiB PERSISTENT_2 at {tier} MB/s/TiB", capacity,
                       f"fsx_lustre_p2_{tier}_gb_month")
    for fs in recording.by_type("aws:efs/fileSystem:FileSystem"):
        # Billed for what is stored (elastic throughput: per GB moved, none while idle).
        yield _monthly(f"EFS {fs.name} (team subtrees): {IDLE_EFS_GB} GB of checkpoints assumed stored",
                       IDLE_EFS_GB, "efs_standard_gb_month")


def storage_and_keys(recording: Recording) -> Iterator[CostLine]:
    """Every S3 bucket, KMS key and secret of the stack, whichever capability made it."""
    buckets = len(recording.by_type("aws:s3/bucket:Bucket"))
    if buckets:
        yield _monthly(f"S3 ({buckets} buckets; grows with data, empty when new)", 0, "s3_standard_gb_month")
    keys = len(recording.by_type("aws:kms/key:Key"))
    if keys:
        yield _monthly(f"KMS keys ({keys})", keys, "kms_key_month")
    secrets = len(recording.by_type("aws:secretsmanager/secret:Secret"))
    # RDS keeps a database's master password in a Secrets Manager secret it creates itself.
    rds_managed = sum(1 for db in recording.by_type("aws:rds/cluster:Cluster") if db.inputs.get("manageMasterUserPassword"))
    if secrets or rds_managed:
        managed = f", {rds_managed} managed by RDS" if rds_managed else ""
        yield _monthly(f"Secrets Manager secrets ({secrets + rds_managed}{managed})", secrets + rds_managed, "secret_month")
    zones = len(recording.by_type("aws:route53/zone:Zone"))
    if zones:
        yield _monthly(f"Route 53 hosted zones ({zones})", zones, "route53_hosted_zone_month")


def observability(recording: Recording) -> Iterator[CostLine]:
    """What CloudWatch bills by volume, from stated idle assumptions (the account's 5 GB/month of
    free ingestion is not subtracted). The container log group is priced with the monitoring stack."""
    for cluster in recording.by_type("eks:index:Cluster"):
        types = list(cluster.inputs.get("enabledClusterLogTypes") or [])
        if types:
            yield _monthly(f"CloudWatch Logs ingestion: EKS control-plane logs ({len(types)} types), "
                           f"{IDLE_CONTROL_PLANE_LOG_GB} GB assumed idle", IDLE_CONTROL_PLANE_LOG_GB, "cloudwatch_logs_ingest_gb")
    others = [g for g in recording.by_type("aws:cloudwatch/logGroup:LogGroup")
              if not str(g.inputs.get("name", "")).endswith("/containers")
              and not str(g.inputs.get("name", "")).endswith("/cluster")
              # Enhanced observability's performance events are billed as observations, below.
              and not str(g.inputs.get("name", "")).endswith("/performance")]
    if others:
        yield _monthly(f"CloudWatch Logs ingestion: {len(others)} other log groups, "
                       f"{IDLE_OTHER_LOG_GB} GB assumed idle", IDLE_OTHER_LOG_GB, "cloudwatch_logs_ingest_gb")
    if recording.by_type("mlplatform:container_insights:ContainerInsights"):
        observations = IDLE_CONTAINER_INSIGHTS_OBSERVATIONS_PER_MINUTE * 60 * HOURS_PER_MONTH
        yield _monthly(f"Container Insights (enhanced observability): {observations / 1e6:,.0f}M observations "
                       f"({IDLE_CONTAINER_INSIGHTS_OBSERVATIONS_PER_MINUTE:,}/minute assumed idle)",
                       observations / 1e6, "container_insights_observations_million")


def alarms(recording: Recording) -> Iterator[CostLine]:
    """CloudWatch bills each standard-resolution alarm per metric it evaluates, monthly."""
    found = recording.by_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    if found:
        yield _monthly(f"CloudWatch alarms ({len(found)})", len(found), "cloudwatch_alarm_metric_month")


def gpu_pool_rates(config: PlatformConfig) -> list[str]:
    lines = []
    for pool, spec in zip(config.gpu_pools, config.gpu_pool_specs):
        # catalog/gpus.py refuses a shape without a price at import: every shape has one.
        for shape in spec.shapes:
            rate = price(shape.instance_type)
            lines.append(f"GPU pool {pool.name}: {shape.instance_type} ${rate.on_demand_usd_per_hour:,.2f}/node-hour "
                         f"on-demand, ~${rate.spot_usd_per_hour:,.2f} spot (estimate), 0 while scaled to zero")
        if pool.capacity_reservation_ids:
            # An On-Demand Capacity Reservation is billed at the on-demand rate whether or not an
            # instance runs in it (EC2 user guide, "Capacity Reservation pricing and billing").
            lines.append(f"GPU pool {pool.name}: capacity reservations {list(pool.capacity_reservation_ids)} are billed "
                         "while they exist, used or not: not in the idle total (this stack does not create them)")
    return lines


def report(config: PlatformConfig, lines: list[CostLine]) -> list[str]:
    """The cost section: ``lines`` (every capability's idle cost), the total, GPU pool rates."""
    total = sum(line.usd_per_month for line in lines)
    control_plane = sum(line.usd_per_month for line in lines if line.item.startswith("EKS control plane"))
    out = [f"{line.usd_per_month:>9,.2f} $/month  {line.item}  [{line.quantity:g} x ${line.usd_per_unit:g} per "
           f"{line.unit}; {line.source}]" for line in lines]
    out.append(f"{total:>9,.2f} $/month  TOTAL idle ({total - control_plane:,.2f} without the EKS control-plane fee)")
    if not config.is_prod:
        verdict = "within" if total - control_plane <= DEV_IDLE_GOAL_USD_PER_MONTH else "ABOVE"
        biggest = max((line for line in lines if not line.item.startswith("EKS control plane")),
                      key=lambda line: line.usd_per_month, default=None)
        out.append(f"dev goal: <= ${DEV_IDLE_GOAL_USD_PER_MONTH:,.0f}/month without the control-plane fee: {verdict}"
                   + (f"; largest line: {biggest.item} (${biggest.usd_per_month:,.2f})" if biggest else ""))
    return out + gpu_pool_rates(config)


# Stated assumptions for the managed metrics switch: a small idle platform produces about 60k
# active series scraped every 30 s (kube-prometheus-stack's defaults plus DCGM on no GPU node).
IDLE_AMP_SAMPLES_PER_SECOND = 2000
IDLE_AMP_STORAGE_GB = 10
AMG_EDITORS_ASSUMED = 1
KUBE_PROMETHEUS_STACK = "kube-prometheus-stack"
# Controllers, system pods and Fluent Bit's own records with no job running.
IDLE_CONTAINER_LOG_GB_PER_MONTH = 10


def _volume_gib(spec: dict[str, Any]) -> int:
    storage = spec["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"]
    return int(str(storage).removesuffix("Gi"))


def monitoring(recording: Recording) -> Iterator[CostLine]:
    """The metrics stack's gp3 volumes (Prometheus and Alertmanager, per replica) and, when the
    managed switch is on, AMP ingestion/storage and Managed Grafana users. Its pods run on the
    static system nodes (priced with them)."""
    for release in recording.by_type("kubernetes:helm.sh/v3:Release"):
        if release.inputs.get("chart") != KUBE_PROMETHEUS_STACK:
            continue
        values = release.inputs.get("values") or {}
        prometheus = values["prometheus"]["prometheusSpec"]
        alertmanager = values["alertmanager"]["alertmanagerSpec"]
        for what, spec in (("Prometheus", prometheus), ("Alertmanager", alertmanager)):
            replicas, gib = int(spec.get("replicas", 1)), _volume_gib(spec["storage" if what == "Alertmanager" else "storageSpec"])
            yield _monthly(f"{what} volumes: {replicas} x {gib} GiB gp3", replicas * gib, "ebs_gp3_gb_month")
    if recording.by_type("aws:amp/workspace:Workspace"):
        samples = IDLE_AMP_SAMPLES_PER_SECOND * 3600 * HOURS_PER_MONTH
        first = min(samples, 2e9)
        yield _monthly(f"AMP ingestion, first 2B samples ({IDLE_AMP_SAMPLES_PER_SECOND} samples/s assumed)",
                       first / 1e7, "amp_ingest_first_2b_10m_samples")
        if samples > first:
            yield _monthly("AMP ingestion beyond 2B samples", (samples - first) / 1e7, "amp_ingest_next_250b_10m_samples")
        yield _monthly(f"AMP storage, {IDLE_AMP_STORAGE_GB} GB assumed", IDLE_AMP_STORAGE_GB, "amp_storage_gb_month")
    groups = [g for g in recording.by_type("aws:cloudwatch/logGroup:LogGroup")
              if str(g.inputs.get("name", "")).endswith("/containers")]
    for group in groups:
        retention = int(group.inputs.get("retentionInDays") or 0)
        yield _monthly(f"container logs ingestion, {IDLE_CONTAINER_LOG_GB_PER_MONTH} GB assumed idle",
                       IDLE_CONTAINER_LOG_GB_PER_MONTH, "cloudwatch_logs_ingest_gb")
        # At steady state the group holds retention days' worth of a month's volume.
        stored = IDLE_CONTAINER_LOG_GB_PER_MONTH * min(retention, 3650) / 30
        yield _monthly(f"container logs storage ({retention} days kept)", stored, "cloudwatch_logs_storage_gb_month")
    if groups and recording.by_type("aws:kinesis/firehoseDeliveryStream:FirehoseDeliveryStream"):
        yield _monthly("container logs to the archive (Firehose)", IDLE_CONTAINER_LOG_GB_PER_MONTH, "firehose_ingest_gb")
    if recording.by_type("aws:grafana/workspace:Workspace"):
        yield _monthly(f"Managed Grafana, {AMG_EDITORS_ASSUMED} editor assumed", AMG_EDITORS_ASSUMED, "amg_editor_month")
