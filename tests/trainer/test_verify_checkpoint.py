"""The restore drill (`python -m trainer verify-checkpoint`) against checkpoints the real
trainer wrote (2 CPU ranks under torchrun), on local disk and through S3 (moto on loopback),
and against copies damaged on purpose: each damage fails with a message naming the file and
what is wrong."""
from __future__ import annotations

import os
import shutil
import sys
import uuid

import pytest

from tests.trainer.trainer_helpers import launcher_env, run, tiny_overrides, torchrun_cmd
from trainer.checkpoint.layout import step_dir
from trainer.contract.layout import MARKER

NUM_STEPS = 4


def train_two_ranks(tmp_path_factory, data_dir, **extra) -> str:
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": NUM_STEPS, "schedule.warmup_steps": 1,
                                                  "checkpoint.every_steps": 2, "tracking.enabled": "false", **extra})
    result = run(torchrun_cmd(2, overrides), launcher_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert os.path.isfile(os.path.join(step_dir(ckpt, NUM_STEPS), MARKER))
    return ckpt


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """checkpoint.dir of a finished 2-rank DDP run: step-000002 and step-000004."""
    return train_two_ranks(tmp_path_factory, data_dir)


def verify(source: str, **env: str):
    return run([sys.executable, "-m", "trainer", "verify-checkpoint", source], launcher_env(**env), timeout=600)


def damaged_copy(trained: str, tmp_path, damage) -> str:
    root = str(tmp_path / "damaged")
    shutil.copytree(step_dir(trained, NUM_STEPS), step_dir(root, NUM_STEPS))
    damage(step_dir(root, NUM_STEPS))
    return root


def test_a_good_checkpoint_restores_for_its_world_size_and_one_process(trained):
    result = verify(trained)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"checkpoint: {step_dir(trained, NUM_STEPS)}" in out  # the newest complete one
    assert "world size 2" in out
    assert "load in 2 processes (ddp)" in out and "load in 1 process (none)" in out
    assert f"optimizer step {NUM_STEPS}" in out
    assert "VERDICT: PASS" in out


def test_an_fsdp_checkpoint_restores_sharded_and_resharded_to_one_process(tmp_path_factory, data_dir):
    ckpt = train_two_ranks(tmp_path_factory, data_dir, **{"parallelism.strategy": "fsdp"})
    result = verify(ckpt)
    assert result.returncode == 0, result.stdout + result.stderr
    # Both loads hold bit-identical full state (checked inside), and compute the same loss.
    assert "load in 2 processes (fsdp)" in result.stdout and "load in 1 process (none)" in result.stdout
    assert "VERDICT: PASS" in result.stdout


def truncate_shard(path: str) -> None:
    shard = os.path.join(path, "__1_0.distcp")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)


def zero_shard_header(path: str) -> None:
    with open(os.path.join(path, "__0_0.distcp"), "r+b") as f:
        f.write(b"\0" * 64)


def poison_a_weight(path: str) -> None:
    """NaN written over the values of one saved tensor, its framing intact: only reading the
    values finds it."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(path).read_metadata()
    index, info = next((i, s) for i, s in metadata.storage_data.items() if i.fqn == "app.model.wte.weight")
    shard = os.path.join(path, info.relative_path)
    with open(shard, "rb") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
    import io

    original = torch.load(io.BytesIO(blob), weights_only=True)
    nan = original.clone()
    nan[0, 0] = float("nan")
    buf = io.BytesIO()
    torch.save(nan, buf)
    assert len(buf.getvalue()) == info.length  # same framing, same size: only the value differs
    with open(shard, "r+b") as f:
        f.seek(info.offset)
        f.write(buf.getvalue())


def remove_rng_file(path: str) -> None:
    os.remove(os.path.join(path, "rng-rank-1.pt"))


def wrong_marker_step(path: str) -> None:
    import json

    with open(os.path.join(path, MARKER)) as f:
        marker = json.load(f)
    marker["step"] = 2
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump(marker, f)


@pytest.mark.parametrize("damage, expected", [
    (truncate_shard, ["__1_0.distcp", "the shard is truncated"]),
    (zero_shard_header, ["__0_0.distcp", "cannot be deserialised", "the shard is damaged"]),
    (poison_a_weight, ["app.model.wte.weight", "holds NaN or inf"]),
    (remove_rng_file, ["rng-rank-1.pt: missing", "world_size=2"]),
    (wrong_marker_step, [f"{MARKER}: step 2 but the directory is step-000004"]),
])
def test_a_damaged_checkpoint_fails_with_a_message_naming_the_damage(trained, tmp_path, damage, expected):
    root = damaged_copy(trained, tmp_path, damage)
    result = verify(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "VERDICT: FAIL" in result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_nothing_to_verify_is_a_usage_error(tmp_path):
    os.makedirs(step_dir(str(tmp_path), 6))  # a save cut short: no marker
    result = verify(str(tmp_path))
    assert result.returncode == 2
    assert "no complete checkpoint" in result.stderr and "[6]" in result.stderr


@pytest.fixture
def s3_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    import boto3

    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    # moto keeps its backends per process, not per server: a bucket of its own per test.
    bucket = f"ckpts-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    yield bucket, client, {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_DEFAULT_REGION": "us-east-1"}
    server.stop()


def signed_copy(trained: str, tmp_path) -> tuple[str, str]:
    """The checkpoint as a team's pod writes it: its manifest signed with the team's key (a
    downloaded source is read only with that key, trainer/trust.py). Returns (dir, key file)."""
    import json

    from trainer.trust import CheckpointTrust

    key = tmp_path / "team-key"
    key.write_bytes(b"k" * 32)
    root = str(tmp_path / "signed")
    for step in (2, NUM_STEPS):
        shutil.copytree(step_dir(trained, step), step_dir(root, step))
        with open(os.path.join(step_dir(root, step), MARKER)) as f:
            CheckpointTrust(b"k" * 32).seal(step_dir(root, step), json.load(f))
    return root, str(key)


def test_s3_downloads_the_newest_complete_checkpoint_and_verifies_it(trained, tmp_path, s3_server):
    from trainer.s3 import S3Mirror
    from trainer.trust import KEY_FILE_ENV

    bucket, client, env = s3_server
    root, key = signed_copy(trained, tmp_path)
    env = {**env, KEY_FILE_ENV: key}  # in the team's pod (the in-cluster drill)
    mirror = S3Mirror(f"s3://{bucket}/team-a/job", client=client)  # the trainer's own mirror wrote it
    for step in (2, NUM_STEPS):
        mirror.upload(step_dir(root, step))
    mirror.close()
    # A newer upload cut short before its marker: never the one verified.
    client.put_object(Bucket=bucket, Key="team-a/job/step-000006/__0_0.distcp", Body=b"partial")
    scratch = str(tmp_path / "scratch")
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", f"s3://{bucket}/team-a/job", "--scratch", scratch],
                 launcher_env(**env), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"checkpoint: {os.path.join(scratch, 'step-000004')}" in result.stdout
    assert "VERDICT: PASS" in result.stdout
    assert "signed with this team key" in result.stdout
    assert sorted(os.listdir(os.path.join(scratch, "step-000004"))) == sorted(os.listdir(step_dir(trained, NUM_STEPS)))

    # The same object damaged in S3 fails the drill.
    key = "team-a/job/step-000004/__1_0.distcp"
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=body[: len(body) // 2])
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", f"s3://{bucket}/team-a/job"],
                 launcher_env(**env), timeout=600)
    assert result.returncode == 1
    assert "__1_0.distcp" in result.stderr and "truncated" in result.stderr


def test_s3_without_a_complete_checkpoint_is_a_usage_error(s3_server):
    bucket, client, env = s3_server
    client.put_object(Bucket=bucket, Key="team-a/job/step-000002/__0_0.distcp", Body=b"partial")
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", f"s3://{bucket}/team-a/job"],
                 launcher_env(**env), timeout=120)
    assert result.returncode == 2
    assert "no complete checkpoint" in result.stderr and "step-000002" in result.stderr


@pytest.mark.slow
def test_a_three_rank_checkpoint_is_drilled_in_two_processes_and_one(tmp_path_factory, data_dir, monkeypatch):
    """The drill loaded one CPU process per recorded rank, each with a full copy of the state
    under DDP: 64 ranks of GPT-2, 64 x 2 GB of host memory for what two processes prove (DCP
    reshards on load; the collectives run)."""
    from trainer import verify as verify_mod

    ckpt = str(tmp_path_factory.mktemp("ckpt3"))
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": 2, "schedule.warmup_steps": 1,
                                                  "checkpoint.every_steps": 2, "tracking.enabled": "false"})
    result = run(torchrun_cmd(3, overrides), launcher_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    started = []
    real = verify_mod.run_workers

    def run_workers(path, world_size, *args, **kwargs):
        started.append(world_size)
        return real(path, world_size, *args, **kwargs)

    monkeypatch.setattr(verify_mod, "run_workers", run_workers)
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    said: list[str] = []
    problems = verify_mod.verify(step_dir(ckpt, 2), timeout_s=600, say=said.append)
    assert problems == [], problems
    assert started == [2, 1], started
    text = "\n".join(said)
    assert "world size 3" in text and "load in 2 processes" in text and "load in 1 process" in text, text
