"""`data upload` (moto S3) and `initFrom: <job>/step-N` (rendered as the trainer's initial load)."""
from __future__ import annotations

import hashlib
import json

import pytest

from jobs.client import JobClient
from jobs.data import MANIFEST, DataUploadError, upload_dataset
from jobs.store import LocalStore
from tests.jobs.conftest import raw_spec
from workloads.jobspec import JobSpecError, parse_job_spec

BUCKET = "mlp-dev-datasets"


@pytest.fixture
def s3(monkeypatch):
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client("s3", region_name="us-west-2")
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        yield client


def dataset_dir(tmp_path, files):
    root = tmp_path / "texts"
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    return root


def test_upload_puts_a_content_addressed_version_under_the_teams_prefix(s3, dev_facts, tmp_path, capsys):
    root = dataset_dir(tmp_path, {"a.txt": b"hello", "sub/b.txt": b"world" * 1000})
    (root / "link").symlink_to("/etc/hostname")  # never followed out of the directory
    result = upload_dataset(str(root), dataset="shakespeare", team="research", facts=dev_facts, bucket=BUCKET,
                            client=s3, progress=True)
    expected = hashlib.sha256("".join(f"{rel}\0{hashlib.sha256(body).hexdigest()}\n" for rel, body in
                                      sorted({"a.txt": b"hello", "sub/b.txt": b"world" * 1000}.items())).encode()).hexdigest()
    assert result.version == f"sha256-{expected[:16]}"
    prefix = f"team-research/shakespeare/{result.version}/"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == [prefix + MANIFEST, prefix + "a.txt", prefix + "sub/b.txt"]
    # /datasets association: s3://<datasets bucket>/<key> is /fsx/datasets/<key>.
    assert result.fsx_path == f"/fsx/datasets/{prefix.rstrip('/')}"
    assert s3.head_object(Bucket=BUCKET, Key=prefix + "a.txt")["Metadata"]["sha256"] == hashlib.sha256(b"hello").hexdigest()
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + MANIFEST)["Body"].read())
    assert set(manifest["files"]) == {"a.txt", "sub/b.txt"} and manifest["bytes"] == 5 + 5000
    # The job spec takes the path, and the pods' lineage names the version (DATASET_VERSION).
    spec = parse_job_spec(raw_spec(dataset=result.fsx_path))
    from workloads.trainingjob import render

    env = render(spec, dev_facts)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DATASET_VERSION", "value": result.version} in env
    # The same bytes again: the same version, nothing sent.
    again = upload_dataset(str(root), dataset="shakespeare", team="research", facts=dev_facts, bucket=BUCKET,
                           client=s3, progress=False)
    assert (again.version, again.uploaded) == (result.version, False)
    (root / "a.txt").write_bytes(b"hello!")
    assert upload_dataset(str(root), dataset="shakespeare", team="research", facts=dev_facts, bucket=BUCKET,
                          client=s3, progress=False).version != result.version


def test_every_upload_mistake_is_reported_at_once(dev_facts, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataUploadError) as error:
        upload_dataset(str(tmp_path / "empty"), dataset="My Data", team="reserach", facts=dev_facts, bucket=BUCKET)
    text = str(error.value)
    assert "DIR" in text and "holds no regular file" in text
    assert "--dataset" in text and "'My Data'" in text
    assert "--team" in text and "reserach" in text


def test_upload_without_a_deployed_bucket_name_says_how_to_get_it(dev_facts, tmp_path, monkeypatch):
    root = dataset_dir(tmp_path, {"a.txt": b"x"})
    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi CLI
    with pytest.raises(DataUploadError, match="datasets bucket's deployed name is not readable"):
        upload_dataset(str(root), dataset="d", team="research", facts=dev_facts)


# -- initFrom ----------------------------------------------------------------------------------
def test_init_from_renders_the_trainers_initial_load_not_a_resume(dev_facts):
    """trainer/config.py: checkpoint.initial_load_path is used only while checkpoint.dir holds no
    checkpoint of the job's own; step, schedule, data cursor and MLflow run start fresh
    (trainer/train.py _initial_load). checkpoint.resume stays auto, so a preempted fine-tune
    resumes its own checkpoints."""
    from workloads.trainingjob import render

    manifest = render(parse_job_spec(raw_spec(name="smoke-ft", initFrom="smoke-l4/step-200")), dev_facts)
    args = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert "checkpoint.initial_load_path=/fsx/checkpoints/team-research/smoke-l4/step-000200" in args
    assert not any(a.startswith("checkpoint.resume=") for a in args)
    from trainer.config import build_config

    overrides = args[args.index("--config") + 2:]
    cfg = build_config("trainer/configs/gpt2-124m.yaml", overrides)
    assert cfg.checkpoint.initial_load_path.endswith("smoke-l4/step-000200") and cfg.checkpoint.resume == "auto"


@pytest.mark.parametrize("value,message", [
    ("smoke-l4", "is not <job>/step-N"),
    ("team-other/pre/step-10", "another team"),
    ("/fsx/checkpoints/team-other/pre/step-000010", "another team"),
    ("smoke-ft/step-5", "this job's own checkpoint"),
])
def test_init_from_must_name_another_job_of_the_same_team(value, message):
    with pytest.raises(JobSpecError) as error:
        parse_job_spec(raw_spec(name="smoke-ft", initFrom=value))
    assert f"initFrom: " in str(error.value) and message in str(error.value)


def test_init_from_cannot_be_smuggled_in_as_a_trainer_override():
    with pytest.raises(JobSpecError, match="set by the platform"):
        parse_job_spec(raw_spec(trainer={"config": "trainer/configs/gpt2-124m.yaml",
                                         "overrides": ["checkpoint.initial_load_path=/fsx/checkpoints/team-x/j/step-000001"]}))


def test_preflight_refuses_an_init_from_step_that_is_not_complete(kube, dev_facts, tmp_path):
    done = tmp_path / "team-research" / "smoke-l4" / "step-000100"
    done.mkdir(parents=True)
    (done / "complete.json").write_text("{}")
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(str(tmp_path)))
    assert jobs.preflight(raw_spec(name="smoke-ft", initFrom="smoke-l4/step-100")).ok
    refused = jobs.preflight(raw_spec(name="smoke-ft", initFrom="smoke-l4/step-200"))
    assert not refused.ok and "no complete checkpoint there (complete steps of that job: [100])" in refused.text


# -- the commands ------------------------------------------------------------------------------
def test_data_upload_and_checkpoints_commands(s3, dev_facts, tmp_path, monkeypatch, capsys):
    import dataclasses

    import jobs.data
    from jobs.__main__ import main

    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(dataclasses.replace(dev_facts, checkpoints_bucket=BUCKET).to_dict()))
    monkeypatch.setattr(jobs.data, "datasets_bucket", lambda stack, use_outputs=True: BUCKET)
    root = dataset_dir(tmp_path, {"a.txt": b"hello"})
    assert main(["data", "upload", str(root), "--dataset", "shakespeare", "--team", "research",
                 "--facts", str(facts_file), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "uploaded to s3://mlp-dev-datasets/team-research/shakespeare/sha256-" in out
    assert "/fsx/datasets/team-research/shakespeare/sha256-" in out
    assert main(["data", "upload", str(tmp_path / "nope"), "--dataset", "x", "--team", "research",
                 "--facts", str(facts_file)]) == 2
    assert "DIR: does not exist" in capsys.readouterr().err

    # Dev keeps checkpoints on EFS: what S3 has is the job's s3Mirror (tests/jobs/test_efs_store.py).
    s3.put_object(Bucket=BUCKET, Key="team-research/mirror/pre/step-000100/complete.json", Body=b"{}")
    monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl: the job object is not needed
    assert main(["checkpoints", "pre", "--team", "research", "--facts", str(facts_file)]) == 0
    assert capsys.readouterr().out.split() == ["step", "100", f"s3://{BUCKET}/team-research/mirror/pre/step-000100/"]
    assert main(["checkpoints", "pre", "--team", "research"]) == 2
    assert "give --stack STACK" in capsys.readouterr().err
