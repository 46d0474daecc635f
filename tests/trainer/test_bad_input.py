"""`python -m trainer train` with bad input: exit 2, every problem named (field, value, fix),
no traceback, and no process group (nothing is started before the checks)."""
import os
import shutil
import subprocess
import sys

import pytest

from trainer.config import ConfigError, load_config
from trainer.preflight import preflight
from trainer_helpers import REPO, TINY_CONFIG


def cli(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINER_"))}
    environ.update({"PYTHONPATH": REPO, **(env or {})})
    return subprocess.run([sys.executable, "-m", "trainer", "train", *args], capture_output=True, text=True,
                          cwd=REPO, env=environ, timeout=120)


def test_cli_reports_every_problem_with_exit_2_and_no_traceback(tmp_path, data_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = cli("--config", TINY_CONFIG, f"data.dir={data_dir}", f"checkpoint.dir={blocker}/ckpt",
                 "data.seq_len=100000", "optimizer.lr=.inf", env={"MLFLOW_TRACKING_URI": "mysql://db"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # Parse-time problems first (non-finite lr, URI scheme); all of them in one message.
    assert "optimizer.lr='.inf': must be a finite number" in result.stderr
    result = cli("--config", TINY_CONFIG, f"data.dir={data_dir}", f"checkpoint.dir={blocker}/ckpt", "data.seq_len=10000000",
                 "evaluation.every_steps=5")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for expected in (f"checkpoint.dir='{blocker}/ckpt': '{blocker}' is a file",
                     "data.seq_len=10000000: no shard of", "evaluation.every_steps=5:"):
        assert expected in result.stderr, result.stderr
    assert "process group" not in result.stderr.lower()
    missing = cli("--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "file not found" in missing.stderr and "Traceback" not in missing.stderr


def test_preflight_sizes_against_data_and_memory(tmp_path, data_dir):
    cfg = load_config(TINY_CONFIG, [f"data.dir={data_dir}", f"checkpoint.dir={tmp_path}/ckpt", "model.size=gpt2",
                                    "data.micro_batch_size=100000", "model.vocab_size=100"], environ={})
    with pytest.raises(ConfigError) as err:
        preflight(cfg, world_size=2, memory=(1 * 2**30, "a test GPU"))
    problems = "\n".join(err.value.problems)
    assert "data.micro_batch_size=100000: one micro-step needs 200000 windows (x world size 2)" in problems
    assert "model.vocab_size=100: the dataset uses 257 token ids" in problems
    assert "model.size='gpt2'" in problems and "a test GPU has 1.0 GiB" in problems
    # FSDP over enough ranks shards the state below the limit; a sane config passes.
    ok = load_config(TINY_CONFIG, [f"data.dir={data_dir}", f"checkpoint.dir={tmp_path}/ckpt"], environ={})
    preflight(ok, world_size=2, memory=(2 * 2**30, "a test GPU"))
    fsdp = load_config(TINY_CONFIG, [f"data.dir={data_dir}", f"checkpoint.dir={tmp_path}/ckpt", "model.size=gpt2",
                                     "parallelism.strategy=fsdp"], environ={})
    preflight(fsdp, world_size=8, memory=(1 * 2**30, "a test GPU"))
    with pytest.raises(ConfigError, match="model.size='gpt2'"):
        preflight(fsdp, world_size=1, memory=(1 * 2**30, "a test GPU"))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to another uid")
def test_unwritable_checkpoint_dir_is_refused_with_exit_2_naming_the_field(data_dir):
    """From outside the process, as the kernel enforces it: the trainer runs as another uid
    (a pod's uid against a root-owned FSx directory) and the directory is root's 0755. The
    preflight's write probe fails with EACCES: exit 2, the field and the fix, no traceback.

    The dropped uid keeps one capability, CAP_DAC_READ_SEARCH ("bypass file read permission checks
    and directory read and execute permission checks", capabilities(7)): it reads the checkout, the
    config and the interpreter wherever they live (a clone under a private directory, a 0700 home),
    as a pod reads its image. It grants no write, so the write probe still meets the kernel's
    ordinary check against the root-owned 0755 directory."""
    import tempfile

    base = tempfile.mkdtemp(prefix="ckpt-ro-")
    try:
        os.chmod(base, 0o755)
        owned = os.path.join(base, "root-owned")
        os.mkdir(owned, 0o755)
        data = os.path.join(base, "data")
        shutil.copytree(data_dir, data)
        for root, dirs, files in os.walk(base):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
        os.chmod(owned, 0o755)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINER_"))},
               "PYTHONPATH": REPO, "HOME": base, "PYTHONDONTWRITEBYTECODE": "1"}
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--bounding-set=-all,+dac_read_search",
             "--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search", sys.executable, "-m", "trainer", "train",
             "--config", str(TINY_CONFIG), f"data.dir={data}", f"checkpoint.dir={owned}/job"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert f"checkpoint.dir='{owned}/job': its nearest existing parent '{owned}' is not writable by uid 65534" in result.stderr
        assert "Permission denied" in result.stderr and "Traceback" not in result.stderr
        assert os.listdir(owned) == []  # nothing half-done: no probe file, no directory left behind
    finally:
        shutil.rmtree(base)


def test_the_launcher_refuses_bad_input_with_exit_2_before_starting_torchrun(tmp_path):
    """The production entry point (`python -m trainer.launch ... -m trainer train`): a bad config
    is exit 2 with the trainer's message once, not torchrun's exit 1 after every rank failed."""
    from trainer_helpers import launcher_env, torchrun_cmd

    from trainer.launch import launch_world_size

    cmd = torchrun_cmd(2, [f"data.dir={tmp_path}/missing", f"checkpoint.dir={tmp_path}/ckpt", "optimizer.lr=.nan"])
    result = subprocess.run(cmd, env=launcher_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "optimizer.lr" in result.stderr and "not starting torchrun" in result.stderr
    assert "torchrun exited" not in result.stderr and "Traceback" not in result.stderr
    assert launch_world_size(["--nnodes=2", "--nproc-per-node", "8"]) == 16
    assert launch_world_size(["--nproc-per-node=gpu"]) is None
    assert launch_world_size(["--standalone"]) == 1
