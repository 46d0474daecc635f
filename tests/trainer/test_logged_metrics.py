"""Logged metrics of a resumed run are the uninterrupted run's, bit for bit.

The losses of a logging window are averaged over the ranks in one collective. An all-reduce
adds in an order that depends on where an element sits in the tensor (gloo's ring reduces one
chunk per rank, each starting at a different rank; NCCL chunks as well), so with 3+ ranks the
same per-rank losses, logged in a window of 9 after a resume instead of 10, came out one
rounding step apart (2.4e-7 at one step of a 3-rank run), while the weights were equal.
"""
import subprocess
import sys
import textwrap

import pytest

from trainer_helpers import REPO, launcher_env

SCRIPT = textwrap.dedent("""
    import datetime, json, torch, torch.distributed as dist
    from trainer import distributed

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    env = distributed.Env(rank, rank, world, torch.device("cpu"), "gloo")
    generator = torch.Generator().manual_seed(1000 + rank)
    # Ten steps' losses of this rank, as the loop keeps them (fp32 scalars).
    losses = [torch.rand((), generator=generator) * 6 for _ in range(10)]
    whole = distributed.all_reduce_mean(env, torch.stack(losses)).tolist()
    # The same steps logged in other windows: the tail after a resume, pairs, one at a time.
    windows = [losses[1:], losses[2:], losses[7:], losses[:4], losses[4:9]]
    starts = [1, 2, 7, 0, 4]
    differ = []
    for start, window in zip(starts, windows):
        values = distributed.all_reduce_mean(env, torch.stack(window)).tolist()
        differ += [start + i for i, v in enumerate(values) if v != whole[start + i]]
    for step, loss in enumerate(losses):
        if distributed.all_reduce_mean(env, loss).item() != whole[step]:
            differ.append(step)
    if rank == 0:
        print("DIFFER " + json.dumps(sorted(set(differ))), flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_a_steps_logged_mean_loss_does_not_depend_on_its_logging_window(tmp_path):
    script = tmp_path / "windows.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                             str(script)], env=launcher_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    line = next(line for line in out.splitlines() if line.startswith("DIFFER "))
    assert line == "DIFFER []", f"steps whose logged mean depends on the window: {line}"
