"""GPU faults exit retryable and name the GPU in the pod's termination message (review
trainer-4 §3: a CUDA hardware error in one rank exited 1, permanent, and the job never
moved off the broken node)."""
import json
import os

import pytest

from trainer.gpu_faults import EXIT_GPU_FAULT, gpu_fault, node_fault_xids
from trainer.launch import exit_code, report_gpu_fault
from trainer_helpers import REPO, launcher_env, run, tiny_overrides, torchrun_cmd


@pytest.mark.parametrize("message, fault", [
    ("CUDA error: uncorrectable ECC error encountered", True),
    ("CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously reported", True),
    ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details)", True),
    ("NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus.", True),
    ("NVRM: Xid (PCI:0000:53:00): 48, pid=99, An uncorrectable double bit error", True),
    ("NVRM: Xid (PCI:0000:53:00): 13, Graphics Exception", False),  # the table's action: none (the application)
    ("CUDA error: an illegal memory access was encountered", False),  # usually the program's own bug
    ("CUDA error: device-side assert triggered", False),
    ("RuntimeError: shape mismatch", False),
])
def test_errors_that_name_a_gpu_fault(message, fault):
    assert bool(gpu_fault(RuntimeError(message))) is fault


def test_the_node_fault_xids_are_the_tables_drain_reset_and_replace_rows():
    with open(os.path.join(REPO, "workloads", "xid_actions.json")) as f:
        rows = json.load(f)["xids"]
    expected = {int(k) for k, v in rows.items() if v["action"] in ("drain", "reset", "replace")}
    assert node_fault_xids() == expected and {48, 79} <= expected and 13 not in expected


def test_a_gpu_fault_in_one_rank_is_retryable_and_named_in_the_termination_message(tmp_path):
    faulty = {"rank": 1, "local_rank": 1, "reason": "failed", "peer_lost": False, "signalled": False,
              "gpu_fault": "GPU fault: uncorrectable ECC error encountered"}
    peer = {"rank": 0, "local_rank": 0, "reason": "failed", "peer_lost": True, "signalled": False}
    failures = [{"rank": 1, "exitcode": 1}, {"rank": 0, "exitcode": 1}]
    assert exit_code(1, False, ["failed", "failed"], [peer, faulty], failures) == EXIT_GPU_FAULT == 135
    # Without the fault the same rank is a root cause: permanent.
    assert exit_code(1, False, ["failed", "failed"], [peer, {**faulty, "gpu_fault": None}], failures) == 1
    log = tmp_path / "termination-log"
    log.write_text("")
    report_gpu_fault([faulty], path=str(log))
    assert "local_rank=1: GPU fault: uncorrectable ECC error encountered" in log.read_text()


@pytest.mark.slow
def test_a_rank_raising_a_cuda_ecc_error_ends_the_job_135_with_the_termination_message(tmp_path, data_dir):
    """End to end on CPU: rank 1 raises CUDA's ECC error text after step 3 (fault injection)."""
    log = tmp_path / "termination-log"
    log.write_text("")
    overrides = tiny_overrides(data_dir, str(tmp_path / "ckpt"), **{"schedule.num_steps": 40})
    result = run(torchrun_cmd(2, overrides), launcher_env(TRAINER_FAULTS="gpu_error@3:1",
                                                         TRAINER_TERMINATION_LOG=str(log)))
    out = result.stdout + result.stderr
    assert result.returncode == EXIT_GPU_FAULT, out[-3000:]
    assert "rank=1 local_rank=1: GPU fault: uncorrectable ECC error encountered" in log.read_text(), out[-3000:]


@pytest.mark.parametrize("message", [
    "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "NCCL WARN Error: failed to extend /dev/shm/nccl-XyZ to 9637892 bytes; unhandled system error",
])
def test_nccls_system_error_alone_is_the_pods_configuration_not_the_gpu(message):
    """NCCL's ncclSystemError is also an exhausted /dev/shm, RLIMIT_MEMLOCK for EFA or an fd limit:
    cordoning the node would not help, and each retry would cordon another healthy one."""
    assert gpu_fault(RuntimeError(message)) is None
    assert gpu_fault(RuntimeError(message + "; NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus")) \
        == "GPU fault: GPU has fallen off the bus"


# What torch 2.13's NCCL watchdog logs before it aborts a worker (ProcessGroupNCCL.cpp), as
# torchrun's worker stderr carries it; the lines after it are the C++ abort's.
WATCHDOG_LINES = [
    "[rank1]:[E1129 06:21:18.894757790 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process "
    "group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: "
    "CUDA error: uncorrectable ECC error encountered",
]


def test_the_watchdogs_last_words_name_the_faulty_rank():
    from trainer.gpu_faults import watchdog_faults

    assert watchdog_faults(WATCHDOG_LINES) == {1: "GPU fault: uncorrectable ECC error encountered"}
    illegal = [line.replace("uncorrectable ECC error encountered", "an illegal memory access was encountered")
               for line in WATCHDOG_LINES]
    assert watchdog_faults(illegal) == {}  # the program's own bug: a root cause, not the node's


WATCHDOG_WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(0.5)
    sys.stderr.write('''{lines}\\n''')
    sys.stderr.flush()
    os.abort()  # what the watchdog's rethrow does: std::terminate, SIGABRT
time.sleep(60)
"""


@pytest.mark.slow
def test_a_worker_aborted_by_nccls_watchdog_for_a_gpu_fault_ends_135_with_the_termination_message(tmp_path):
    """No GPU here: a worker does what NCCL's watchdog does on a sticky CUDA error (logs the
    error, aborts: SIGABRT, no Python exception and no report of the fault). Before, that was
    128+6 with no termination message: retried, maybe on the same GPU, and the node never
    cordoned."""
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(WATCHDOG_WORKER.format(lines="\\n".join(WATCHDOG_LINES).replace("'", "\\'")))
    log = tmp_path / "termination-log"
    log.write_text("")
    result = subprocess.run([sys.executable, "-m", "trainer.launch", "--nproc-per-node=2", "--standalone",
                             str(script)], env=launcher_env(TRAINER_TERMINATION_LOG=str(log)), cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == EXIT_GPU_FAULT, out[-3000:]
    assert "rank=1 local_rank=1: GPU fault: uncorrectable ECC error encountered" in log.read_text(), out[-3000:]
    assert "watchdog thread terminated" in out  # the workers' stderr still reaches the pod's log


@pytest.mark.slow
def test_a_worker_killed_by_sigbus_is_retryable_but_names_no_gpu(tmp_path):
    """135 is also 128+SIGBUS (an mmap'd data shard truncated on FSx): retried, but no
    termination message naming a GPU, so the node is not cordoned for it."""
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text("import os, signal, time\nif os.environ['RANK'] == '1':\n    time.sleep(0.5)\n"
                      "    os.kill(os.getpid(), signal.SIGBUS)\ntime.sleep(60)\n")
    log = tmp_path / "termination-log"
    log.write_text("")
    result = subprocess.run([sys.executable, "-m", "trainer.launch", "--nproc-per-node=2", "--standalone",
                             str(script)], env=launcher_env(TRAINER_TERMINATION_LOG=str(log)), cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 135, out[-3000:]
    assert log.read_text() == "" and "GPU fault" not in out and "another node" not in out, out[-3000:]


def test_the_failure_report_is_written_before_the_tracker_closes(tmp_path, monkeypatch):
    """The launcher's only record of a rank's GPU fault is its report. It was written after the
    failure path's tracker close (up to 5 s of MLflow): NCCL's watchdog aborting the process
    meanwhile lost it."""
    from trainer import train
    from trainer.config import TrainerConfig

    status = tmp_path / "status"
    monkeypatch.setenv("TRAINER_EXIT_STATUS_DIR", str(status))
    monkeypatch.setenv("RANK", "0")
    seen_at_close = []

    class FailingTrainer:  # fails in its loop; its failure path closes the tracker
        def __init__(self, cfg, env, process_start, preemption):
            pass

        def run(self):
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered")

        def progress(self):
            return 7, None, False

        def close_after_failure(self, exc):
            seen_at_close.append(json.loads((status / "rank-0.json").read_text()))

    monkeypatch.setattr(train, "Trainer", FailingTrainer)
    monkeypatch.setattr(train.distributed, "init", lambda cfg: train.distributed.Env(0, 0, 1, None, "gloo"))
    monkeypatch.setattr(train.reproducibility, "apply", lambda *a: None)
    with pytest.raises(RuntimeError):
        train.main(TrainerConfig())
    assert seen_at_close and seen_at_close[0]["reason"] == "failed", seen_at_close
    assert seen_at_close[0]["gpu_fault"] == "GPU fault: uncorrectable ECC error encountered"
