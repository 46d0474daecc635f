"""`python -m trainer.evaluate` (the pipeline's evaluate step): the loss of the final checkpoint on the
held-out split, checked against the same weights loaded another way, and its bad-input exits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.trainer.trainer_helpers import REPO, TINY_CONFIG, checkpoint_tensors, tiny_overrides
from trainer import evaluate

SEQ_LEN = 32


@pytest.fixture(scope="module")
def split_data(tmp_path_factory, data_dir):
    """The session's token shards plus a held-out split (the tail of the first shard), in the
    manifest format `prepare-data --val-fraction` writes (`val_shards`)."""
    out = tmp_path_factory.mktemp("split")
    for name in os.listdir(data_dir):
        shutil.copy(os.path.join(data_dir, name), out / name)
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = np.load(out / manifest["shards"][0]["file"])
    np.save(out / "val-00000.npy", tokens[-(SEQ_LEN * 20 + 1):])
    manifest["val_shards"] = [{"file": "val-00000.npy", "num_tokens": SEQ_LEN * 20 + 1}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return str(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, split_data):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    cmd = [sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG,
           *tiny_overrides(split_data, ckpt, **{"schedule.num_steps": 6, "checkpoint.every_steps": 3,
                                                "tracking.enabled": "false", "model.dropout": 0.0})]
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return ckpt


def test_loss_of_the_newest_checkpoint_matches_an_independent_load(trained, split_data, tmp_path):
    out = tmp_path / "evaluation.json"
    final = tmp_path / "final-checkpoint"
    assert evaluate.main(["--checkpoint-dir", trained, "--data-dir", split_data, "--output", str(out),
                          "--final-checkpoint-file", str(final)]) == 0
    result = json.loads(out.read_text())
    assert result["step"] == 6 and result["checkpoint"].endswith("step-000006")
    assert final.read_text() == result["checkpoint"]
    assert result["num_tokens"] == 20 * SEQ_LEN

    # The same weights through DCP's full conversion to a torch.save file, the loss by hand.
    from trainer.model import build_model

    cfg = evaluate.checkpoint_config(result["checkpoint"])
    manifest = json.loads(open(os.path.join(split_data, "manifest.json")).read())
    model = build_model(cfg.model, manifest["vocab_size"], SEQ_LEN)
    flat = checkpoint_tensors(result["checkpoint"], tmp_path)
    model.load_state_dict({k[len("app.model."):]: v for k, v in flat.items() if k.startswith("app.model.")})
    model.eval()
    tokens = torch.from_numpy(np.load(os.path.join(split_data, "val-00000.npy")).astype(np.int64))
    windows = torch.stack([tokens[i:i + SEQ_LEN + 1] for i in range(0, 20 * SEQ_LEN, SEQ_LEN)])
    with torch.no_grad():
        logits = model(windows[:, :-1])
    expected = F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)).item()
    assert result["val_loss"] == pytest.approx(expected, rel=1e-5)
    # Only the newest complete checkpoint counts: the older one alone scores differently.
    older = tmp_path / "older"
    shutil.copytree(os.path.join(trained, "step-000003"), older / "step-000003")
    assert evaluate.evaluate(str(older), split_data)["step"] == 3
    assert evaluate.evaluate(str(older), split_data)["val_loss"] != pytest.approx(result["val_loss"])


def test_bad_inputs_exit_2_with_the_fix(trained, split_data, tmp_path, capsys):
    out = str(tmp_path / "e.json")
    data_dir = tmp_path / "no-split"
    shutil.copytree(split_data, data_dir)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    manifest["val_shards"] = []
    (data_dir / "manifest.json").write_text(json.dumps(manifest))
    data_dir = str(data_dir)
    # A dataset prepared without --val-fraction has no validation split.
    assert evaluate.main(["--checkpoint-dir", trained, "--data-dir", data_dir, "--output", out]) == 2
    assert "--val-fraction" in capsys.readouterr().err
    assert evaluate.main(["--checkpoint-dir", str(tmp_path), "--data-dir", data_dir, "--output", out]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert evaluate.main(["--checkpoint-dir", trained, "--data-dir", data_dir, "--output", out, "--tag", "oops"]) == 2
    assert not os.path.exists(out)
