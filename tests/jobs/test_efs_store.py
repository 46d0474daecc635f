"""Dev keeps checkpoints on EFS (datasets storage s3-mountpoint), which nothing exports to S3
(review jobs-ops-4 §5.6, §7 gap 2): the client read `s3://<bucket>/<ns>/<job>/`, the FSx export's
layout, and found nothing. On EFS the only copy in S3 is a job's `s3Mirror` (trainer/s3.py: complete
steps, marker last, under TRAINER_CHECKPOINT_S3_URI = s3://<bucket>/<ns>/mirror/<job>, rendered by
workloads/trainingjob.py); the client reads there and says what it cannot see."""
from __future__ import annotations

import dataclasses

from jobs.client import JobClient
from tests.jobs.conftest import raw_spec
from tests.jobs.test_data_and_init_from import BUCKET, s3  # noqa: F401  (moto's S3 fixture)


def _client(kube, dev_facts) -> JobClient:
    assert dev_facts.checkpoint_store == "EFS"  # the dev stack as planned
    return JobClient(stack="dev", kube=kube, facts=dataclasses.replace(dev_facts, checkpoints_bucket=BUCKET))


def test_dev_checkpoints_are_read_from_the_jobs_s3_mirror(s3, kube, dev_facts):  # noqa: F811
    from workloads.trainingjob import render
    from workloads.jobspec import parse_job_spec

    facts = dataclasses.replace(dev_facts, checkpoints_bucket=BUCKET)

    def env(**changes):
        manifest = render(parse_job_spec(raw_spec(**changes)), facts)
        return {e["name"]: e.get("value") for e in manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
                ["containers"][0]["env"]}

    # On EFS the mirror is on without a word in the spec (dev's example sets none), off when asked.
    mirror = env()["TRAINER_CHECKPOINT_S3_URI"]
    assert env(s3Mirror=True)["TRAINER_CHECKPOINT_S3_URI"] == mirror
    assert "TRAINER_CHECKPOINT_S3_URI" not in env(s3Mirror=False)
    assert mirror == f"s3://{BUCKET}/team-research/mirror/smoke-l4"
    for step in (100, 200):
        s3.put_object(Bucket=BUCKET, Key=f"team-research/mirror/smoke-l4/step-{step:06d}/complete.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key="team-research/mirror/smoke-l4/step-000300/model.pt", Body=b"partial")

    jobs = _client(kube, dev_facts)
    found = jobs.checkpoints("smoke-l4", team="research")
    assert [(c.step, c.uri) for c in found] == [(100, f"{mirror}/step-000100/"), (200, f"{mirror}/step-000200/")]
    # initFrom reads the same place: step 200 is complete, 300 is not.
    assert jobs.preflight(raw_spec(name="smoke-ft", initFrom="smoke-l4/step-200")).ok
    refused = jobs.preflight(raw_spec(name="smoke-ft", initFrom="smoke-l4/step-300"))
    assert "no complete checkpoint there (complete steps of that job: [100, 200])" in refused.text


def test_dev_describe_says_what_it_cannot_read(s3, kube, dev_facts):  # noqa: F811
    jobs = _client(kube, dev_facts)
    jobs.submit(raw_spec())
    notes = " ".join(jobs.describe("smoke-l4", team="research").notes)
    assert "attempt history is on EFS (not exported to S3 on this stack)" in notes
    assert "readable from here through the job's S3 mirror (on by default on EFS; not for jobs with s3Mirror: false)" in notes


def test_fsx_stacks_keep_the_mirror_off_unless_asked(prod_plan):
    """FSx's /checkpoints association exports every step: a default mirror would upload it twice."""
    from jobs.facts import facts_from_plan
    from workloads.jobspec import load_job_spec
    from workloads.trainingjob import mirrors_to_s3

    prod = facts_from_plan(prod_plan)
    assert prod.checkpoint_store == "FSx for Lustre"
    spec = load_job_spec("examples/jobs/gpt2-pretrain.yaml")
    assert not mirrors_to_s3(spec, prod)
    assert mirrors_to_s3(spec.model_copy(update={"s3_mirror": True}), prod)
