"""A tenant's checkpoint read by the platform operator, from the attacker's seat (issue 34 item 1,
review security-4 N1 and N9).

The attacker is team A, or any code running in a team-A pod: it may write anything into its own
checkpoint directory and S3 prefix, and it can read its own team's `checkpoint-signing` Secret, so
it can sign what it writes. It plants a step whose `.metadata` (or one byte item of a shard) is a
pickle that creates a marker file when unpickled, then waits for someone with more rights to read
it: the operator running the restore drill, an export or an evaluation off-cluster (no team key,
the platform's credentials), or another job of the team starting from it (`initFrom`).

torch 2.13 reads both with pickle: `FileSystemReader.read_metadata` is `pickle.load(metadata_file)`
(`distributed/checkpoint/filesystem.py`) and `DefaultLoadPlanner.load_bytes` is
`torch.load(value, weights_only=False)` (`default_planner.py`).

What refuses each attack now:
1. off-cluster, without the team's key, a reader never trusts a checkpoint it did not create: an
   `s3://` source is refused outright, and a local one whose manifest is signed (every pod signs)
   cannot be verified here, so it is refused (trainer/trust.py `CheckpointTrust(require_key=...)`);
2. under that, pickle is gone from the load path: `.metadata` is read by an unpickler that admits
   only the classes DCP metadata holds, and byte items by `torch.load(weights_only=True)`
   (trainer/safe_load.py). A checkpoint the trust layer lets through (an unsigned local copy, or one
   signed with the team's key and read with it) still cannot run code.
Every test asserts that the marker file never appears and that the tool exits non-zero with a
message naming the reason.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sys

import pytest
import torch

from tests.trainer.test_checkpoint_trust import RunsCode, forge_manifest, write_key
from tests.trainer.trainer_helpers import TINY_CONFIG, launcher_env, run, tiny_overrides
from trainer.checkpoint.layout import step_dir
from trainer.contract.layout import MARKER
from trainer.trust import KEY_FILE_ENV, CheckpointTrust

STEPS = 2


@pytest.fixture(scope="module")
def tenant(tmp_path_factory, data_dir):
    """Team A's job, trained in its pod (with its key): a signed checkpoint at step 2."""
    base = tmp_path_factory.mktemp("tenant")
    key = write_key(base / "key-a", "team-a")
    ckpt = str(base / "ckpt")
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": STEPS, "schedule.warmup_steps": 1,
                                                  "checkpoint.every_steps": STEPS, "tracking.enabled": "false",
                                                  "export.at_end": "false"})
    result = run([sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides],
                 launcher_env(**{KEY_FILE_ENV: key}))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(key, "rb") as f:
        return {"ckpt": ckpt, "key": key, "key_bytes": f.read().strip(), "data": data_dir}


def operator_env(**extra: str) -> dict[str, str]:
    """The operator's shell: no team key, not in a pod (what the old runbook prescribed)."""
    env = launcher_env(**extra)
    for name in (KEY_FILE_ENV, "KUBERNETES_SERVICE_HOST"):
        if name not in extra:
            env.pop(name, None)
    return env


def planted(tenant, tmp_path, signed_by_team: bool) -> tuple[str, str, str]:
    """The attacker's checkpoint directory: the tenant's step with `.metadata` replaced by code,
    and a manifest over the planted files, unsigned or signed with the team's own key.
    Returns (checkpoint dir, step dir, marker path)."""
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(tenant["ckpt"], ckpt)
    step = step_dir(ckpt, STEPS)
    marker = str(tmp_path / "pwned")
    with open(os.path.join(step, ".metadata"), "wb") as f:
        pickle.dump(RunsCode(marker), f)
    forge_manifest(step, tenant["key_bytes"] if signed_by_team else None)
    return ckpt, step, marker


MANIFESTS = [False, True]
MANIFEST_IDS = ["unsigned-manifest", "manifest-signed-with-the-teams-own-key"]


def assert_refused(result, marker: str, *reasons: str) -> None:
    out = result.stdout + result.stderr
    assert not os.path.exists(marker), f"the tenant's pickle ran in the operator's process:\n{out[-3000:]}"
    assert result.returncode != 0, out[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for reason in reasons:
        assert reason in out, out[-3000:]


# -- the restore drill off-cluster (the old runbook, `checkpoints --verify`) -------------------------
@pytest.fixture
def s3(tmp_path):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    import boto3

    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket="checkpoints")
    yield client, {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_DEFAULT_REGION": "us-east-1"}
    server.stop()


@pytest.mark.parametrize("signed_by_team", MANIFESTS, ids=MANIFEST_IDS)
def test_the_drill_from_s3_without_the_team_key_refuses_the_tenants_checkpoint(tenant, tmp_path, s3, signed_by_team):
    """Audit N1's proof of concept: team A writes the step into its own prefix; the operator runs
    `verify-checkpoint s3://...` with the platform's credentials and no key."""
    client, env = s3
    _, step, marker = planted(tenant, tmp_path, signed_by_team)
    for name in os.listdir(step):
        client.upload_file(os.path.join(step, name), "checkpoints", f"team-a/job/{os.path.basename(step)}/{name}")
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", "s3://checkpoints/team-a/job"],
                 operator_env(**env), timeout=300)
    assert_refused(result, marker, "VERDICT: FAIL", "refused before reading anything pickled from it",
                   f"no checkpoint key ({KEY_FILE_ENV} is not set)")


@pytest.mark.parametrize("signed_by_team", MANIFESTS, ids=MANIFEST_IDS)
def test_the_drill_on_a_local_copy_refuses_the_tenants_pickle(tenant, tmp_path, signed_by_team):
    """The operator copied the prefix to its laptop (`aws s3 sync`): the files are now its own.
    A signed manifest cannot be verified here; an unsigned one passes the trust layer and meets
    the restricted unpickler."""
    ckpt, _, marker = planted(tenant, tmp_path, signed_by_team)
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", ckpt], operator_env(), timeout=300)
    reason = ("no key here to verify it" if signed_by_team
              else "it names posix.system, which is not one of the classes")
    assert_refused(result, marker, "VERDICT: FAIL", reason)


def test_the_drill_with_the_team_key_still_never_unpickles_the_tenants_code(tenant, tmp_path):
    """The old runbook's other option: the drill off-cluster with the team's key. The tenant
    signed its planted step with that key, so the signature verifies; the unpickler refuses."""
    ckpt, _, marker = planted(tenant, tmp_path, signed_by_team=True)
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", ckpt],
                 operator_env(**{KEY_FILE_ENV: tenant["key"]}), timeout=300)
    assert_refused(result, marker, "VERDICT: FAIL", ".metadata: refused", "it names posix.system, which is not one of the classes")


# -- export and evaluate off-cluster --------------------------------------------------------------------
@pytest.mark.parametrize("signed_by_team", MANIFESTS, ids=MANIFEST_IDS)
def test_export_refuses_the_tenants_checkpoint(tenant, tmp_path, signed_by_team):
    _, step, marker = planted(tenant, tmp_path, signed_by_team)
    result = run([sys.executable, "-m", "trainer", "export", "--checkpoint", step, "--out", str(tmp_path / "model")],
                 operator_env(), timeout=300)
    assert_refused(result, marker, "no key here to verify it" if signed_by_team else "it names posix.system, which is not one of the classes")
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.parametrize("signed_by_team", MANIFESTS, ids=MANIFEST_IDS)
def test_evaluate_refuses_the_tenants_checkpoint(tenant, tmp_path, signed_by_team):
    ckpt, _, marker = planted(tenant, tmp_path, signed_by_team)
    out = tmp_path / "evaluation.json"
    result = run([sys.executable, "-m", "trainer.evaluate", "--checkpoint-dir", ckpt, "--data-dir", tenant["data"],
                  "--output", str(out)], operator_env(), timeout=300)
    assert_refused(result, marker, "no key here to verify it" if signed_by_team else "it names posix.system, which is not one of the classes")
    assert not out.exists()


# -- initFrom inside the team (N9) and byte items (second layer) ------------------------------------------
def train_in_pod(tenant, ckpt: str, steps: int, **overrides):
    args = tiny_overrides(tenant["data"], ckpt, **{"schedule.num_steps": steps, "schedule.warmup_steps": 1,
                                                   "checkpoint.every_steps": steps, "tracking.enabled": "false",
                                                   "export.at_end": "false", **overrides})
    return run([sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG, *args],
               launcher_env(**{KEY_FILE_ENV: tenant["key"]}), timeout=300)


def test_init_from_a_planted_unsigned_step_is_refused(tenant, tmp_path):
    """N9: code in any pod of the team plants a step with an unsigned manifest into another job's
    directory; a new job of the team starts from it with `initFrom` (the trainer has the key)."""
    _, step, marker = planted(tenant, tmp_path, signed_by_team=False)
    result = train_in_pod(tenant, str(tmp_path / "new-job"), 1, **{"checkpoint.initial_load_path": step})
    assert_refused(result, marker, f"checkpoint {step} refused before loading anything from it",
                   "unsigned checkpoints are refused")


def plant_byte_item(step: str, fqn: str, marker: str, key: bytes) -> None:
    """Replaces one byte item of a shard by a torch.save of code, re-points the (clean) metadata at
    it and re-signs the manifest with the team's key: everything the trust layer checks is in order."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    metadata = FileSystemReader(step).read_metadata()
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    blob = io.BytesIO()
    torch.save(RunsCode(marker), blob)
    shard = os.path.join(step, info.relative_path)
    offset = os.path.getsize(shard)
    with open(shard, "ab") as f:
        f.write(blob.getvalue())
    metadata.storage_data[index] = _StorageInfo(info.relative_path, offset, len(blob.getvalue()))
    metadata.storage_meta = None
    with open(os.path.join(step, ".metadata"), "wb") as f:
        pickle.dump(metadata, f)
    with open(os.path.join(step, MARKER)) as f:
        CheckpointTrust(key).seal(step, json.load(f))


def test_a_byte_item_that_runs_code_is_refused_on_resume(tenant, tmp_path):
    """The team's own key signs the planted step, so the trust layer passes; DCP's default planner
    would `torch.load(weights_only=False)` the optimizer's param_groups items."""
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(tenant["ckpt"], ckpt)
    marker = str(tmp_path / "pwned")
    plant_byte_item(step_dir(ckpt, STEPS), "app.optim.param_groups.0.weight_decay", marker, tenant["key_bytes"])
    result = train_in_pod(tenant, ckpt, STEPS + 1)
    assert_refused(result, marker, "app.optim.param_groups.0.weight_decay", "weights_only")


# -- the restricted unpickler itself -------------------------------------------------------------------------
def test_the_metadata_of_real_checkpoints_loads_and_nothing_else_does(tenant, tmp_path):
    """What DCP 2.13 pickles into `.metadata` for this trainer's checkpoints (listed with a
    tracing unpickler on DDP and FSDP2 saves): the allowlist admits it; a global outside it is
    refused by name before anything is called."""
    from torch.distributed.checkpoint.metadata import Metadata

    from trainer.safe_load import ForbiddenPickle, read_metadata

    metadata = read_metadata(step_dir(tenant["ckpt"], STEPS))
    assert isinstance(metadata, Metadata) and any(k.startswith("app.optim.") for k in metadata.state_dict_metadata)
    marker = tmp_path / "pwned"
    for payload in (RunsCode(str(marker)), {"x": print}, [eval]):
        step = tmp_path / f"step-{len(os.listdir(tmp_path)):06d}"
        step.mkdir()
        (step / ".metadata").write_bytes(pickle.dumps(payload))
        with pytest.raises(ForbiddenPickle, match="is not one of the classes"):
            read_metadata(str(step))
    assert not marker.exists()
