"""The way in: every access error names the team's `aws eks update-kubeconfig --role-arn` line from
the stack's facts (never the platform's admin kubeconfig), and `--team` comes from the caller's
identity.

The identity is what the API server says (`kubectl auth whoami`, a SelfSubjectReview): a team
member's EKS access entry carries the group ``mlplatform:team-<name>`` (workloads.tenancy.team_group).
The fake kubectl answers whoami from $FAKE_KUBE_USER/$FAKE_KUBE_GROUPS and refuses, as RBAC does
with kubectl's 403 wording, what the team Role does not grant: other namespaces, cluster scope.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from jobs.__main__ import main
from jobs.access import Identity, access_error, access_fix, identity_from_review, team_of_role
from jobs.client import JobClient, UnknownTeam
from jobs.store import LocalStore
from tests.jobs.conftest import operator_pods, raw_spec, set_conditions, use_fake_kubectl

ADMIN_KUBECONFIG = "pulumi stack output kubeconfig"


@pytest.fixture(scope="module")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


def test_the_facts_carry_the_cluster_and_each_teams_roles(prod_facts, dev_facts):
    assert prod_facts.cluster_name == "mlp-prod-eks" and prod_facts.region == "us-west-2"
    assert prod_facts.team("research").role_arns == ("arn:aws:iam::222233334444:role/mlp-team-research",)
    # Dev's teams have no access entries (a platform sandbox): the facts say so, not a made-up role.
    assert dev_facts.cluster_name == "mlp-dev-eks" and all(not t.role_arns for t in dev_facts.teams)


def test_the_fix_is_the_teams_update_kubeconfig_line(prod_facts, dev_facts):
    assert access_fix(prod_facts, "research") == (
        "get team research's kubeconfig: aws eks update-kubeconfig --name mlp-prod-eks --region us-west-2 "
        "--role-arn arn:aws:iam::222233334444:role/mlp-team-research")
    # No team given: every team's role, for the reader to pick theirs.
    every = access_fix(prod_facts, None)
    assert "aws eks update-kubeconfig --name mlp-prod-eks --region us-west-2 --role-arn <your team role>" in every
    assert "applied: arn:aws:iam::222233334444:role/mlp-team-applied" in every
    # A team without a role: who can fix it, and the line to run then.
    dev = access_fix(dev_facts, "research")
    assert "team research has no IAM role in stack dev (scheduling.teams[].roleArns)" in dev
    assert "aws eks update-kubeconfig --name mlp-dev-eks --region us-west-2 --role-arn <that role ARN>" in dev
    # No stack: the placeholders, and how to fill them.
    assert "give --stack STACK" in access_fix(None, "research")
    for text in (access_fix(prod_facts, "research"), every, dev, access_fix(None, None)):
        assert ADMIN_KUBECONFIG not in text and "show-secrets" not in text


def test_identity_and_role_session_name_the_team(prod_facts):
    review = {"kind": "SelfSubjectReview", "status": {"userInfo": {
        "username": "alice@team-research", "groups": ["mlplatform:team-research", "system:authenticated"]}}}
    assert identity_from_review(review).teams == ("research",)
    # An assumed-role session whose groups were not mapped: the role's name says the team.
    assert team_of_role(prod_facts, "arn:aws:sts::222233334444:assumed-role/mlp-team-applied/bob") == "applied"
    assert team_of_role(prod_facts, "arn:aws:sts::222233334444:assumed-role/someone-else/bob") is None


def test_no_kubeconfig_names_the_team_role_not_the_admin_kubeconfig(prod_facts, tmp_path, monkeypatch, capsys):
    """Before: "Fix: write the cluster's kubeconfig (pulumi stack output kubeconfig --show-secrets ...)"."""
    use_fake_kubectl(tmp_path, monkeypatch)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(prod_facts.to_dict()))
    for argv in (["list", "--team", "research"], ["describe", "x", "--team", "research"], ["cancel", "x", "--team", "research"]):
        assert main([*argv, "--facts", str(facts)]) == 4
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert ("no kubeconfig (KUBECONFIG is unset or names no file). Fix: get team research's kubeconfig: aws eks "
                "update-kubeconfig --name mlp-prod-eks --region us-west-2 --role-arn "
                "arn:aws:iam::222233334444:role/mlp-team-research") in err, err
        assert ADMIN_KUBECONFIG not in err


def test_submit_without_a_kubeconfig_names_the_team_role(dev_facts, tmp_path, monkeypatch, capsys):
    use_fake_kubectl(tmp_path, monkeypatch)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dataclasses.replace(
        dev_facts, teams=tuple(dataclasses.replace(t, role_arns=(f"arn:aws:iam::444455556666:role/dev-{t.name}",))
                               for t in dev_facts.teams)).to_dict()))
    from tests.jobs.conftest import SMOKE

    assert main(["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts)]) == 4
    err = capsys.readouterr().err
    assert "aws eks update-kubeconfig --name mlp-dev-eks --region us-west-2 --role-arn " \
           "arn:aws:iam::444455556666:role/dev-research" in err, err
    assert ADMIN_KUBECONFIG not in err


@pytest.fixture
def team_member(kube, dev_facts, tmp_path, monkeypatch):
    """A running job of team research, and the fake kubectl answering as alice of that team."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore()).submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", "team-research")
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job)
    kube.save(state)
    monkeypatch.setenv("FAKE_KUBE_USER", "alice@team-research")
    monkeypatch.setenv("FAKE_KUBE_GROUPS", "mlplatform:team-research,system:authenticated")
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    return facts


def test_team_comes_from_the_identity(team_member, capsys):
    """Before: `list` without --team asked for every namespace (Forbidden for a team member) and
    `describe` refused to run without --team."""
    assert main(["list", "--facts", str(team_member)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["smoke-l4", "research", "PyTorchJob", "Running"]
    assert main(["describe", "smoke-l4", "--facts", str(team_member)]) == 0
    assert "PyTorchJob team-research/smoke-l4: Running" in capsys.readouterr().out


def test_forbidden_for_another_team_says_whose_jobs_they_are(team_member, capsys):
    """Before: "your identity may not do this (...); ... Fix: write the cluster's kubeconfig
    (pulumi stack output kubeconfig --show-secrets --stack dev > kubeconfig ...)": a team member
    who hit RBAC was told to take the cluster-admin credentials."""
    assert main(["list", "--team", "platform", "--facts", str(team_member)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: your identity may not do this (Error from server (Forbidden): ")
    assert "You are alice@team-research of team research: team platform's jobs are not yours to read." in err
    assert "Fix: leave out --team (your own team is used)" in err
    assert ADMIN_KUBECONFIG not in err and err.count("\n") == 1


def test_an_identity_without_a_team_must_name_one(kube, dev_facts):
    kube.user, kube.groups = "carol", ("system:authenticated",)
    client = JobClient(stack="dev", kube=kube, facts=dev_facts)
    with pytest.raises(UnknownTeam, match=r"your identity \(carol\) carries no team group \(mlplatform:team-<team>\)\. "
                                          r"Fix: give --team TEAM"):
        client.describe("smoke-l4")
    kube.groups = ("mlplatform:team-research", "system:authenticated")
    client = JobClient(stack="dev", kube=kube, facts=dev_facts)  # the identity is read once per client
    assert client.identity() == Identity("carol", ("mlplatform:team-research", "system:authenticated"))
    assert client.list() == []  # the own team's namespace, not every namespace


def test_access_error_is_one_line_for_each_cause(prod_facts):
    me = Identity("bob", ("mlplatform:team-applied",))
    assert access_error("no kubeconfig", prod_facts, "applied").count("\n") == 0
    text = access_error("forbidden", prod_facts, "research", forbidden=True, identity=me)
    assert "You are bob of team applied: team research's jobs are not yours to read" in text
