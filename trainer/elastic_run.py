"""torchrun (`torch.distributed.run`), with what it records about failed workers written down.

torchrun knows how each worker ended (`ChildFailedError.failures`: exit code, negative for
a signal, pid, error file), but its own exit code is 1 whatever happened. The launcher
needs that record to tell a worker killed by a signal (OOM killer, lost node: retryable)
from a Python exception (permanent), so this module runs torchrun's own `main` in-process
and writes the failures, as JSON, to `$TRAINER_TORCHRUN_FAILURES` before torchrun exits.
"""
from __future__ import annotations

import json
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main


def failure_records(exc: ChildFailedError) -> list[dict]:
    records = []
    for rank, failure in sorted(exc.failures.items()):
        records.append({
            "rank": rank,
            "local_rank": failure.local_rank,
            "pid": failure.pid,
            "exitcode": failure.exitcode,
            "signal": failure.signal_name() if failure.exitcode < 0 else None,
            "timestamp": failure.timestamp,
        })
    return records


def is_rendezvous_failure(exc: BaseException) -> bool:
    """torchrun's agent could not meet its peers: a node that never came (the rendezvous
    timed out), a store that refused or dropped the connection. Nothing about the job is
    wrong; the next attempt, on a recreated pod, may meet them."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousError

    return isinstance(exc, (RendezvousError, dist.DistError, TimeoutError, ConnectionError))


def write_record(record: dict) -> None:
    path = os.environ.get("TRAINER_TORCHRUN_FAILURES")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)


def main(argv: list[str]) -> None:
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        write_record({"failures": failure_records(exc)})
        raise
    except Exception as exc:  # torchrun failed before or around its workers: say how
        write_record({"failures": [], "agent_error": {"type": type(exc).__name__, "message": str(exc)[:500],
                                                      "rendezvous": is_rendezvous_failure(exc)}})
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
