"""The checkpoint process group (DCP's loads and saves, the resume resolution, the trust
verdict) is bounded by `parallelism.init_timeout_seconds`, like the default group at start-up.

`dist.new_group(backend="gloo")` without a timeout takes torch's default for gloo, 30 minutes
(torch 2.13 distributed_c10d.py: `if timeout is None: timeout = _get_default_timeout(backend)`,
`default_pg_timeout`): a peer lost without a TCP reset (a node gone) during a resume or a save
held the survivors half an hour. Here rank 1 comes 40 s late to a collective on that group
while the bound is 4 s."""
import subprocess
import sys
import textwrap

import pytest

from trainer_helpers import REPO, launcher_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, time, torch.distributed as dist
    from trainer import distributed
    from trainer.config import ParallelismConfig

    env = distributed.init(ParallelismConfig(init_timeout_seconds=4))
    if env.rank == 1:
        time.sleep(40)
    started = time.monotonic()
    try:
        dist.barrier(group=env.checkpoint_group)
        outcome = "returned"
    except Exception as exc:
        outcome = "raised " + type(exc).__name__
    # One write(2) per line: a pipe never interleaves it with the other rank's.
    os.write(1, f"rank {env.rank}: {outcome} after {time.monotonic() - started:.1f} s\\n".encode())
""")


def test_a_late_peer_on_the_checkpoint_group_fails_the_collective_after_the_start_up_bound(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], env=launcher_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    line = next((l for l in out.splitlines() if l.startswith("rank 0:")), None)
    assert line is not None, out[-3000:]
    seconds = float(line.rsplit(" after ", 1)[1].split()[0])
    assert line.startswith("rank 0: raised") and seconds < 20, line
