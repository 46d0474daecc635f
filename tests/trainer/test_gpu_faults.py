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
