"""The training process a trainer pod runs on the test cluster: the trainer's own preemption
contract around a loop that trains nothing.

    python -m tools.cluster.workload        (started by the kubelet for a trainer container)

What a real trainer pod's process does with a signal is the platform's promise to the Training
Operator: SIGTERM (the kubelet's, when a spot node is drained or a job is cancelled) is turned
into "stop at the next step boundary, save, exit 143", and 143 makes ``restartPolicy: ExitCode``
recreate the pod. That conversion is ``trainer.contract.preemption`` (the block your training code
runs in, and the rule ``trainer.launch`` reports up): this process runs exactly that block, so the
exit code the kubelet reports after a drain is the one the trainer's code produces, not one a
test chose. torchrun, the model and the data are not run (tests/trainer/ covers them).

How a step ends is told by a file the kubelet writes when a test asks for an outcome
(``MLP_WORKLOAD_CONTROL``): ``complete`` leaves the block normally (exit 0), ``exit N`` raises
``SystemExit(N)`` inside it (a permanent failure, as a bug in the training code would).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

STEP_SECONDS = 0.2


def main() -> int:
    from trainer import contract

    control = Path(os.environ["MLP_WORKLOAD_CONTROL"])
    step = 0
    with contract.preemption() as stop:
        # Ready only once the contract's handler is installed (the kubelet's readiness check for
        # this container): a signal before it would kill the process, not ask it to stop.
        Path(f"{control}.ready").write_text(str(os.getpid()))
        while True:
            step += 1
            time.sleep(STEP_SECONDS)
            if stop.requested(step):
                print(f"[workload] step {step}: preemption requested ({stop.signal_name}); leaving the block",
                      flush=True)
                break
            order = control.read_text().strip() if control.exists() else ""
            if order == "complete":
                print(f"[workload] step {step}: told to complete", flush=True)
                break
            if order.startswith("exit "):
                print(f"[workload] step {step}: told to fail with {order}", flush=True)
                raise SystemExit(int(order.split()[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
