"""Where Alertmanager sends each alert: a team's alerts (label ``namespace`` = its namespace) to the
team's own topic, the always-firing Watchdog to the heartbeat topic (the dead man's switch), the
rest to the platform's receiver. Checked two ways: with Alertmanager's own `amtool` (Debian's
``prometheus-alertmanager`` package; .ci/run installs it) on the rendered configuration, and on
both recorded stacks (the Helm values, the topics, who may publish).
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from workloads.monitoring import stack

AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed: `apt-get install prometheus-alertmanager` (Debian) provides it")
ARN = "arn:aws:sns:us-west-2:111122223333:"
CONFIG = stack.alertmanager_config(f"{ARN}platform", "us-west-2", heartbeat_topic_arn=f"{ARN}heartbeat",
                                   team_topic_arns={"team-research": f"{ARN}research", "team-applied": f"{ARN}applied"})


def routed_to(config_file, **labels) -> str:
    done = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={config_file}",
                           *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr  # amtool exits 1 when --verify-receivers does not match
    return done.stdout.strip()


@needs_amtool
def test_amtool_accepts_the_config_and_routes_each_alert_where_it_belongs(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(CONFIG))
    check = subprocess.run([AMTOOL, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert routed_to(path, alertname="Watchdog", severity="none") == "heartbeat"
    assert routed_to(path, alertname="TrainingJobStalled", namespace="team-research", severity="warning") == "team-research"
    assert routed_to(path, alertname="TrainingPodRestartLoop", namespace="team-applied") == "team-applied"
    # A team without a topic of its own, and the platform's alerts: the platform's receiver.
    assert routed_to(path, alertname="TrainingJobStalled", namespace="team-foundation-models") == "sns"
    assert routed_to(path, alertname="GpuXidFatal", node="ip-10-0-0-1", severity="critical") == "sns"
    # Watchdog of a team namespace still goes to the heartbeat (the first route wins).
    assert routed_to(path, alertname="Watchdog", namespace="team-research") == "heartbeat"


def test_watchdog_is_resent_often_enough_for_each_sns_metric_period():
    (watchdog,) = [r for r in CONFIG["route"]["routes"] if r["matchers"] == ['alertname="Watchdog"']]
    assert watchdog["receiver"] == "heartbeat"
    minutes = int(watchdog["repeat_interval"].rstrip("m"))
    interval = int(watchdog["group_interval"].rstrip("m"))
    # Resends happen on group_interval ticks at or after repeat_interval: at most minutes + interval apart.
    assert minutes + interval < 5, "a 5-minute SNS period could see no publish and the switch would page"
    # Without a heartbeat topic, Watchdog goes nowhere (never to a person).
    bare = stack.alertmanager_config(f"{ARN}platform", "us-west-2")
    assert [r["receiver"] for r in bare["route"]["routes"]] == ["null"]


def _values(plan) -> dict:
    (release,) = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release")
                  if r.inputs.get("chart") == "kube-prometheus-stack"]
    return release.inputs["values"]


def test_each_stack_routes_its_teams_with_alert_emails_to_their_own_topic(plan):
    config = _values(plan)["alertmanager"]["config"]
    routed = {t.namespace for t in plan.config.scheduling.teams if t.alert_emails}
    assert routed, "both stacks route at least one team (example addresses)"
    by_receiver = {r["name"]: r for r in config["receivers"]}
    topics = {t.outputs["arn"]: t for t in plan.recording.by_type("aws:sns/topic:Topic")}
    subscriptions = plan.recording.by_type("aws:sns/topicSubscription:TopicSubscription")
    for team in plan.config.scheduling.teams:
        route = [r for r in config["route"]["routes"] if r["matchers"] == [f'namespace="{team.namespace}"']]
        if not team.alert_emails:
            assert not route
            continue
        (route,) = route
        (sns,) = by_receiver[route["receiver"]]["sns_configs"]
        assert sns["topic_arn"] in topics
        assert sorted(s.inputs["endpoint"] for s in subscriptions if s.inputs["topic"] == sns["topic_arn"]) == \
            sorted(team.alert_emails)
    # Alertmanager's identity may publish to every receiver's topic.
    (publish,) = [p for p in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-alertmanager-publish")]
    statement = json.loads(publish.inputs["policy"])["Statement"][0]
    allowed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
    wanted = {c["topic_arn"] for r in config["receivers"] for c in r.get("sns_configs", [])}
    assert wanted <= set(allowed), wanted - set(allowed)


def test_team_alert_emails_without_an_alert_path_are_refused_in_one_line():
    from infra.config import ConfigError, load_platform_config
    from tests.conftest import stack_config

    raw = stack_config("dev")
    raw.pop("gpuIdleAlarm")
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (line,) = [l for l in str(info.value).splitlines() if "alertEmails" in l]
    assert "scheduling.teams[0].alertEmails" in line and "Fix: set gpuIdleAlarm, or remove alertEmails" in line
    raw = stack_config("dev")
    raw["scheduling"]["teams"][0]["alertEmails"] = ["research-at-example.com"]
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (line,) = [l for l in str(info.value).splitlines() if "alertEmails" in l]
    assert "research-at-example.com" in line and "Fix: list addresses such as research-oncall@example.com" in line
