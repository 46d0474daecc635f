"""Container logs from the attacker's seat: a member of team A, holding the role the platform gives
team A (``scheduling.teams[].roleArns``), wants team B's container logs.

CloudWatch Logs authorises ``FilterLogEvents`` on a log group (CloudWatch Logs API reference,
"Actions, resources, and condition keys": resource type ``log-group``, no per-stream condition),
so one group holding every namespace would give whoever reads their own lines everyone's. Each
team namespace has its own group; each team's roles get read on that group only. Checked on the
recorded plan of both stacks:

- the Fluent Bit configuration sends a team namespace's records to that team's group and no
  other's (Fluent Bit's rules, emulated: a ``Match`` is a whole-tag wildcard, ``rewrite_tag``
  re-emits a record whose key matches the rule's regex under the new tag, dropping the original
  when KEEP is false; ``log_group_template`` is a record accessor over the record);
- every group exists before Fluent Bit writes, with the log key and the retention;
- the identity policies attached to each team role allow reading its own group and refuse the
  other teams' and the platform's.
"""
from __future__ import annotations

import fnmatch
import json
import re
from typing import Any, Optional

import pytest

from components.container_logs import log_group_name, team_log_group_name


def _plan(request, stack: str):
    return request.getfixturevalue(f"{stack}_plan")


def _fluent_bit_values(plan) -> dict[str, Any]:
    [release] = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release")
                 if r.inputs.get("chart") == "aws-for-fluent-bit"]
    values = release.inputs["values"]
    return values if isinstance(values, dict) else json.loads(values)


def _sections(text: str) -> list[dict[str, str]]:
    """Fluent Bit's classic configuration: ``[SECTION]`` headers, then ``Key value`` lines."""
    sections: list[dict[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            sections.append({"_section": line.strip("[]")})
        elif line:
            key, _, value = line.partition(" ")
            sections[-1][key.lower()] = value.strip()
    return sections


def _accessor(template: str, record: dict[str, Any]) -> Optional[str]:
    """Fluent Bit's record accessor in a template: ``$a['b']`` replaced by the record's value,
    None when a key is missing (the output then falls back to ``log_group_name``)."""
    missing = False

    def value(match: re.Match) -> str:
        nonlocal missing
        node: Any = record.get(match["key"])
        for sub in re.findall(r"\['([^']+)'\]", match["subs"] or ""):
            node = node.get(sub) if isinstance(node, dict) else None
        if node is None:
            missing = True
            return ""
        return str(node)

    out = re.sub(r"\$(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?P<subs>(?:\['[^']+'\])*)", value, template)
    return None if missing else out


def route(values: dict[str, Any], namespace: str) -> list[str]:
    """The log groups one container line of ``namespace`` is written to, by the rendered config."""
    tag = f"kube.var.log.containers.pod-0_{namespace}_main-0123.log"
    record = {"log": "a line", "kubernetes": {"namespace_name": namespace, "pod_name": "pod-0", "container_name": "main"}}
    for rule in [s for s in _sections(values.get("additionalFilters", "")) if s.get("name") == "rewrite_tag"]:
        if not fnmatch.fnmatchcase(tag, rule["match"]):
            continue
        key, regex, new_tag, keep = rule["rule"].split(" ")
        if re.search(regex, _accessor(key, record) or ""):
            tag = new_tag.replace("$TAG", tag)
            assert keep == "false", "the original record would also go to the platform's group"
    cw = values["cloudWatchLogs"]
    outputs = [{"match": cw.get("match", "*"), "log_group_name": cw["logGroupName"],
                "log_group_template": cw.get("logGroupTemplate") or "",
                "log_stream_prefix": cw.get("logStreamPrefix", ""), "log_stream_name": cw.get("logStreamName", "")}]
    outputs += [s for s in _sections(values.get("additionalOutputs", "")) if s.get("name") == "cloudwatch_logs"]
    groups = []
    for output in outputs:
        if fnmatch.fnmatchcase(tag, output["match"]):
            template = output.get("log_group_template")
            groups.append((_accessor(template, record) if template else None) or output["log_group_name"])
    return groups


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_each_team_namespace_is_written_to_its_own_group_and_the_platform_keeps_its_own(stack, request):
    plan = _plan(request, stack)
    config = plan.config
    values = _fluent_bit_values(plan)
    platform = log_group_name(config.cluster_name)
    for namespace in config.team_namespaces:
        assert route(values, namespace) == [team_log_group_name(platform, namespace)], namespace
    for namespace in ("kube-system", "karpenter", "gpu-system", "team", "team-not-configured"):
        assert route(values, namespace) == [platform], namespace
    # Each cloudwatch_logs output can start: Fluent Bit refuses one with neither log_stream_name
    # nor log_stream_prefix (plugins/out_cloudwatch_logs/cloudwatch_logs.c cb_cloudwatch_init).
    for output in _sections(values.get("additionalOutputs", "")):
        assert output.get("log_stream_prefix") or output.get("log_stream_name"), output
        assert output["auto_create_group"] == "false"


def _identity_policies_of(plan, role_name: str) -> list[dict[str, Any]]:
    policies = {p.outputs["arn"]: p for p in plan.recording.by_type("aws:iam/policy:Policy")}
    return [json.loads(policies[a.inputs["policyArn"]].inputs["policy"])
            for a in plan.recording.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
            if a.inputs["role"] == role_name and a.inputs["policyArn"] in policies]


def _identity_allows(policies: list[dict[str, Any]], action: str, resource: str) -> bool:
    allowed = False
    for policy in policies:
        for statement in policy["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            if any(fnmatch.fnmatchcase(action, a) for a in actions) and any(fnmatch.fnmatchcase(resource, r) for r in resources):
                if statement["Effect"] == "Deny":
                    return False
                allowed = True
    return allowed


def test_a_team_role_reads_its_own_teams_logs_and_no_other_groups(prod_plan):
    plan, config = prod_plan, prod_plan.config
    groups = {r.inputs["name"]: r for r in plan.recording.by_type("aws:cloudwatch/logGroup:LogGroup")}
    platform = log_group_name(config.cluster_name)
    team_groups = {ns: team_log_group_name(platform, ns) for ns in config.team_namespaces}
    for name in [platform, *team_groups.values()]:
        group = groups[name]
        assert group.inputs.get("kmsKeyId") and group.inputs["retentionInDays"] == config.monitoring.log_retention_days
    for team in config.scheduling.teams:
        assert team.role_arns, "prod gives every team a role"
        for arn in team.role_arns:
            policies = _identity_policies_of(plan, arn.rsplit("/", 1)[-1])
            for namespace, name in team_groups.items():
                group_arn = groups[name].outputs["arn"]
                for action in ("logs:FilterLogEvents", "logs:GetLogEvents"):
                    allowed = _identity_allows(policies, action, f"{group_arn}:*") or _identity_allows(policies, action, group_arn)
                    assert allowed == (namespace == team.namespace), (team.name, namespace, action)
            assert not _identity_allows(policies, "logs:FilterLogEvents", groups[platform].outputs["arn"])
            assert not _identity_allows(policies, "logs:FilterLogEvents", f"{groups[platform].outputs['arn']}:*")


def test_the_clusters_admins_read_every_container_group(prod_plan):
    plan, config = prod_plan, prod_plan.config
    groups = {r.inputs["name"]: r for r in plan.recording.by_type("aws:cloudwatch/logGroup:LogGroup")}
    platform = log_group_name(config.cluster_name)
    for arn in config.cluster.admin_role_arns:
        policies = _identity_policies_of(plan, arn.rsplit("/", 1)[-1])
        for name in [platform, *(team_log_group_name(platform, ns) for ns in config.team_namespaces)]:
            assert _identity_allows(policies, "logs:FilterLogEvents", f"{groups[name].outputs['arn']}:*"), name


def test_the_route_emulation_refuses_what_it_should():
    """One group for everything (the layout before per-team groups) sends team A's lines where team B reads."""
    values = {"cloudWatchLogs": {"match": "*", "logGroupName": "/aws/eks/c/containers"}}
    assert route(values, "team-a") == route(values, "team-b") == ["/aws/eks/c/containers"]
    keep = {**values, "additionalFilters": "[FILTER]\n    Name rewrite_tag\n    Match kube.*\n"
                                           "    Rule $kubernetes['namespace_name'] ^(team-a)$ team.$TAG true\n"}
    with pytest.raises(AssertionError, match="platform's group"):
        route(keep, "team-a")
