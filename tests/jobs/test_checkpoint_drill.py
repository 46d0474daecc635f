"""`checkpoints --verify` runs the restore drill as a Job in the team's namespace, never on the
operator's machine (issue 34 item 1, review security-4 N1).

The attack: team A plants a step whose `.metadata` is a pickle that runs code, with an unsigned
manifest over its own files, then asks the platform team to check why the job "does not restore".
The operator runs `python -m workloads checkpoints JOB --team a --verify`. The old client ran
`python -m trainer verify-checkpoint` in a local subprocess, with the operator's credentials, and
the pickle ran there. Now the client applies a Job in the team's namespace (the team's service
account, uid and key) and reads the verdict back from its pod: nothing of the checkpoint is read
on the operator's machine.

The fake API plays the Job controller and the kubelet: it creates the drill's pod from the Job's
template (labels `batch.kubernetes.io/job-name`, set by the Job controller since Kubernetes 1.27)
and terminates its container with the drill's exit code and termination message.
"""
from __future__ import annotations

import copy
import json
import os
import pickle

import pytest
import yaml

from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import raw_spec
from tests.trainer.test_checkpoint_trust import RunsCode, forge_manifest
from tests.workloads.golden_files import assert_golden
from workloads.checkpoint_drill import (CONTAINER, JOB_NAME_LABEL, DrillSpec, DrillSpecError, render_drill,
                                        verdict_from_pod)
from workloads.trainingjob import CHECKPOINT_KEY_MOUNT, CHECKPOINT_KEY_SECRET

NS = "team-research"
JOB = "smoke-l4"  # examples/jobs/l4-dev-smoke.yaml


def plant(root, marker: str) -> str:
    """Team A's planted step in its own directory (what its pods may write)."""
    step = root / NS / JOB / "step-000200"
    step.mkdir(parents=True)
    (step / "complete.json").write_text(json.dumps({"step": 200, "world_size": 1, "config": {}}))
    (step / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    forge_manifest(str(step), None)
    return str(step)


def kubelet(kube, exit_code: int, message: str):
    """The Job controller and the kubelet: the drill Job's pod, run to its end."""
    def sleep(_seconds: float) -> None:
        for (resource, namespace, name), job in list(kube.objects.items()):
            if resource != "jobs.batch" or (resource, namespace, f"{name}-abcde") in kube.objects:
                continue
            template = copy.deepcopy(job["spec"]["template"])
            labels = {**template["metadata"]["labels"], JOB_NAME_LABEL: name, "job-name": name}
            owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"], "controller": True}]
            kube.add({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"{name}-abcde", "namespace": namespace, "labels": labels, "ownerReferences": owner},
                      "spec": template["spec"],
                      "status": {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [{
                          "name": CONTAINER, "image": template["spec"]["containers"][0]["image"], "imageID": "",
                          "ready": False, "restartCount": 0,
                          "state": {"terminated": {"exitCode": exit_code, "message": message,
                                                   "reason": "Error" if exit_code else "Completed"}}}]}})
    return sleep


def test_checkpoints_verify_never_unpickles_the_tenants_checkpoint_on_the_operators_machine(kube, dev_facts, tmp_path):
    marker = str(tmp_path / "pwned")
    plant(tmp_path, marker)
    message = ("VERDICT: FAIL: the checkpoint would not restore:\n  - .metadata: refused: it names posix.system, "
               "which is not one of the classes a DCP checkpoint's metadata holds")
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(str(tmp_path)),
                     sleep=kubelet(kube, 1, message))
    jobs.submit(raw_spec())
    found = jobs.checkpoints(JOB, "research", verify=-1)
    assert not os.path.exists(marker), "the tenant's pickle ran on the operator's machine"
    assert [(c.step, c.verdict) for c in found] == [(200, "FAIL")]
    assert "exit code 1 (the checkpoint would not restore)" in found[0].detail and "posix.system" in found[0].detail

    # What ran instead: a Job in the team's namespace, as the team.
    team = dev_facts.team("research")
    drill = kube.find("jobs.batch", f"verify-{JOB}-200", NS)
    assert drill is not None, [r for r in kube.requests if r[0] == "apply"]
    pod = drill["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["serviceAccountName"] == team.trainer_service_account
    assert pod["securityContext"]["runAsUser"] == team.posix_id and container["securityContext"]["runAsUser"] == team.posix_id
    assert {"name": "TRAINER_CHECKPOINT_KEY_FILE", "value": f"{CHECKPOINT_KEY_MOUNT}/key"} in container["env"]
    assert pod["volumes"][0]["secret"]["secretName"] == CHECKPOINT_KEY_SECRET
    assert container["args"][0] == f"s3://{dev_facts.checkpoints_bucket}/{NS}/{JOB}/step-000200/"
    assert drill["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == team.local_queue


def test_a_passing_drill_and_a_drill_that_never_runs(kube, dev_facts, tmp_path):
    (tmp_path / NS / JOB / "step-000100").mkdir(parents=True)
    (tmp_path / NS / JOB / "step-000100" / "complete.json").write_text("{}")
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(str(tmp_path)), sleep=kubelet(kube, 0, ""))
    jobs.submit(raw_spec())
    assert [(c.step, c.verdict) for c in jobs.checkpoints(JOB, "research", verify=100)] == [(100, "PASS")]

    clock = iter(range(0, 10**6, 600))
    waiting = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(str(tmp_path)),
                        clock=lambda: next(clock), sleep=lambda s: None)
    verdict, detail = waiting.verify_checkpoint_in_cluster("gone-job", "research", 100, image="trainer:1",
                                                           checkpoint_dir=f"/fsx/checkpoints/{NS}/gone-job",
                                                           timeout_seconds=1200)
    assert verdict == "FAIL" and f"kubectl -n {NS} describe job verify-gone-job-100" in detail
    with pytest.raises(ValueError, match="job gone-job is gone: give the trainer image"):
        waiting.verify_checkpoint_in_cluster("gone-job", "research", 100, checkpoint_dir=f"/fsx/checkpoints/{NS}/gone-job")
    with pytest.raises(ValueError, match="not a complete step"):
        jobs.checkpoints(JOB, "research", verify=150)


# -- the renderer ---------------------------------------------------------------------------------------------
def spec(**changes) -> DrillSpec:
    base = dict(job="gpt2-pretrain", step=1200, team="research", namespace=NS,
                source=f"s3://mlp-dev-checkpoints/{NS}/gpt2-pretrain/step-001200/",
                image="111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/trainer:1.4.0",
                service_account="trainer", uid=20123, local_queue="team-research", region="us-west-2")
    return DrillSpec(**{**base, **changes})


def test_the_drill_job_golden_and_valid(schemas):
    from tests.support.validation import validate_core

    job = render_drill(spec())
    assert_golden("job-checkpoint-drill", yaml.safe_dump(job, sort_keys=True))
    assert validate_core(job) == []


def test_the_team_admission_policies_admit_the_drill_and_its_pod():
    """The drill passes the policies every team job passes (workloads/tenancy.py, evaluated with
    cel-python by tests/infra/test_tenant_attacks.py): the queue label, the team's uid, no
    system nodes, a priority within the entitlement."""
    from tests.infra.test_tenant_attacks import JOB_CONTROLLER, NAMESPACES, TEAM_USER, UID, A, admit
    from workloads.tenancy import LOCAL_QUEUE_LABEL

    namespace = NAMESPACES[A]
    job = render_drill(spec(namespace=A, team=A.removeprefix("team-"), uid=UID[A],
                            local_queue=namespace["metadata"]["labels"][LOCAL_QUEUE_LABEL],
                            source=f"s3://bucket/{A}/gpt2-pretrain/step-001200/"))
    assert admit(job, namespace, TEAM_USER) == []
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "drill", "namespace": A},
           "spec": job["spec"]["template"]["spec"]}
    assert admit(pod, namespace, JOB_CONTROLLER) == []


def test_a_bad_drill_spec_names_every_problem():
    with pytest.raises(DrillSpecError) as err:
        render_drill(spec(namespace="kube-system", job="Bad_Name", uid=0, image="",
                          source="/fsx/checkpoints/team-research/x/step-000001", cpu=0))
    text = str(err.value)
    for expected in ("namespace: 'kube-system': the drill runs only in a team namespace",
                     "job: 'Bad_Name' is not a Kubernetes name", "uid: 0", "image: empty",
                     "source: '/fsx/checkpoints/team-research/x/step-000001': give the step's s3:// URI",
                     "cpu: 0"):
        assert expected in text, text
    with pytest.raises(DrillSpecError, match="is not in the prefix of team-research"):
        render_drill(spec(source="s3://mlp-dev-checkpoints/team-other/gpt2-pretrain/step-001200/"))
    assert len(spec(job="j" * 80).name) == 63


def test_the_verdict_is_the_drills_exit_code():
    def pod(state):
        return {"status": {"containerStatuses": [{"name": CONTAINER, "state": state}]}}

    assert verdict_from_pod(pod({"running": {}})) is None
    assert verdict_from_pod(pod({"terminated": {"exitCode": 0}})) == ("PASS", "VERDICT: PASS")
    assert verdict_from_pod(pod({"terminated": {"exitCode": 2, "message": "no complete checkpoint"}})) == (
        "FAIL", "exit code 2 (nothing to verify at the source)\nno complete checkpoint")
    assert verdict_from_pod(pod({"terminated": {"exitCode": 137}}))[0] == "FAIL"



def test_a_pod_the_team_made_with_the_drills_label_is_not_the_drills_verdict(kube, dev_facts, tmp_path):
    """The forged verdict: a team member creates a pod labelled batch.kubernetes.io/job-name=verify-<job>-<step>
    with a container `drill` that exits 0, before the Job controller's pod ends. It names no
    controller owner with the drill Job's uid: it is not read; the drill's own pod is."""
    (tmp_path / NS / JOB / "step-000100").mkdir(parents=True)
    (tmp_path / NS / JOB / "step-000100" / "complete.json").write_text("{}")
    real = kubelet(kube, 1, "VERDICT: FAIL: the checkpoint would not restore")

    def forge_then_run(seconds: float) -> None:
        name = f"verify-{JOB}-100"
        if kube.find("pods", "forged", NS) is None:
            kube.add({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "forged", "namespace": NS, "labels": {JOB_NAME_LABEL: name}},
                      "spec": {"containers": [{"name": CONTAINER, "image": "busybox"}]},
                      "status": {"phase": "Succeeded", "containerStatuses": [{
                          "name": CONTAINER, "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
                          "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})
            return
        real(seconds)

    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(str(tmp_path)), sleep=forge_then_run)
    jobs.submit(raw_spec())
    [checkpoint] = jobs.checkpoints(JOB, "research", verify=100)
    assert checkpoint.verdict == "FAIL" and "would not restore" in checkpoint.detail


def test_a_drill_pod_whose_image_was_swapped_is_a_fail():
    pod = {"spec": {"containers": [{"name": CONTAINER, "image": "attacker/always-pass:1"}]},
           "status": {"containerStatuses": [{"name": CONTAINER, "state": {"terminated": {"exitCode": 0}}}]}}
    verdict, detail = verdict_from_pod(pod, image="trainer:1")
    assert verdict == "FAIL" and "attacker/always-pass:1" in detail
