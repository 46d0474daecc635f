"""Logs of attempts whose pods are gone: `logs JOB --attempt N` reads the team's CloudWatch
container log group (jobs/past_logs.py), against moto's CloudWatch Logs (the AWS API as boto3
calls it), the job's state from the fake `kubectl` on PATH.

What Fluent Bit writes there (components/container_logs.py, eks-charts aws-for-fluent-bit
values.yaml: ``logKey`` unset, so each event is the whole record as JSON; the Kubernetes filter adds
``kubernetes.pod_name``/``pod_id``/``container_name``): stream ``<namespace>.<pod>.<container>``.
The Training Operator recreates ``<job>-master-0`` under the same name after an exit 143
(kubeflow/trainer v1.9.4 pkg/controller.v1/common/pod.go), so one stream holds both attempts,
told apart by the pod uid."""
from __future__ import annotations

import dataclasses
import json
import time

import boto3
import pytest
from moto import mock_aws

from jobs.__main__ import main
from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import operator_pods, raw_spec, set_conditions, use_fake_kubectl

NS = "team-research"


def fluent_bit_event(pod: str, uid: str, line: str, at_ms: int) -> dict:
    record = {"log": line + "\n", "stream": "stdout", "time": "2026-11-28T01:00:00.000000000Z",
              "kubernetes": {"pod_name": pod, "namespace_name": NS, "pod_id": uid, "container_name": "pytorch",
                             "labels": {"training.kubeflow.org/job-name": "smoke-l4"}}}
    return {"timestamp": at_ms, "message": json.dumps(record)}


@pytest.fixture
def cancelled(kube, dev_facts, tmp_path, monkeypatch):
    """smoke-l4 ran on rank 0, was cancelled, and is gone from the cluster; a facts file."""
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    jobs.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running")
    operator_pods(kube, job)
    jobs.cancel("smoke-l4", "research")
    kube.terminate("smoke-l4-master-0", NS, 143)
    assert kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS) is None
    kube.save(state)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    return str(facts)


@pytest.fixture
def cloudwatch(dev_facts, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": dev_facts.region}.items():
        monkeypatch.setenv(key, value)
    from components.container_logs import team_log_group_name

    with mock_aws():
        logs = boto3.client("logs", region_name=dev_facts.region)
        # The platform's namespaces keep the cluster's group; a team's containers are in its own
        # (components/container_logs.py). A stream of the same name in the platform's group is
        # not the team's and is never read.
        platform = dev_facts.container_log_group
        logs.create_log_group(logGroupName=platform)
        logs.create_log_stream(logGroupName=platform, logStreamName=f"{NS}.smoke-l4-master-0.pytorch")
        logs.put_log_events(logGroupName=platform, logStreamName=f"{NS}.smoke-l4-master-0.pytorch",
                            logEvents=[fluent_bit_event("smoke-l4-master-0", "uid-platform", "not the team's group",
                                                        int(time.time() * 1000) + 500)])
        group = team_log_group_name(platform, NS)
        logs.create_log_group(logGroupName=group)
        now_ms = int(time.time() * 1000) + 1000  # after the job's creation
        stream = f"{NS}.smoke-l4-master-0.pytorch"
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        events = [fluent_bit_event("smoke-l4-master-0", "uid-first", f"step {i}", now_ms + i) for i in (1, 2)]
        events.append(fluent_bit_event("smoke-l4-master-0", "uid-first", "SIGTERM: checkpoint at step 2, exit 143",
                                       now_ms + 3))
        events += [fluent_bit_event("smoke-l4-master-0", "uid-second", line, now_ms + 10 + i)
                   for i, line in enumerate(["resumed from step 2", "step 3"])]
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
        # Another pod whose name starts the same: its stream is not read.
        other = f"{NS}.smoke-l4-master-0x.pytorch"
        logs.create_log_stream(logGroupName=group, logStreamName=other)
        logs.put_log_events(logGroupName=group, logStreamName=other,
                            logEvents=[fluent_bit_event("smoke-l4-master-0x", "uid-other", "not ours", now_ms)])
        yield logs


def test_the_dev_stack_names_its_container_log_group(dev_facts, dev_plan):
    from components.container_logs import log_group_name

    assert dev_facts.container_log_group == log_group_name(dev_plan.config.cluster_name)


def test_each_attempt_of_a_cancelled_job_from_cloudwatch(cancelled, cloudwatch, capsys):
    """Old code: `logs --attempt` did not exist (argparse exit 2); the gone job's lines were lost."""
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", cancelled, "--attempt", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["step 1", "step 2", "SIGTERM: checkpoint at step 2, exit 143"]
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", cancelled, "--attempt", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["resumed from step 2", "step 3"]
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", cancelled, "--attempt", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank 0 of job smoke-l4 has attempts 1-2" in err


def test_without_aws_credentials_it_is_one_line_and_exit_4(cancelled, tmp_path, monkeypatch, capsys):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role on a laptop
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", cancelled, "--attempt", "1"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Unable to locate credentials" in err and "aws sso login" in err


def test_a_stack_without_container_logs_says_so(cancelled, dev_facts, tmp_path, capsys):
    facts = tmp_path / "no-logs.json"
    facts.write_text(json.dumps(dataclasses.replace(dev_facts, container_log_group=None).to_dict()))
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", str(facts), "--attempt", "1"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "keeps no container logs" in err


def test_attempt_reads_one_rank_and_does_not_follow(cancelled, capsys):
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", cancelled, "--attempt", "1", "-f"]) == 2
    assert "drop -f" in capsys.readouterr().err


def test_past_logs_need_no_cluster(cloudwatch, dev_facts, tmp_path, monkeypatch, capsys):
    """CloudWatch keeps the lines after the cluster is unreachable (or the job long gone): without a
    kubeconfig the attempts are still read, counted from every run of the name."""
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert main(["logs", "smoke-l4", "--team", "research", "--facts", str(facts), "--attempt", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["resumed from step 2", "step 3"]
