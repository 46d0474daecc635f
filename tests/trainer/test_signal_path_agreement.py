"""The signal path's collectives: ranks agree on whether an async save is in flight first.

`Checkpointer.pending_step` is rank-local (each rank's `poll()` clears it when its own future
is done, and ranks poll at different moments). Review trainer-3 B6 / E4: with the step-10 save
finished on rank 0 but still pending on rank 1 when the signal is acted on, rank 0 went
straight to the save's finiteness all-reduce while rank 1 first did the `skip` all-reduce: the
collectives paired wrongly, a hang until the process-group timeout (torchrun's SIGKILL in
production) and no preemption checkpoint.
"""
import subprocess
import sys
import textwrap

import pytest

from trainer_helpers import REPO, launcher_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import datetime, os, sys, time, types
    import torch.distributed as dist
    from trainer import distributed
    from trainer.preemption import PreemptionFlag
    from trainer.train import Trainer

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    rank = dist.get_rank()
    env = types.SimpleNamespace(distributed=True, rank=rank, world_size=2, is_main=rank == 0)

    class Checkpointer:  # the step-10 save: finished and polled on rank 0, still pending on rank 1
        pending_step = 10 if rank == 1 else None
        last_write_seconds = 0.01
        write_abandonable = False
        def wait(self):
            self.pending_step = None
        def write_failed(self):
            return False
        def write_done(self):
            return True

    saved = []
    def save(step, extra, synchronous=False):  # what train.py's save() does first: the finiteness all-reduce
        not_finite = distributed.all_reduce_max(env, [0.0])[0]
        assert not_finite == 0.0
        saved.append(step)

    flag = PreemptionFlag()
    flag.signal_name, flag.raised_at = "SIGTERM", time.monotonic()
    goodput = types.SimpleNamespace(checkpoint_stall_seconds=0.0, wall_seconds=0.0)
    os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "30"
    started = time.monotonic()
    # The trainer's own method, on a stand-in holding what it reads.
    trainer = types.SimpleNamespace(step=12, save=save, checkpointer=Checkpointer(), preemption=flag, env=env,
                                    goodput=goodput, last_stall_seconds=0.0, wall_at_attempt_start=0.0,
                                    attempt_start=time.time())
    Trainer.save_on_signal(trainer)
    # Every rank then meets at the step's flag all-reduce: a mismatched sequence fails here.
    distributed.all_reduce_max(env, [1.0])
    # One write(2) per line: a pipe never interleaves it with the other rank's.
    os.write(1, f"rank {rank}: saved {saved} in {time.monotonic() - started:.1f} s\\n".encode())
    dist.destroy_process_group()
""")


def test_ranks_with_different_pending_saves_take_the_same_path(tmp_path):
    script = tmp_path / "signal_path.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], env=launcher_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "rank 0: saved [12]" in out and "rank 1: saved [12]" in out
