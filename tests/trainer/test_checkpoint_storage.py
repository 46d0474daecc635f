import json
import os

import pytest

from trainer.checkpoint import MARKER, latest_complete, list_steps, step_dir, write_json_atomic
from trainer.s3 import S3Mirror


def fake_checkpoint(root, step, complete=True):
    path = step_dir(root, step)
    os.makedirs(path)
    with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
        f.write(os.urandom(64))
    if complete:
        write_json_atomic(os.path.join(path, MARKER), {"step": step})
    return path


def test_only_marked_directories_are_checkpoints(tmp_path):
    root = str(tmp_path)
    fake_checkpoint(root, 10)
    fake_checkpoint(root, 20)
    fake_checkpoint(root, 30, complete=False)  # killed mid-save
    os.makedirs(os.path.join(root, "step-abc"))
    assert list_steps(root) == [10, 20]
    assert latest_complete(root) == step_dir(root, 20)
    assert latest_complete(str(tmp_path / "missing")) is None


@pytest.fixture
def s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket="ckpts")
    yield client
    server.stop()


def test_s3_mirror_uploads_marker_last_and_restores_newest_complete(tmp_path, s3):
    root = str(tmp_path / "fsx")
    mirror = S3Mirror("s3://ckpts/jobs/j1", client=s3)
    for step in (10, 20):
        mirror.upload(fake_checkpoint(root, step))
    mirror.close()
    # An upload that died before its marker: present in S3 but not complete.
    s3.put_object(Bucket="ckpts", Key="jobs/j1/step-000030/__0_0.distcp", Body=b"partial")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]]
    assert "jobs/j1/step-000020/complete.json" in keys

    fresh = str(tmp_path / "new-fsx")  # a lost volume
    S3Mirror("s3://ckpts/jobs/j1", client=s3).download_latest(fresh)
    assert list_steps(fresh) == [20]
    with open(os.path.join(step_dir(fresh, 20), MARKER)) as f:
        assert json.load(f)["step"] == 20
    with open(os.path.join(step_dir(fresh, 20), "__0_0.distcp"), "rb") as a, \
         open(os.path.join(step_dir(root, 20), "__0_0.distcp"), "rb") as b:
        assert a.read() == b.read()
