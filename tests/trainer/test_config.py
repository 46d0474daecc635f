import pytest

from trainer.config import ConfigError, TrainerConfig, load_config, parse_overrides


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_overrides_and_env_are_typed_and_layered(tmp_path, data_dir):
    path = write(tmp_path, f"data:\n  dir: {data_dir}\noptimizer:\n  lr: 1e-3\ncheckpoint:\n  dir: /from/file\n")
    cfg = load_config(path, ["optimizer.lr=3e-4", "parallelism.compile=true", "schedule.num_steps=70"],
                      environ={"TRAINER_CHECKPOINT_DIR": "/fsx/ckpt", "TRAINER_RUN_ID": "job-42"})
    assert cfg.optimizer.lr == 3e-4 and isinstance(cfg.optimizer.lr, float)
    assert cfg.parallelism.compile is True
    assert cfg.schedule.num_steps == 70
    assert cfg.checkpoint.dir == "/fsx/ckpt"  # environment beats the file
    assert cfg.tracking.job_id == "job-42"
    cfg2 = load_config(path, ["checkpoint.dir=/cli"], environ={"TRAINER_CHECKPOINT_DIR": "/fsx/ckpt"})
    assert cfg2.checkpoint.dir == "/cli"  # the command line beats the environment


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path, "model:\n  size: huge\n  dropot: 0.1\noptimizer:\n  lr: -1\nschedule:\n  num_steps: abc\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["parallelism.strategy=tp"], environ={})
    text = str(err.value)
    assert "model.dropot: unknown key (did you mean model.dropout?)" in text
    assert "schedule.num_steps='abc': must be an integer" in text
    assert "parallelism.strategy='tp': must be one of" in text
    # Type errors stop before cross-field checks; fix them and the rest are listed together.
    path = write(tmp_path, "model:\n  size: huge\noptimizer:\n  lr: -1\nschedule:\n  warmup_steps: 500\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [], environ={})
    problems = err.value.problems
    joined = "\n".join(problems)
    for expected in ("model.size='huge'", "optimizer.lr=-1.0", "schedule.warmup_steps=500", "data.dir=None",
                     "checkpoint.dir=None"):
        assert expected in joined
    assert len(problems) >= 5


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["optimizer.lr"])


def test_config_hash_ignores_paths_but_not_math():
    a, b = TrainerConfig(), TrainerConfig()
    b.checkpoint.dir, b.data.dir, b.tracking.experiment = "/elsewhere", "/other", "x"
    assert a.hash() == b.hash()
    b.optimizer.lr = 1.0
    assert a.hash() != b.hash()
