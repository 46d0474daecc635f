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

    manifest = render(parse_job_spec(raw_spec(s3Mirror=True)), dataclasses.replace(dev_facts, checkpoints_bucket=BUCKET))
    env = {e["name"]: e.get("value") for e in manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
           ["containers"][0]["env"]}
    mirror = env["TRAINER_CHECKPOINT_S3_URI"]
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
    assert "only jobs with s3Mirror: true have their complete steps readable" in notes
