"""Attacks on a team's checkpoint directory, from the attacker's seat (issue 18 item 3, review
security-3 C2): whoever can write `step-N/` into another team's checkpoint directory plants a
pickle that the victim's trainer would unpickle on its next restart, as the victim.

torch 2.13 `distributed/checkpoint/filesystem.py`, `FileSystemReader.read_metadata`:
    with self.fs.create_stream(path, "rb") as metadata_file:
        metadata = pickle.load(metadata_file)
and `default_planner.py`, `load_bytes`: `torch.load(value, weights_only=False)`.

Each attack plants a `.metadata` (or RNG file) whose unpickling would create a marker file,
then runs the victim's real trainer (or the restore drill) on it: the load is refused with a
message naming the reason, and the marker never appears. The control proves the payload is
live: plain `pickle.load` of the same bytes does create the marker."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import shutil
import sys

import pytest

from tests.trainer.trainer_helpers import TINY_CONFIG, launcher_env, run, tiny_overrides, torchrun_cmd
from trainer.checkpoint.layout import step_dir
from trainer.checkpoint.state import load_rng_file
from trainer.contract.layout import MARKER
from trainer.trust import KEY_FILE_ENV, MANIFEST, CheckpointTrust, sha256_file

STEPS = 2


class RunsCode:
    """A pickle that runs a shell command when unpickled (what the attacker plants)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_key(path, seed: str) -> str:
    path.write_bytes(hashlib.sha256(seed.encode()).hexdigest().encode())
    return str(path)


@pytest.fixture(scope="module")
def victim(tmp_path_factory, data_dir):
    """Team B's job: 2 ranks, a signed checkpoint at step 2."""
    base = tmp_path_factory.mktemp("victim")
    key = write_key(base / "key-b", "team-b")
    ckpt = str(base / "ckpt")
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": STEPS, "schedule.warmup_steps": 1,
                                                  "checkpoint.every_steps": STEPS, "tracking.enabled": "false"})
    result = run(torchrun_cmd(2, overrides), launcher_env(**{KEY_FILE_ENV: key}))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(os.path.join(step_dir(ckpt, STEPS), MANIFEST)) as f:
        assert json.load(f)["hmac_sha256"], "the trainer with a key writes a signed manifest"
    return {"ckpt": ckpt, "key": key, "data": data_dir, "attacker_key": write_key(base / "key-a", "team-a")}


def resume(victim, ckpt: str, steps: int = STEPS + 2, **env):
    # One process with twice the micro-batch: the victim's global batch of 2 ranks x 4.
    overrides = tiny_overrides(victim["data"], ckpt, **{"schedule.num_steps": steps, "schedule.warmup_steps": 1,
                                                        "checkpoint.every_steps": steps, "tracking.enabled": "false",
                                                        "data.micro_batch_size": 8})
    cmd = [sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides]
    return run(cmd, launcher_env(**{KEY_FILE_ENV: victim["key"], **env}))


def victim_copy(victim, tmp_path) -> str:
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(victim["ckpt"], ckpt)
    return ckpt


def plant_step(ckpt: str, step: int, marker: str) -> str:
    """The attacker's step directory: the victim's files, its `.metadata` replaced by code."""
    planted = step_dir(ckpt, step)
    shutil.copytree(step_dir(ckpt, STEPS), planted)
    with open(os.path.join(planted, ".metadata"), "wb") as f:
        pickle.dump(RunsCode(marker), f)
    with open(os.path.join(planted, MARKER)) as f:
        meta = json.load(f)
    with open(os.path.join(planted, MARKER), "w") as f:
        json.dump({**meta, "step": step}, f)
    return planted


def forge_manifest(planted: str, key: bytes | None) -> None:
    """A manifest the attacker computes over its own files, signed with the attacker's key."""
    from trainer.trust import _canonical

    names = sorted(f for f in os.listdir(planted) if f not in (MANIFEST, MARKER))
    with open(os.path.join(planted, MARKER)) as f:
        marker = json.load(f)
    body = {"format": 1, "step_dir": os.path.basename(planted), "marker": marker,
            "files": {n: {"sha256": sha256_file(os.path.join(planted, n)),
                          "bytes": os.path.getsize(os.path.join(planted, n))} for n in names}}
    signature = hmac.new(key, _canonical(body), hashlib.sha256).hexdigest() if key else None
    with open(os.path.join(planted, MANIFEST), "w") as f:
        json.dump({"body": body, "hmac_sha256": signature, "key_id": "attacker"}, f)


def test_control_the_planted_pickle_runs_code_when_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(RunsCode(str(marker))))
    assert marker.exists(), "the payload must be live, or the attacks below prove nothing"


def test_control_the_victims_own_signed_checkpoint_resumes(victim, tmp_path):
    ckpt = victim_copy(victim, tmp_path)
    result = resume(victim, ckpt)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isfile(os.path.join(step_dir(ckpt, STEPS + 2), MARKER))


def _no_manifest(planted, victim):
    os.remove(os.path.join(planted, MANIFEST))


def _signed_by_the_attackers_key(planted, victim):
    with open(victim["attacker_key"], "rb") as f:
        forge_manifest(planted, f.read().strip())


def _unsigned_manifest_with_correct_digests(planted, victim):
    forge_manifest(planted, None)


def _victims_manifest_kept(planted, victim):
    """The victim's genuine signed manifest copied along: only the step and .metadata differ."""


ATTACKS = [
    (_no_manifest, f"{MANIFEST}: missing"),
    (_signed_by_the_attackers_key, "the signature does not verify with this team's checkpoint key"),
    (_unsigned_manifest_with_correct_digests, "unsigned checkpoints are refused"),
    (_victims_manifest_kept, "a checkpoint moved to another step"),
]


@pytest.mark.parametrize("forge, reason", ATTACKS, ids=[a[0].__name__.strip("_") for a in ATTACKS])
def test_a_planted_newer_step_is_refused_and_its_pickle_never_runs(victim, tmp_path, forge, reason):
    ckpt = victim_copy(victim, tmp_path)
    marker = str(tmp_path / "pwned")
    planted = plant_step(ckpt, 3, marker)  # newer than the victim's step 2: `resume: auto` picks it
    forge(planted, victim)
    result = resume(victim, ckpt)
    assert not os.path.exists(marker), "the planted pickle ran"
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"checkpoint {planted} refused before loading anything from it" in result.stderr
    assert reason in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_metadata_swapped_inside_the_victims_own_newest_step_is_refused(victim, tmp_path):
    ckpt = victim_copy(victim, tmp_path)
    marker = str(tmp_path / "pwned")
    with open(os.path.join(step_dir(ckpt, STEPS), ".metadata"), "wb") as f:
        pickle.dump(RunsCode(marker), f)
    result = resume(victim, ckpt)
    assert not os.path.exists(marker)
    assert result.returncode == 1
    assert ".metadata: SHA-256" in result.stderr and "changed after the save" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_step_directory_owned_by_another_uid_is_refused(victim, tmp_path):
    """Another team's uid wrote it (each team runs as its own uid): refused even with a valid
    signature, since the signature alone would not stop a replay of files another uid controls."""
    ckpt = victim_copy(victim, tmp_path)
    os.chown(step_dir(ckpt, STEPS), 4242, 4242)
    # run the victim as a non-root uid would be: the check compares with the trainer's own uid
    result = resume(victim, ckpt)
    assert result.returncode == 1
    assert f"owned by uid 4242, not by this trainer's uid {os.geteuid()}" in result.stderr


def test_an_rng_file_that_is_a_pickle_is_never_unpickled(tmp_path):
    """Defence in depth under the manifest: RNG state is tensors, read with weights_only=True."""
    marker = tmp_path / "pwned"
    evil = tmp_path / "rng-rank-0.pt"
    with open(evil, "wb") as f:
        pickle.dump(RunsCode(str(marker)), f)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_rng_file(str(evil))
    assert not marker.exists()


def test_the_restore_drill_refuses_a_planted_checkpoint_before_unpickling(victim, tmp_path):
    ckpt = victim_copy(victim, tmp_path)
    marker = str(tmp_path / "pwned")
    planted = plant_step(ckpt, 3, marker)
    _signed_by_the_attackers_key(planted, victim)
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", ckpt],
                 launcher_env(**{KEY_FILE_ENV: victim["key"]}), timeout=300)
    assert not os.path.exists(marker)
    assert result.returncode == 1 and "VERDICT: FAIL" in result.stderr
    assert "refused before reading anything pickled from it" in result.stderr
    assert "the signature does not verify" in result.stderr


def test_no_key_inside_a_pod_is_bad_input_before_any_rank_starts(victim, tmp_path):
    ckpt = victim_copy(victim, tmp_path)
    env = launcher_env(KUBERNETES_SERVICE_HOST="10.100.0.1")
    env.pop(KEY_FILE_ENV, None)
    overrides = tiny_overrides(victim["data"], ckpt, **{"schedule.num_steps": STEPS + 2, "schedule.warmup_steps": 1,
                                                        "tracking.enabled": "false"})
    result = run(torchrun_cmd(1, overrides), env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{KEY_FILE_ENV} is not set in a Kubernetes pod" in result.stderr


def test_manifest_round_trip_and_tamper_units(tmp_path):
    """The seal/check pair on plain files: a byte changed, a file added, another key."""
    step = tmp_path / "ckpt" / "step-000001"
    step.mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"shard")
    (step / ".metadata").write_bytes(b"meta")
    marker = {"step": 1}
    trust = CheckpointTrust(b"k" * 32)
    trust.seal(str(step), marker)
    (step / MARKER).write_text(json.dumps(marker))
    assert trust.problems(str(step)) == []
    assert CheckpointTrust(b"x" * 32).problems(str(step))  # another team's key
    (step / "__0_0.distcp").write_bytes(b"shaRd")
    assert any("__0_0.distcp: SHA-256" in p for p in trust.problems(str(step)))
    (step / "__0_0.distcp").write_bytes(b"shard")
    (step / "__9_0.distcp").write_bytes(b"extra")
    assert any("not in manifest.json" in p for p in trust.problems(str(step)))


def test_the_run_id_added_to_a_marker_later_keeps_it_verified_and_nothing_else_does(tmp_path):
    """The trainer learns its MLflow run id after the first save and writes it into that marker
    (Checkpointer.annotate_newest): the manifest is re-signed for it, and a kill between the two
    writes (either side ahead) still verifies. Any other change to the marker is reported, and a
    manifest that no longer verifies is never re-signed."""
    step = tmp_path / "ckpt" / "step-000001"
    step.mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"shard")
    (step / ".metadata").write_bytes(b"meta")
    marker = {"step": 1, "mlflow_run_id": None}
    trust = CheckpointTrust(b"k" * 32)
    trust.seal(str(step), marker)
    (step / MARKER).write_text(json.dumps(marker))
    annotated = {**marker, "mlflow_run_id": "abc123"}
    (step / MARKER).write_text(json.dumps(annotated))  # marker ahead of the manifest
    assert trust.problems(str(step)) == []
    assert trust.reseal_marker(str(step), annotated)
    assert trust.problems(str(step)) == []
    (step / MARKER).write_text(json.dumps({**annotated, "step": 2}))
    assert any("differs from the marker" in p for p in trust.problems(str(step)))
    (step / MARKER).write_text(json.dumps({**annotated, "mlflow_run_id": "someone-else"}))
    assert any("differs from the marker" in p for p in trust.problems(str(step)))
    assert not CheckpointTrust(b"x" * 32).reseal_marker(str(step), annotated)  # another key: not re-signed
