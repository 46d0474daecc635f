"""A SIGTERM to the worker's process group while DCP's background checkpoint process starts
must not kill it (checkpoint.async_mode=process).

torchrun forwards a preemption's SIGTERM to each worker's whole process group, which holds the
background process too. That process ignores SIGTERM, but only from the moment its interpreter
runs the line that says so: a signal in the first tens of milliseconds of its life (more on a
loaded node) killed it ("Checkpoint background process is dead. Exit code: -15") and with it
the preemption checkpoint. The trainer now starts it with the signal blocked.

Here, from outside, hundreds of times: a worker process (in its own session, as torchrun starts
workers) starts a save through the trainer's process-mode writer, exactly as the trainer does
(`AsyncSave.start`); DCP itself is stood in for by what it does at a save (torch 2.13
`_ProcessBasedAsyncCheckpointExecutor`: a new thread, and from it a `spawn` process that
reports back through a pipe), so that each trial starts a fresh process in a fraction of a
second. The test sends SIGTERM to the worker's process group at a random moment of that
start-up, and every save must still land.
"""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainer_helpers import REPO

SAVER = textwrap.dedent("""
    import os

    def write(path, conn):  # the background process's save: the checkpoint file, then the answer
        with open(path, "w") as f:
            f.write("shards")
        conn.send("written")
        conn.close()
""")

WORKER = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys, time
    from concurrent.futures import ThreadPoolExecutor

    import saver_target  # what the child needs; torch and the trainer are imported in main() only

    signalled = []

    def async_save(state, checkpoint_id, process_group=None, async_checkpointer_type=None, async_stager=None,
                   no_dist=False):
        ctx = multiprocessing.get_context("spawn")
        executor = ThreadPoolExecutor(max_workers=1)  # DCP: a new executor per save

        def run():
            parent, child = ctx.Pipe()
            process = ctx.Process(target=saver_target.write, args=(checkpoint_id, child), daemon=True)
            process.start()
            child.close()
            try:
                return parent.recv()
            except EOFError:
                process.join()
                raise RuntimeError(f"Checkpoint background process is dead. Exit code: {process.exitcode}")

        future = executor.submit(run)
        future.add_done_callback(lambda _: executor.shutdown(wait=False))
        return future

    def main():  # under a main guard: spawn imports this file again in the child, as __mp_main__
        import torch
        from trainer.checkpoint import writers
        from trainer.distributed import Env

        signal.signal(signal.SIGTERM, lambda *_: signalled.append(time.monotonic()))  # the trainer's flag
        writers.dcp.async_save = async_save
        saver = writers.AsyncSave(Env(0, 0, 1, torch.device("cpu"), "gloo"), "process")
        root = sys.argv[1]
        print("ready", flush=True)
        for line in sys.stdin:
            trial = int(line)
            path = os.path.join(root, f"trial-{trial}")
            started = time.monotonic()
            error = None
            try:
                saver.start({}, path).result(timeout=60)
            except Exception as exc:
                error = str(exc)
            finished = time.monotonic()
            # Wait for this trial's signal (sent after a random delay) before answering.
            deadline = time.monotonic() + 10
            while not signalled and time.monotonic() < deadline:
                time.sleep(0.001)
            at = signalled[0] - started if signalled else None
            signalled.clear()
            print(json.dumps({"trial": trial, "landed": os.path.exists(path), "error": error,
                              "seconds": finished - started, "signal_at": at}), flush=True)

    if __name__ == "__main__":
        main()
""")


@pytest.mark.slow
def test_sigterm_to_the_workers_group_during_the_savers_start_up_never_loses_the_save(tmp_path):
    (tmp_path / "saver_target.py").write_text(SAVER)
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO]), "OMP_NUM_THREADS": "1"}
    worker = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path)], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    rng = random.Random(47)
    results, durations = [], [0.3]
    budget_ends = time.monotonic() + 240
    try:
        assert worker.stdout.readline().strip() == "ready"
        for trial in range(300):
            if time.monotonic() > budget_ends:
                break
            # A moment anywhere in the saver's life, its start-up above all: up to its typical
            # duration so far (start to written).
            delay = rng.uniform(0, 1.2 * sorted(durations)[len(durations) // 2])
            worker.stdin.write(f"{trial}\n")
            worker.stdin.flush()
            time.sleep(delay)
            os.killpg(worker.pid, signal.SIGTERM)
            result = json.loads(worker.stdout.readline())
            results.append(result)
            durations.append(result["seconds"])
    finally:
        worker.stdin.close()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    lost = [r for r in results if not r["landed"] or r["error"]]
    during = [r for r in results if r["signal_at"] is not None and r["signal_at"] < r["seconds"]]
    print(f"{len(results)} trials, {len(during)} with the signal inside the save, {len(lost)} lost")
    assert len(results) >= 100, f"only {len(results)} trials in the time budget"
    assert len(during) >= len(results) // 2, "the signals mostly missed the saver's life: the test proves nothing"
    assert not lost, f"{len(lost)} of {len(results)} saves lost, e.g. {lost[:3]}"
