import json
import os

import pytest

from trainer.checkpoint.layout import latest_complete, list_steps, step_dir
from trainer.contract.layout import MARKER
from trainer.durable import write_json_atomic
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


class Recording:
    """Wraps a boto3 client, recording every object write and delete in order."""

    def __init__(self, client, upload_delay=0.0):
        self.client = client
        self.calls = []
        self.upload_delay = upload_delay

    def upload_file(self, path, bucket, key, **kwargs):
        import time

        time.sleep(self.upload_delay)
        self.calls.append(("put", key))
        return self.client.upload_file(path, bucket, key, **kwargs)

    def delete_object(self, Bucket, Key):
        self.calls.append(("delete", Key))
        return self.client.delete_object(Bucket=Bucket, Key=Key)

    def delete_objects(self, Bucket, Delete):
        self.calls += [("delete", o["Key"]) for o in Delete["Objects"]]
        return self.client.delete_objects(Bucket=Bucket, Delete=Delete)

    def __getattr__(self, name):
        return getattr(self.client, name)


def keys(s3, prefix="jobs/j1/"):
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpts", Prefix=prefix).get("Contents", []))


def test_s3_marker_is_the_last_object_of_each_upload(tmp_path, s3):
    root = str(tmp_path / "fsx")
    client = Recording(s3)
    mirror = S3Mirror("s3://ckpts/jobs/j1", client=client)
    for step in (10, 20):
        path = fake_checkpoint(root, step)
        for extra in ("rng-rank-0.pt", "config.yaml", "zz-last-name.distcp"):  # names sorting after the marker
            open(os.path.join(path, extra), "w").write("x")
        mirror.upload(path)
    mirror.close()
    for step in ("step-000010", "step-000020"):
        puts = [k for op, k in client.calls if op == "put" and f"/{step}/" in k]
        assert len(puts) == 5 and puts[-1].endswith(MARKER), puts


def test_s3_mirror_follows_retention_and_tolerates_vanished_directories(tmp_path, s3):
    import shutil

    root = str(tmp_path / "fsx")
    client = Recording(s3)
    mirror = S3Mirror("s3://ckpts/jobs/retention", client=client)
    mirror.upload(fake_checkpoint(root, 10))
    doomed = fake_checkpoint(root, 20)
    shutil.rmtree(doomed)  # retention removed it while its upload was queued
    mirror.upload(doomed)
    mirror.prune([10])
    mirror.close()  # no exception: a vanished directory is not a failure
    assert keys(s3, "jobs/retention/") == []
    deletes = [k for op, k in client.calls if op == "delete" and "step-000010" in k]
    assert deletes[0].endswith(MARKER)  # the marker goes first, as locally


def test_s3_mirror_respects_the_shutdown_budget(tmp_path, s3):
    import time

    root = str(tmp_path / "fsx")
    mirror = S3Mirror("s3://ckpts/jobs/budget", client=Recording(s3, upload_delay=0.5))
    for step in (10, 20, 30):
        mirror.upload(fake_checkpoint(root, step))
    started = time.perf_counter()
    mirror.close(budget_seconds=0.2)
    assert time.perf_counter() - started < 1.5  # not the 3 s all uploads take
    time.sleep(1.0)  # the upload in progress stops before its marker
    assert not [k for k in keys(s3, "jobs/budget/") if k.endswith(MARKER)]


# --- issue 19 item 7: a rollback is mirrored to S3 ----------------------------------------------------

def marker_of(s3, key):
    return json.loads(s3.get_object(Bucket="ckpts", Key=key)["Body"].read())


def test_a_rollback_is_mirrored_so_a_lost_volume_restores_the_new_branch(tmp_path, s3):
    """Review trainer-3 B3 / E6: after a rollback to step 20, S3 kept the abandoned steps 30 and
    40 with their markers, and after a lost volume `resume: auto` restored step 40 (branch A)."""
    import shutil
    import types

    from trainer.checkpoint import resolve_resume

    env = types.SimpleNamespace(distributed=False, is_main=True)
    root = str(tmp_path / "fsx")
    client = Recording(s3)
    mirror = S3Mirror("s3://ckpts/jobs/rb", client=client)
    for step in (20, 30, 40):  # branch A
        mirror.upload(fake_checkpoint(root, step))
    mirror.close()
    assert [k for k in keys(s3, "jobs/rb/") if k.endswith(MARKER)] == [f"jobs/rb/step-0000{s}/{MARKER}" for s in (20, 30, 40)]
    mirror = S3Mirror("s3://ckpts/jobs/rb", client=client)
    assert resolve_resume(root, step_dir(root, 20), env, mirror) == step_dir(root, 20)  # the rollback
    # Branch B saves step 25, then step 30 again: the same name as an abandoned checkpoint.
    mirror.upload(fake_checkpoint(root, 25))
    mirror.close()  # the rollback's S3 deletions and this upload are done
    mirror = S3Mirror("s3://ckpts/jobs/rb", client=client)
    client.calls.clear()
    new30 = fake_checkpoint(root, 30)
    write_json_atomic(os.path.join(new30, MARKER), {"step": 30, "saved_at": 2.0, "branch": "B"})
    mirror.upload(new30)
    mirror.close()
    markers = [k for k in keys(s3, "jobs/rb/") if k.endswith(MARKER)]
    assert markers == [f"jobs/rb/step-0000{s}/{MARKER}" for s in (20, 25, 30)]  # 40 is gone
    first = [c for c in client.calls if "step-000030" in c[1]][0]
    assert first == ("delete", f"jobs/rb/step-000030/{MARKER}")  # the old marker goes before any new file

    shutil.rmtree(root)  # the volume is lost
    mirror = S3Mirror("s3://ckpts/jobs/rb", client=s3)
    restored = resolve_resume(root, "auto", env, mirror)
    assert restored == step_dir(root, 30)
    with open(os.path.join(restored, MARKER)) as f:
        assert json.load(f)["branch"] == "B"


def test_ensure_compares_the_marker_content_not_only_its_name(tmp_path, s3):
    root = str(tmp_path / "fsx")
    mirror = S3Mirror("s3://ckpts/jobs/ensure", client=s3)
    path = fake_checkpoint(root, 30)
    write_json_atomic(os.path.join(path, MARKER), {"step": 30, "saved_at": 1.0, "config_hash": "a"})
    mirror.upload(path)
    mirror.close()
    # The same name, another checkpoint (a branch after a rollback): ensure() must upload it.
    write_json_atomic(os.path.join(path, MARKER), {"step": 30, "saved_at": 2.0, "config_hash": "a"})
    client = Recording(s3)
    mirror = S3Mirror("s3://ckpts/jobs/ensure", client=client)
    mirror.ensure(path)
    mirror.close()
    assert marker_of(s3, f"jobs/ensure/step-000030/{MARKER}")["saved_at"] == 2.0
    # The very same checkpoint: nothing is uploaded again.
    client.calls.clear()
    mirror = S3Mirror("s3://ckpts/jobs/ensure", client=client)
    mirror.ensure(path)
    mirror.close()
    assert client.calls == []


def test_the_shutdown_budget_also_stops_a_file_already_uploading(tmp_path, s3):
    """Review trainer-3 B14: `stopping` was checked only between files, so a multi-GB shard in
    flight went on past the budget (and the interpreter joins the upload thread at exit)."""
    import time

    root = str(tmp_path / "fsx")
    path = fake_checkpoint(root, 10)
    with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
        f.write(os.urandom(96 * 1024 * 1024))  # a 96 MB shard: a multipart upload of 12 parts
    mirror = S3Mirror("s3://ckpts/jobs/inflight", client=s3)
    mirror.upload(path)
    deadline = time.time() + 30
    while time.time() < deadline and not s3.list_multipart_uploads(Bucket="ckpts").get("Uploads"):
        time.sleep(0.01)  # the shard's upload is under way
    mirror.close(budget_seconds=0.0)
    upload = mirror.futures[0]
    deadline = time.time() + 30
    while time.time() < deadline and not upload.done():
        time.sleep(0.05)
    assert upload.done()
    assert keys(s3, "jobs/inflight/") == []  # the shard was cut off, and no marker
