"""History that outlives the job: `list --all` keeps a cancelled job, and `--team` is checked.

Through the production transport (the fake `kubectl` on PATH serving the fake API's state,
tests/jobs/fake_kubectl.py), the controllers' and kubelet's seat driven between commands."""
from __future__ import annotations

import json

import pytest

from jobs.__main__ import main
from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import operator_pods, raw_spec, set_conditions, use_fake_kubectl
from tests.jobs.fake_kube import FakeKubeApi

NS = "team-research"


@pytest.fixture
def running(kube, dev_facts, tmp_path, monkeypatch):
    """smoke-l4 Running in team-research, its pod on a node; the state file for the CLI."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})  # the platform's, per team
    JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore()).submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job)
    kube.save(state)
    return state


@pytest.fixture
def facts_file(dev_facts, tmp_path):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(dev_facts.to_dict()))
    return str(path)


def test_a_cancelled_job_stays_in_list_all_after_its_pods_are_gone(running, capsys):
    """Old code: `list --all` printed "no jobs of team research" once the pods had exited."""
    assert main(["cancel", "smoke-l4", "--team", "research"]) == 0
    assert "list --all keeps it as Cancelled" in capsys.readouterr().out
    kube = FakeKubeApi.load(running)
    kube.terminate("smoke-l4-master-0", NS, 143)  # the kubelet: SIGTERM honoured, checkpoint saved
    assert kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS) is None
    kube.save(running)

    assert main(["list", "--team", "research"]) == 0
    assert capsys.readouterr().out.startswith("no active jobs of team research")
    assert main(["list", "--team", "research", "--all"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[:5] == ["smoke-l4", "research", "PyTorchJob", "Cancelled", "1"], rows
    # describe says what happened to it and where its logs and checkpoints still are (exit 6).
    assert main(["describe", "smoke-l4", "--team", "research"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was cancelled at" in err and "--attempt N" in err


def test_a_resubmitted_name_shows_the_live_run_and_the_cancelled_one(running, kube, dev_facts, capsys):
    assert main(["cancel", "smoke-l4", "--team", "research"]) == 0
    kube = FakeKubeApi.load(running)
    kube.terminate("smoke-l4-master-0", NS, 143)
    JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore()).submit(raw_spec())
    kube.save(running)
    capsys.readouterr()
    assert main(["list", "--team", "research", "--all"]) == 0
    phases = sorted(line.split()[3] for line in capsys.readouterr().out.splitlines()[1:])
    assert phases == ["Cancelled", "Pending"]


def test_a_typo_in_team_is_an_error_naming_the_teams(running, facts_file, capsys):
    """Old code: exit 0, "no active jobs of team reserach"."""
    assert main(["list", "--team", "reserach", "--facts", facts_file]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--team 'reserach'" in err and "teams: platform, research" in err and "did you mean 'research'" in err


def test_without_the_stack_a_team_without_a_namespace_is_an_error(running, capsys):
    """A caller who may read namespaces learns the team does not exist; the namespace of a real
    team with no jobs is there, and its listing is empty (exit 0)."""
    assert main(["list", "--team", "reserach"]) == 2
    assert "the cluster has no namespace team-reserach" in capsys.readouterr().err
    kube = FakeKubeApi.load(running)
    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-platform"}})
    kube.save(running)
    assert main(["list", "--team", "platform"]) == 0
    assert capsys.readouterr().out.startswith("no active jobs of team platform")
