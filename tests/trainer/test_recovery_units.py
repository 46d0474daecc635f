"""Failure recovery, one mechanism at a time, in this process (no torchrun)."""
import json
import os
import shutil
from concurrent.futures import Future

import pytest
import torch

import trainer.checkpoint as ckpt_mod
from trainer.checkpoint import Checkpointer, resolve_resume
from trainer.branch import ROLLBACK
from trainer.checkpoint.layout import list_steps, remove_checkpoint, step_dir
from trainer.checkpoint.ownership import Ownership
from trainer.contract.layout import MARKER
from trainer.durable import write_json_atomic
from trainer.distributed import Env
from trainer.guards import NonFiniteSteps, TrainingStopped, apply_optimizer_config, check_resume_compatible
from trainer.launch import EXIT_PREEMPTED, checkpoint_line, exit_code, worker_reports
from trainer.s3 import NoMirror
from trainer.tracking import MLflowTracker

ENV = Env(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")


def fake_checkpoint(root, step, complete=True):
    path = step_dir(root, step)
    os.makedirs(path, exist_ok=True)
    for name in ("__0_0.distcp", ".metadata"):
        with open(os.path.join(path, name), "wb") as f:
            f.write(os.urandom(64))
    if complete:
        write_json_atomic(os.path.join(path, MARKER), {"step": step})
    return path


def whole(root):
    """Every directory with a marker still has its shards."""
    return all(os.path.exists(os.path.join(step_dir(root, s), "__0_0.distcp")) for s in list_steps(root))


# --- item 12: deletion never leaves a marker without its shards ----------------------------

def test_a_kill_during_deletion_never_leaves_a_marker_without_shards(tmp_path, monkeypatch):
    root = str(tmp_path)
    fake_checkpoint(root, 10)
    real_rmtree = shutil.rmtree

    def killed_half_way(path, ignore_errors=False):
        # rmtree removes entries in directory order; a kill after the first file is the worst case.
        os.remove(os.path.join(path, "__0_0.distcp"))
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        remove_checkpoint(root, 10)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert list_steps(root) == [] and whole(root)  # renamed away first: not a checkpoint any more
    ckpt_mod.sweep_trash(root)
    assert os.listdir(root) == []


# --- item 2: rollback semantics ---------------------------------------------------------------

def test_explicit_resume_is_a_rollback_and_a_restart_continues_the_branch(tmp_path):
    root = str(tmp_path)
    for s in (10, 20, 30):
        fake_checkpoint(root, s)
    fake_checkpoint(root, 40, complete=False)
    source = step_dir(root, 10)
    assert resolve_resume(root, source, ENV, NoMirror()) == source
    assert list_steps(root, complete_only=False) == [10]  # newer ones moved aside...
    record = json.load(open(os.path.join(root, ROLLBACK)))
    branch = os.path.join(root, record["abandoned"])
    assert sorted(os.listdir(branch)) == ["step-000020", "step-000030", "step-000040"]  # ...not deleted
    assert resolve_resume(root, "auto", ENV, NoMirror()) == source  # auto never picks the abandoned branch

    fake_checkpoint(root, 15)  # the new branch saved
    # The pod restarts with the same spec (resume still names step 10): continue, do not roll back again.
    assert resolve_resume(root, source, ENV, NoMirror()) == step_dir(root, 15)
    assert list_steps(root) == [10, 15]


class InstantWriter:
    def __init__(self, fail=False):
        self.fail = fail

    def start(self, state, path):
        if self.fail:
            raise KeyboardInterrupt("killed while writing shards")
        with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
            f.write(b"x")
        done = Future()
        done.set_result(None)
        return done

    def close(self, graceful=True):
        pass


def checkpointer(root, keep_last=1, ownership=None):
    c = Checkpointer(root, ENV, keep_last, "off", NoMirror(), ownership=ownership)
    c.writer = InstantWriter()
    return c


def test_retention_never_deletes_the_resume_source(tmp_path):
    root = str(tmp_path)
    source = fake_checkpoint(root, 10)
    c = checkpointer(root, keep_last=1)
    c.protect(source)
    c.save(20, None, {}, "")
    c.save(30, None, {}, "")
    c.wait()  # sealing and retention run on rank 0's sealer thread
    assert list_steps(root) == [10, 30]


def test_a_resave_removes_the_old_marker_before_writing(tmp_path):
    root = str(tmp_path)
    fake_checkpoint(root, 20)
    c = checkpointer(root)
    c.writer = InstantWriter(fail=True)
    with pytest.raises(KeyboardInterrupt):
        c.save(20, None, {}, "")
    assert not os.path.exists(os.path.join(step_dir(root, 20), MARKER))


def test_rng_and_config_are_fsynced_before_the_marker(tmp_path, monkeypatch):
    calls = []
    real_write = ckpt_mod.write_json_atomic
    monkeypatch.setattr(ckpt_mod, "write_json_atomic", lambda p, d: (calls.append(os.path.basename(p)), real_write(p, d)))
    real_fsync = os.fsync
    monkeypatch.setattr(ckpt_mod.os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1]), real_fsync(fd)))
    c = checkpointer(str(tmp_path / "c"))
    calls.clear()
    c.save(5, None, {}, "seed: 1\n")
    c.wait()
    assert "rng-rank-0.pt" in calls and "config.yaml" in calls and MARKER in calls
    assert calls.index("rng-rank-0.pt") < calls.index(MARKER) and calls.index("config.yaml") < calls.index(MARKER)


# --- item 6: one attempt acts on a directory -----------------------------------------------------

def test_an_old_attempt_stops_acting_once_a_new_one_owns_the_directory(tmp_path):
    root = str(tmp_path)
    old = checkpointer(root, keep_last=1, ownership=Ownership(root, "attempt-old"))
    old.save(10, None, {}, "")
    old.wait()
    new_owner = Ownership(root, "attempt-new")
    new_owner.claim()  # the new attempt starts and is loading step 10
    old.save(20, None, {}, "")
    old.wait()
    assert list_steps(root) == [10]  # the old attempt neither pruned 10 nor marked 20
    assert not os.path.exists(os.path.join(step_dir(root, 20), MARKER))
    assert json.load(open(os.path.join(root, "owner.json")))["attempt_id"] == "attempt-new"


# --- item 8: non-finite steps ---------------------------------------------------------------------

def test_nonfinite_steps_in_a_row_stop_the_run_with_a_clear_message():
    guard = NonFiniteSteps(max_consecutive=3)
    nan, one = torch.tensor(float("nan")), torch.tensor(1.0)
    guard.record(1, False, nan, one)
    guard.record(2, True, one, one)  # a good step resets the count
    guard.record(3, False, nan, one)
    guard.record(4, False, nan, one)
    with pytest.raises(TrainingStopped, match=r"3 consecutive steps \(3-5; optimizer.max_nonfinite_steps=3\)"):
        guard.record(5, False, nan, one)
    assert guard.num_skipped == 4


# --- item 4: the resume guard checks the global batch ----------------------------------------------

def saved_config(mbs, accum, seq_len=32):
    return {"data": {"micro_batch_size": mbs, "seq_len": seq_len}, "schedule": {"grad_accum_steps": accum}}


def test_resume_guard_accepts_the_same_global_batch_and_refuses_another(tmp_path):
    from trainer.config import TrainerConfig

    cfg = TrainerConfig()
    cfg.data.micro_batch_size, cfg.data.seq_len, cfg.schedule.grad_accum_steps = 4, 32, 4
    check_resume_compatible(saved_config(4, 2), 2, cfg, 1, "ckpt")  # 2 ranks x 2 -> 1 rank x 4: same samples
    cfg.schedule.grad_accum_steps = 2
    with pytest.raises(TrainingStopped, match=r"global batch 8 samples .* differs from the checkpoint's 16"):
        check_resume_compatible(saved_config(4, 2), 2, cfg, 1, "ckpt")
    cfg.schedule.grad_accum_steps = 4
    cfg.data.seq_len = 64
    with pytest.raises(TrainingStopped, match="data.seq_len=64"):
        check_resume_compatible(saved_config(4, 2), 2, cfg, 1, "ckpt")


# --- item 3: optimizer values changed on resume are applied -------------------------------------------

def test_changed_lr_and_weight_decay_are_applied_after_loading():
    from trainer.config import TrainerConfig
    from trainer.optim import build_optimizer, cosine_with_warmup

    cfg = TrainerConfig()
    model = torch.nn.Linear(4, 4)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(10, 100, 0.1))
    for _ in range(20):
        optimizer.step()
        scheduler.step()
    saved = {"optimizer": {"lr": cfg.optimizer.lr, "weight_decay": cfg.optimizer.weight_decay}}
    assert apply_optimizer_config(optimizer, scheduler, cfg, saved) == []  # unchanged: untouched
    cfg.optimizer.lr, cfg.optimizer.weight_decay = cfg.optimizer.lr / 10, 0.0
    changes = apply_optimizer_config(optimizer, scheduler, cfg, saved)
    assert changes == [f"optimizer.lr: {saved['optimizer']['lr']} -> {cfg.optimizer.lr}",
                       "optimizer.weight_decay: 0.1 -> 0.0"]
    factor = cosine_with_warmup(10, 100, 0.1)(20)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optimizer.lr * factor)
    assert optimizer.param_groups[0]["weight_decay"] == 0.0
    scheduler.step()  # and the schedule keeps using the new base
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optimizer.lr * cosine_with_warmup(10, 100, 0.1)(21))


# --- item 9: MLflow gets from metrics.jsonl whatever it lacks -----------------------------------------

class RecordingClient:
    """An MLflow client whose run already holds steps 21-40 (what survived an outage)."""

    def __init__(self, held_steps):
        self.metrics = [("loss", s) for s in held_steps]
        self.status = None

    def get_experiment_by_name(self, name):
        class E:
            experiment_id = "1"
        return E

    def get_run(self, run_id):
        class Run:
            class info:
                pass

            class data:
                params = {}
        Run.info.run_id = run_id
        return Run

    def update_run(self, run_id, status):
        pass

    def get_metric_history(self, run_id, key):
        class M:
            def __init__(self, step):
                self.step = step
        return [M(s) for k, s in self.metrics if k == key]

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.metrics += [(m.key, m.step) for m in metrics]

    def set_terminated(self, run_id, status):
        self.status = status


def test_resume_backfills_mlflow_from_metrics_jsonl():
    client = RecordingClient(range(21, 41))
    rows = [{"step": s, "loss": 1.0 / s} for s in range(1, 41)]
    tracker = MLflowTracker(uri="x", experiment="e", job_id="j", run_name=None, run_id="run-1", params={}, tags={},
                            config_yaml="", retry_seconds=0.05, client=client, backfill=rows)
    for step in range(36, 46):  # the resumed attempt replays 36-40 (already held), then goes on
        tracker.log(step, {"loss": 0.5})
    tracker.close(status="FINISHED", timeout_seconds=10)
    steps = sorted(s for k, s in client.metrics if k == "loss")
    assert steps == list(range(1, 46)) and client.status == "FINISHED"


# --- item 1: exit codes from torchrun's failure records and the ranks' reports ------------------------

KILLED_RANK1 = [{"rank": 1, "exitcode": -9, "signal": "SIGKILL", "timestamp": 10}]


@pytest.mark.parametrize("case, torchrun_code, reports, failures, expected", [
    ("rank 1 OOM-killed, survivor failed on the lost peer", 1,
     [{"rank": 0, "reason": "failed", "peer_lost": True}, {"rank": 1, "reason": "running"}], KILLED_RANK1, 137),
    ("rank 1 OOM-killed, survivor SIGTERMed by torchrun", 1,
     [{"rank": 0, "reason": "failed", "signalled": True}, {"rank": 1, "reason": "running"}],
     KILLED_RANK1 + [{"rank": 0, "exitcode": -15, "timestamp": 10}], 137),
    ("segfault", 1, [{"rank": 0, "reason": "running"}], [{"rank": 0, "exitcode": -11, "timestamp": 3}], 139),
    ("a Python exception stays permanent", 1,
     [{"rank": 0, "reason": "failed", "exception": "ValueError"}, {"rank": 1, "reason": "failed", "signalled": True}],
     [{"rank": 0, "exitcode": 1, "timestamp": 5}, {"rank": 1, "exitcode": -15, "timestamp": 5}], 1),
    ("a bad config (exit 2 before any report) stays permanent", 1, [],
     [{"rank": 0, "exitcode": 2, "timestamp": 5}, {"rank": 1, "exitcode": -15, "timestamp": 5}], 1),
    ("no records at all: torchrun's code", 1, [], [], 1),
])
def test_launcher_maps_worker_deaths(case, torchrun_code, reports, failures, expected):
    reasons = [r["reason"] for r in reports]
    assert exit_code(torchrun_code, False, reasons, reports, failures) == expected, case


def test_launcher_reads_status_files_defensively(tmp_path):
    d = str(tmp_path)
    open(os.path.join(d, "rank-0.json"), "w").write('{"reason": "preempted", "step": 7, "attempt": 1, '
                                                     '"checkpoint_step": 7}')
    open(os.path.join(d, "rank-1.json"), "w").write('{"reason": "comp')  # half-written by an old trainer
    open(os.path.join(d, "rank-2.json"), "w").write('{"reason": "failed", "attempt": 0}')  # an older attempt
    open(os.path.join(d, "rank-0.json.tmp-5"), "w").write("{")
    reports = worker_reports(d)
    assert list(reports) == [0] and reports[0]["reason"] == "preempted"
    assert checkpoint_line(reports) == "final checkpoint: step 7 landed"
    assert exit_code(1, False, ["preempted"], list(reports.values()), []) == EXIT_PREEMPTED
    assert worker_reports(str(tmp_path / "missing")) == {}
