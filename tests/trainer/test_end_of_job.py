"""The end of a job: once the final checkpoint is durable and every rank reported it, nothing
rank 0 does afterwards (closing the MLflow run, the export, the registration) can turn the
job into a failure or hold another rank.

Before, the other ranks waited for rank 0's export in teardown's barrier with the start-up
bound (`parallelism.init_timeout_seconds`): an MLflow close plus an export longer than that
made them time out after reporting "completed", and the launcher took that for a crash: exit 1,
a finished job failed for good (on GPU: NCCL's watchdog abort, 134, a retry that exported and
registered again until the retry bound ended it with exit 1)."""
import os
import subprocess

import pytest

from trainer.launch import exit_code
from trainer_helpers import launcher_env, tiny_overrides
from test_multinode import free_port, node_cmd, wait_all


def test_a_rank_failing_after_every_rank_completed_leaves_the_job_done():
    completed = [{"rank": 0, "reason": "completed", "step": 6, "checkpoint_step": 6},
                 {"rank": 1, "reason": "completed", "step": 6, "checkpoint_step": 6}]
    # rank 0 crashed in its export (exit 1), or was killed in it (the OOM killer: -9)
    assert exit_code(1, False, ["completed", "completed"], completed, [{"rank": 0, "exitcode": 1}]) == 0
    assert exit_code(1, False, ["completed", "completed"], completed, [{"rank": 0, "exitcode": -9}]) == 0
    # a spot notice during it: the job is retried, and the retry finds its export registered
    assert exit_code(1, True, ["completed", "completed"], completed, [{"rank": 0, "exitcode": -15}]) == 143
    # a rank that did not complete still decides
    running = [completed[0], {"rank": 1, "reason": "running", "step": -1}]
    assert exit_code(1, False, ["completed", "running"], running, [{"rank": 1, "exitcode": -9}]) == 137
    failed = [completed[0], {"rank": 1, "reason": "failed", "step": 5}]
    assert exit_code(1, False, ["completed", "failed"], failed, [{"rank": 1, "exitcode": 1}]) == 1


@pytest.mark.slow
def test_a_slow_export_on_rank_0_ends_both_nodes_done(tmp_path, data_dir):
    """Two launchers on loopback (nnodes=2, one rank each). Rank 0's export is held for 40 s
    (a fault injected through TRAINER_FAULTS), well past the 15-s start-up bound the other
    rank's teardown used to wait with. Both nodes must end 0, and the export must be there."""
    ckpt = str(tmp_path / "ckpt")
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": 6, "checkpoint.every_steps": 3,
                                                  "parallelism.init_timeout_seconds": 15})
    env = launcher_env(TRAINER_FAULTS="export@6:0:SLEEP=40")
    port = free_port()
    logs = [open(tmp_path / f"node{n}.log", "w+") for n in (0, 1)]
    procs = [subprocess.Popen(node_cmd(n, port, overrides), env=env, cwd=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))), stdout=logs[n], stderr=subprocess.STDOUT, text=True)
        for n in (0, 1)]
    codes = wait_all(procs, timeout=400)
    out = []
    for log in logs:
        log.seek(0)
        out.append(log.read())
        log.close()
    assert codes == [0, 0], f"exit codes {codes}\n--- node 0\n{out[0][-3000:]}\n--- node 1\n{out[1][-3000:]}"
    assert "holding export of step 6 for 40 s" in out[0], out[0][-3000:]
    assert os.path.isfile(os.path.join(ckpt, "export", "step-000006", "model.safetensors"))
