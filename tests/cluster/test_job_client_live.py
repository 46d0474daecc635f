"""The job client against the real API server, as a team member (scenario e of the issue, and what
the job client's lifecycle tests need from a real cluster).

A job from examples/ is submitted with ``JobClient`` over a kubeconfig whose identity is the one the
plan's access entries give that team (tests/cluster/identities.py): the rendered
PyTorchJob must pass the platform's own admission policies and Pod Security on the real API
server, and ``get``/``list`` read it back. Submitting the same name again must be refused with the
fix, and nothing of the stored job may change (no patched pod template).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from jobs.client import JobClient
from tests.cluster.clients import team_client

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}


def _client(cluster, team: str) -> JobClient:
    return team_client(cluster, team)


def test_a_team_submits_an_example_job_and_a_resubmit_changes_nothing(stack_cluster, scope):
    cluster = stack_cluster
    raw = yaml.safe_load((ROOT / EXAMPLE[cluster.stack]).read_text())
    # A name of its own: the GitOps render already declares some examples' names in the cluster.
    raw["name"] = scope.name("live")
    client = _client(cluster, raw["team"])
    spec = client.load(raw)
    submitted = client.submit(spec)
    name, namespace = submitted.job.name, f"team-{spec.team}"
    stored = json.loads(cluster.kubectl("get", "pytorchjobs.kubeflow.org", name, "-n", namespace, "-o", "json").stdout)
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "the job skips Kueue"
    assert name in [j.name for j in client.list(spec.team, include_finished=True)]
    assert client.get(name, spec.team).name == name

    changed = client.load(raw)
    with pytest.raises(Exception) as refused:
        client.submit(changed)
    message = str(refused.value)
    assert name in message and ("--replace" in message or "new name" in message), message
    after = json.loads(cluster.kubectl("get", "pytorchjobs.kubeflow.org", name, "-n", namespace, "-o", "json").stdout)
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"], "the stored job was changed"
