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
    # The bucket's deployed name comes from the namespace's platform ConfigMap (the plan's name is
    # not the deployed one), expanded by the kubelet: the same $(VAR) expansion jobs/local.py does.
    from jobs.local import expand
    from workloads.trainingjob import BUCKET_ENV, PLATFORM_BUCKET_KEY, PLATFORM_CONFIGMAP

    manifest_env = env()
    assert env(s3Mirror=True)["TRAINER_CHECKPOINT_S3_URI"] == manifest_env["TRAINER_CHECKPOINT_S3_URI"]
    assert "TRAINER_CHECKPOINT_S3_URI" not in env(s3Mirror=False)
    container = render(parse_job_spec(raw_spec()), facts)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    (bucket_ref,) = [e for e in container["env"] if e["name"] == BUCKET_ENV]
    assert bucket_ref["valueFrom"]["configMapKeyRef"] == {"name": PLATFORM_CONFIGMAP, "key": PLATFORM_BUCKET_KEY}
    mirror = expand(manifest_env["TRAINER_CHECKPOINT_S3_URI"], {BUCKET_ENV: BUCKET})
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


def test_a_team_member_without_the_stacks_outputs_reads_the_deployed_bucket_from_the_cluster(s3, kube, dev_facts):  # noqa: F811
    """The offline plan names the bucket as the plan would (a placeholder); a team member cannot
    read the stack's outputs (its state holds every team's secrets). The platform puts the deployed
    name into the team namespace's ConfigMap, which the team may read."""
    from workloads.trainingjob import platform_config_map

    placeholder = dataclasses.replace(dev_facts, checkpoints_bucket="mlp-dev-datasets-checkpoints-bucket-plan")
    assert not placeholder.names_deployed
    kube.add(platform_config_map("team-research", BUCKET))
    kube.user, kube.groups = "alice@team-research", ("mlplatform:team-research",)
    s3.put_object(Bucket=BUCKET, Key="team-research/mirror/smoke-l4/step-000100/complete.json", Body=b"{}")
    jobs = JobClient(stack="dev", kube=kube, facts=placeholder)
    assert [c.step for c in jobs.checkpoints("smoke-l4")] == [100]
    assert jobs.store.bucket == BUCKET


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
