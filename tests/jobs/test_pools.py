"""`python -m workloads pools`: the stack's GPU pools and each team's Kueue quota, with what each
team's LocalQueue reports in use now (Kueue v0.19.2 LocalQueue v1beta2 ``status.flavorsUsage``,
``pendingWorkloads``; teams may read their LocalQueue, workloads/tenancy.py TEAM_RULES), or the
declared figures alone when the cluster cannot be read, saying so.

Review jobs-ops-4 §4.2 "no pools/quota view for users: NOT (`facts` JSON only)"."""
from __future__ import annotations

import json

import pytest

from jobs.__main__ import main
from tests.jobs.conftest import use_fake_kubectl


@pytest.fixture
def facts_file(dev_facts, tmp_path):
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(dev_facts.to_dict()))
    return str(path)


def rows(text: str) -> dict[tuple[str, str], list[str]]:
    out = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] in ("research", "platform"):
            out[(cells[0], cells[1])] = cells[2:]
    return out


def local_queue(team: str, usage: dict[str, int], pending: int) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "training", "namespace": f"team-{team}"},
            "spec": {"clusterQueue": team},
            "status": {"pendingWorkloads": pending, "reservingWorkloads": 1, "admittedWorkloads": 1,
                       "flavorsUsage": [{"name": f, "resources": [{"name": "nvidia.com/gpu", "total": str(n)}]}
                                        for f, n in usage.items()]}}


def test_pools_and_quotas_with_what_the_cluster_uses_now(kube, dev_facts, facts_file, tmp_path, monkeypatch, capsys):
    """Old code: `pools` did not exist (argparse: invalid choice, exit 2)."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.add(local_queue("research", {"gpu-l4": 2, "gpu-a10g-x4": 4}, pending=3))
    kube.add(local_queue("platform", {}, pending=0))
    kube.save(state)
    assert main(["pools", "--facts", facts_file]) == 0
    out = capsys.readouterr().out
    pools = {line.split()[0]: line.split() for line in out.splitlines()[2:5]}
    for pool in dev_facts.pools:
        cells = pools[pool.name]
        assert cells[1:3] == [pool.gpu_type, str(pool.gpus_per_node)]
        assert cells[4] == ",".join(pool.capacity_types) and cells[5] == str(pool.max_gpus)
    table = rows(out)
    research = dev_facts.team("research")
    assert table[("research", "l4")] == [str(research.gpu_quota["gpu-l4"]), "yes", "(to", "4)", "2", "3"]
    assert table[("research", "a10g-x4")][-2:] == ["4", "3"]
    assert table[("platform", "l4")][-2:] == ["0", "0"]
    assert "IN USE: LocalQueue status, now" in out and "note:" not in out


def test_without_a_cluster_the_declared_quotas_and_why(facts_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert main(["pools", "--facts", facts_file, "--team", "research"]) == 0
    out = capsys.readouterr().out
    assert rows(out)[("research", "l4")][-2:] == ["?", "?"]
    assert not any(team == "platform" for team, _ in rows(out))
    assert "note: in use not read (" in out and "declared quotas only" in out


def test_pools_checks_the_team(facts_file, capsys):
    assert main(["pools", "--facts", facts_file, "--team", "reserach"]) == 2
    assert "did you mean 'research'" in capsys.readouterr().err
