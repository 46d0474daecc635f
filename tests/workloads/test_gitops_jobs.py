"""Jobs Argo CD owns: never re-run after they finish, and an edited TrainJob is a new TrainJob.

Upstream behaviour these tests are written from:

- Training Operator v1.9.4 pkg/controller.v1/common/job.go ``CleanupJob``::

      ttl := runPolicy.TTLSecondsAfterFinished
      if ttl == nil {
          return nil
      }
      ...
      expireTime := finishTime.Add(duration)
      if currentTime.After(expireTime) {
          err := jc.Controller.DeleteJob(job)

- Argo CD v3.5 docs/user-guide/auto_sync.md: "Argo CD has the ability to automatically sync an
  application when it detects differences between the desired manifests in Git, and the live
  state in the cluster." A job in Git that the operator deleted is such a difference: Argo CD
  creates it again (airbytehq/airbyte#15202: "Due to the ttlSecondsAfterFinished setting ArgoCD
  will re-create it").
- Trainer v2.3.0 manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml: ``spec.trainer``,
  ``spec.runtimeRef``, ``spec.activeDeadlineSeconds`` carry ``x-kubernetes-validations:
  - message: field is immutable, rule: self == oldSelf`` (checked against the vendored CRD below).
- Argo CD docs/user-guide/sync-options.md, "Prune Last": "resource pruning to happen as a final,
  implicit wave of a sync operation, after the other resources have been deployed and become
  healthy".
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

import pytest
import yaml

from jobs import render
from infra.plan import ROOT
from workloads import gitops, gitops_jobs
from workloads.jobspec import parse_job_spec
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME
from workloads.trainingjob import render as render_job

EXAMPLE = ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml"


def operator_deletes(job: dict, *, completed: datetime, now: datetime) -> bool:
    """CleanupJob's decision for a finished job (quoted in the module docstring)."""
    ttl: Optional[int] = job["spec"].get("runPolicy", {}).get("ttlSecondsAfterFinished")
    if ttl is None:
        return False
    return now > completed + timedelta(seconds=ttl)


@pytest.fixture(scope="module")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


def _committed_jobs():
    for path in sorted((ROOT / "workloads" / "rendered").rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc and doc.get("kind") in ("PyTorchJob", "TrainJob"):
            yield path, doc


def test_a_finished_git_owned_job_is_never_deleted_by_the_operator():
    jobs = list(_committed_jobs())
    assert jobs, "the committed trees declare at least one job"
    completed = datetime(2026, 11, 20, tzinfo=timezone.utc)
    for path, job in jobs:
        for later in (timedelta(hours=1), timedelta(days=8), timedelta(days=365)):
            assert not operator_deletes(job, completed=completed, now=completed + later), path


def test_the_submitted_job_keeps_its_ttl_and_the_git_owned_one_drops_it(prod_facts):
    """The finding, reproduced: the rendered job (submit's) is deleted after its TTL."""
    job = render_job(parse_job_spec(yaml.safe_load(EXAMPLE.read_text())), prod_facts)
    completed = datetime(2026, 11, 20, tzinfo=timezone.utc)
    assert operator_deletes(job, completed=completed, now=completed + timedelta(days=8))
    owned = gitops_jobs.git_owned(job)
    assert not operator_deletes(owned, completed=completed, now=completed + timedelta(days=8))
    assert owned["metadata"]["name"] == job["metadata"]["name"]  # a PyTorchJob keeps its name


def test_render_refuses_a_declared_ttl(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "Pulumi.dev.yaml").write_text((ROOT / "Pulumi.dev.yaml").read_text())
    job = yaml.safe_load((ROOT / "workloads/declared/dev/pipelines/jobs/shakespeare-gpt.yaml").read_text())
    path = root / "workloads/declared/dev/jobs/with-ttl.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({**job, "name": "with-ttl", "ttlAfterFinished": "24h"}))
    with pytest.raises(render.RenderError, match="ttlAfterFinished: '24h' is not allowed on a job Argo CD owns"):
        render.write_tree("dev", root)
    assert not (root / "workloads/rendered").exists()


def _trainjob(prod_facts, **changes):
    raw = {**yaml.safe_load(EXAMPLE.read_text()), "runtime": "trainjob", **changes}
    facts = dataclasses.replace(prod_facts, trainer_v2_runtime=TORCH_DISTRIBUTED_RUNTIME)
    return gitops_jobs.git_owned(render_job(parse_job_spec(raw), facts))


def test_an_edited_trainjob_is_a_new_object_and_resumes_from_the_same_checkpoints(prod_facts, schemas):
    crd = yaml.safe_load((Path(schemas) / "crds" / "trainer-2.3.0" / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    immutable = {f for f, s in spec_schema.items()
                 if {"rule": "self == oldSelf", "message": "field is immutable"} in s.get("x-kubernetes-validations", [])}
    assert {"trainer", "runtimeRef", "activeDeadlineSeconds"} <= immutable

    first = _trainjob(prod_facts)
    again = _trainjob(prod_facts)
    edited = _trainjob(prod_facts, maxRuntime="48h")  # activeDeadlineSeconds: immutable
    assert first["metadata"]["name"] == again["metadata"]["name"], "an unchanged spec keeps its name"
    assert edited["metadata"]["name"] != first["metadata"]["name"], "an edit is a new TrainJob"
    for job in (first, edited):
        assert job["metadata"]["name"].startswith("gpt2-pretrain-")
        assert len(job["metadata"]["name"]) <= 63
        assert job["metadata"]["labels"][gitops_jobs.JOB_NAME_LABEL] == "gpt2-pretrain"
    env = lambda job: {e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]}
    assert env(first)["TRAINER_CHECKPOINT_DIR"] == env(edited)["TRAINER_CHECKPOINT_DIR"]
    assert env(first)["TRAINER_RUN_ID"] == env(edited)["TRAINER_RUN_ID"]


def test_job_applications_prune_in_the_same_sync():
    """PruneLast would keep a renamed TrainJob running until its successor is healthy."""
    spec = gitops.GitOpsSpec(platform="p", repo_url="https://example.com/r.git", target_revision="main",
                             rendered_path="workloads/rendered/dev", namespaces=("team-a",),
                             sync_mode=gitops.SyncMode.AUTOMATED)
    child = gitops.child_application(spec, "team-a")
    assert "PruneLast=true" not in child["spec"]["syncPolicy"]["syncOptions"]
    assert child["spec"]["syncPolicy"]["automated"]["prune"] is True
