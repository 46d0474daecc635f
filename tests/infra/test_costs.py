"""The idle cost report: every line priced from the table with its source, counted from the graph."""
from __future__ import annotations

import datetime as dt

import pytest

from catalog.versions import EKS_VERSIONS
from infra.plan import cost_report as report, idle_costs
from catalog.prices import HOURS_PER_MONTH, STACK_PRICES


def _line(lines, prefix):
    return next(line for line in lines if line.item.startswith(prefix))


def test_every_line_names_its_unit_price_source_and_date(plan):
    lines = idle_costs(plan.recording)
    assert lines
    for line in lines:
        assert line.source.startswith("https://aws.amazon.com/") and "2026" in line.source
        assert line.usd_per_month == pytest.approx(line.quantity * line.usd_per_unit * (
            HOURS_PER_MONTH if "hour" in line.unit else 1))
    text = report(plan.config, plan.recording)
    total = next(t for t in text if "TOTAL idle" in t)
    assert float(total.split()[0].replace(",", "")) == pytest.approx(sum(line.usd_per_month for line in lines), abs=0.01)


def test_network_lines_count_what_the_graph_creates(plan):
    recording = plan.recording
    lines = idle_costs(recording)
    nat = len(recording.by_type("aws:ec2/natGateway:NatGateway"))
    assert _line(lines, "NAT gateways").quantity == nat
    interface = [e for e in recording.by_type("aws:ec2/vpcEndpoint:VpcEndpoint") if e.inputs["vpcEndpointType"] == "Interface"]
    if interface:
        assert _line(lines, "interface endpoints").quantity == sum(len(e.inputs["subnetIds"]) for e in interface)
    for fs in recording.by_type("aws:fsx/lustreFileSystem:LustreFileSystem"):
        fsx = _line(lines, "FSx for Lustre")
        tier = STACK_PRICES[f"fsx_lustre_p2_{fs.inputs['perUnitStorageThroughput']}_gb_month"]
        assert fsx.usd_per_month == pytest.approx(fs.inputs["storageCapacity"] * tier.usd)
    # Exactly one shared file system per stack: FSx (prod) or EFS (dev's s3-mountpoint mode).
    assert len(recording.by_type("aws:fsx/lustreFileSystem:LustreFileSystem")) + len(
        recording.by_type("aws:efs/fileSystem:FileSystem")) == 1


def test_removing_the_nat_gateway_removes_its_cost(plan_config):
    from tests.conftest import stack_config

    raw = stack_config("dev")
    raw["network"]["nat"] = "none"
    raw["network"]["interfaceEndpoints"] = True
    lines = idle_costs(plan_config("dev", raw).recording)
    assert not any(line.item.startswith("NAT") for line in lines)


def test_the_control_plane_is_priced_by_its_support_window(dev_plan):
    version = dev_plan.recording.by_type("eks:index:Cluster")[0].inputs["version"]
    ends = EKS_VERSIONS[version].standard_support_ends
    before = _line(idle_costs(dev_plan.recording, today=ends - dt.timedelta(days=1)), "EKS control plane")
    after = _line(idle_costs(dev_plan.recording, today=ends + dt.timedelta(days=1)), "EKS control plane")
    assert before.usd_per_unit == STACK_PRICES["eks_standard_hour"].usd
    assert after.usd_per_unit == STACK_PRICES["eks_extended_hour"].usd
    # AWS: extended support is billed "from the beginning of the day" standard support ends.
    on_the_day = _line(idle_costs(dev_plan.recording, today=ends), "EKS control plane")
    assert on_the_day.usd_per_unit == STACK_PRICES["eks_extended_hour"].usd


def test_dev_report_states_the_goal_and_gpu_pools_are_rates(dev_plan):
    text = report(dev_plan.config, dev_plan.recording)
    assert any(t.startswith("dev goal: <= $287/month") for t in text)
    pools = [t for t in text if t.startswith("GPU pool")]
    assert {p.split(":")[0] for p in pools} == {f"GPU pool {pool.name}" for pool in dev_plan.config.gpu_pools}
    assert all("/node-hour on-demand" in p and "spot (estimate)" in p for p in pools)


def test_dev_idle_total_meets_the_goal_with_every_capability_on(dev_plan):
    """Issue 21 item 8: dev idles at <= $287/month without the control-plane fee, every capability on."""
    from infra.costs import DEV_IDLE_GOAL_USD_PER_MONTH

    lines = idle_costs(dev_plan.recording)
    without_fee = sum(line.usd_per_month for line in lines if not line.item.startswith("EKS control plane"))
    assert without_fee <= DEV_IDLE_GOAL_USD_PER_MONTH == 287.0
    text = report(dev_plan.config, dev_plan.recording)
    assert any(t.startswith("dev goal: <= $287/month without the control-plane fee: within") for t in text)
    # Every capability still deploys in dev (the saving is the storage mode, not a switched-off feature).
    for section in ("datasets", "tracking", "monitoring", "gitops", "scheduling", "gpu_enablement"):
        assert getattr(dev_plan.config, section, None) is not None, section


@pytest.mark.parametrize("prefix, key", [
    ("Secrets Manager secrets", "secret_month"),
    ("Route 53 hosted zones", "route53_hosted_zone_month"),
    ("CloudWatch Logs ingestion: EKS control-plane logs", "cloudwatch_logs_ingest_gb"),
    ("CloudWatch Logs ingestion:", "cloudwatch_logs_ingest_gb"),
    ("Container Insights (enhanced observability)", "container_insights_observations_million"),
    ("Prometheus volumes", "ebs_gp3_gb_month"),
    ("container logs ingestion", "cloudwatch_logs_ingest_gb"),
])
def test_the_report_prices_what_it_used_to_miss(plan, prefix, key):
    """The RDS-managed secret, the Route 53 zone, CloudWatch Logs ingestion and Container Insights
    are priced lines (no UNPRICED 0 line, no borrowed price key)."""
    line = _line(idle_costs(plan.recording), prefix)
    assert line.unit_price is STACK_PRICES[key]
    assert line.usd_per_month > 0
    assert not [x for x in idle_costs(plan.recording) if "UNPRICED" in x.item]
    rds_managed = sum(1 for db in plan.recording.by_type("aws:rds/cluster:Cluster") if db.inputs.get("manageMasterUserPassword"))
    secrets = _line(idle_costs(plan.recording), "Secrets Manager secrets")
    assert secrets.quantity == len(plan.recording.by_type("aws:secretsmanager/secret:Secret")) + rds_managed


def test_dev_stores_on_efs_and_pays_for_no_file_system_hour(dev_plan):
    lines = idle_costs(dev_plan.recording)
    assert not [line for line in lines if line.item.startswith("FSx")]
    efs = _line(lines, "EFS ")
    assert efs.unit_price is STACK_PRICES["efs_standard_gb_month"]
