"""The restore drill proves identity, not just loadability (issue 28 item 5): it evaluates the
restored model on the job's own held-out split and compares with the val_loss the job logged
at that step. A checkpoint whose weights load and train but are not the trained ones (here:
perturbed, every marker, RNG file and DCP byte range still consistent) must FAIL; before this
stage the drill passed it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.trainer.trainer_helpers import REPO, TINY_CONFIG, launcher_env, run, tiny_overrides
from trainer.checkpoint.layout import step_dir

STEPS = 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": STEPS, "checkpoint.every_steps": 4,
                                                  "evaluation.every_steps": 4, "tracking.enabled": "false",
                                                  "export.at_end": "false"})
    done = run([sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides], launcher_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return ckpt


def verify(source: str, *extra: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "trainer", "verify-checkpoint", source, *extra], launcher_env(), timeout=600)


def test_the_trained_checkpoint_matches_its_logged_val_loss(trained):
    result = verify(trained)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "held-out check: val_loss" in result.stdout
    assert "the job logged" in result.stdout and "VERDICT: PASS" in result.stdout


def test_weights_that_load_but_are_not_the_trained_model_fail(trained, tmp_path, data_dir):
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint import ModelAndOptimizer
    from trainer.contract.layout import MARKER
    from trainer.trust import trust_from_env
    from trainer.config import load_config
    from trainer.model import build_model
    from trainer.optim import build_optimizer

    root = str(tmp_path / "perturbed")
    shutil.copytree(step_dir(trained, STEPS), step_dir(root, STEPS))
    shutil.copy(os.path.join(trained, "metrics.jsonl"), os.path.join(root, "metrics.jsonl"))
    cfg = load_config(TINY_CONFIG, tiny_overrides(data_dir, root), environ={})
    model = build_model(cfg.model, 257, cfg.data.seq_len)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    app = ModelAndOptimizer(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=step_dir(root, STEPS), no_dist=True)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))  # finite, plausible, wrong
    dcp.save({"app": app}, checkpoint_id=step_dir(root, STEPS), no_dist=True)
    # Sealed again with the job's own key (the case the drill exists for: a checkpoint the job
    # itself wrote and signed, e.g. through a bug in the save path, that is not its model; a
    # tamper after the save is the manifest's to refuse, tests/trainer/test_checkpoint_trust.py).
    with open(os.path.join(step_dir(root, STEPS), MARKER)) as f:
        marker = json.load(f)
    trust_from_env(launcher_env()).seal(step_dir(root, STEPS), marker)

    result = verify(root, "--data-dir", data_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "VERDICT: FAIL" in result.stderr
    assert "is not the model that was trained to this step" in result.stderr


def test_without_a_logged_val_loss_the_stage_says_why_it_skipped(trained, tmp_path):
    root = str(tmp_path / "no-metrics")
    shutil.copytree(step_dir(trained, STEPS), step_dir(root, STEPS))
    result = verify(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "held-out check: skipped: no val_loss logged at step 8" in result.stdout
