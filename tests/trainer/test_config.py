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


def test_overrides_are_typed_by_their_field_not_by_yaml_1_1(tmp_path, data_dir):
    """PyYAML reads `off`/`no`/`on` as booleans (YAML 1.1): an enum value `off` was refused."""
    path = write(tmp_path, f"data:\n  dir: {data_dir}\ncheckpoint:\n  dir: /x\n  async_mode: off\n")
    cfg = load_config(path, [], environ={})
    assert cfg.checkpoint.async_mode == "off"  # unquoted in the file
    cfg = load_config(path, ["checkpoint.async_mode=thread", "checkpoint.async_mode=off", "parallelism.compile=on",
                             "parallelism.activation_checkpointing=no", "tracking.run_name=007", "tracking.job_id=12345",
                             "optimizer.lr=3e-4", "schedule.num_steps=1e3", "model.hf_path=null",
                             "tracking.experiment=yes", "parallelism.mixed_precision=fp32"], environ={})
    assert cfg.checkpoint.async_mode == "off"
    assert cfg.parallelism.compile is True and cfg.parallelism.activation_checkpointing is False
    assert cfg.tracking.run_name == "007" and cfg.tracking.job_id == "12345"  # text kept verbatim
    assert cfg.tracking.experiment == "yes" and type(cfg.tracking.experiment) is str
    assert cfg.optimizer.lr == 3e-4 and cfg.schedule.num_steps == 1000 and cfg.model.hf_path is None
    # Quoted values are strings on purpose; a string where a boolean is expected is refused.
    with pytest.raises(ConfigError, match=r"parallelism.compile='maybe': must be true or false"):
        load_config(path, ["parallelism.compile=maybe"], environ={})
    from trainer.config import dump_yaml

    assert load_config(write(tmp_path, dump_yaml(cfg)), [], environ={}) == cfg  # round trip through the dump


def test_non_finite_numbers_and_unsupported_tracking_uris_are_refused(tmp_path, data_dir):
    path = write(tmp_path, f"data:\n  dir: {data_dir}\ncheckpoint:\n  dir: /x\noptimizer:\n  lr: .nan\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["optimizer.weight_decay=.inf", "optimizer.grad_clip_norm=-.inf", "checkpoint.every_seconds=nan"],
                    environ={"MLFLOW_TRACKING_URI": "postgresql://db/mlflow"})
    text = str(err.value)
    for field in ("optimizer.lr='.nan'", "optimizer.weight_decay='.inf'", "optimizer.grad_clip_norm='-.inf'",
                  "checkpoint.every_seconds='nan'"):
        assert f"{field}: must be a finite number" in text
    with pytest.raises(ConfigError) as err:
        load_config(path.replace("c.yaml", "c.yaml"), ["optimizer.lr=1e-3"],
                    environ={"MLFLOW_TRACKING_URI": "postgresql://db/mlflow"})
    assert "tracking.uri='postgresql://db/mlflow' (or MLFLOW_TRACKING_URI): scheme 'postgresql' is not supported" in str(err.value)
    for uri in ("http://mlflow:5000", "https://mlflow.example.com", "file:///tmp/mlruns", "sqlite:////tmp/m.db"):
        load_config(path, ["optimizer.lr=1e-3", f"tracking.uri={uri}"], environ={})
    for uri, message in (("/tmp/mlruns", "has no scheme"), ("http://", "has no host"), ("databricks://x", "not supported")):
        with pytest.raises(ConfigError, match=message):
            load_config(path, ["optimizer.lr=1e-3", f"tracking.uri={uri}"], environ={})


def test_config_file_problems_name_the_file_and_position(tmp_path):
    with pytest.raises(ConfigError, match=r"--config='/no/such.yaml': file not found"):
        load_config("/no/such.yaml", [], environ={})
    bad = write(tmp_path, "model:\n  size: tiny\n data: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column 2"):
        load_config(bad, [], environ={})
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(write(tmp_path, "- a\n- b\n"), [], environ={})
