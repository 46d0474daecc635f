"""Container entrypoint: `python -m trainer.launch [torchrun args] -m trainer train --config ...`.

It runs torchrun as a child and turns how the workers ended into an exit code a PyTorchJob
with `restartPolicy: ExitCode` acts on correctly (1-127 permanent, 128-255 retried).
torchrun alone cannot be trusted with that (torch 2.13, measured by
benchmarks/torchrun_sigterm.py): it exits 1 after a forwarded SIGTERM even when every worker
saved its checkpoint, and 1 when a worker was SIGKILLed by the OOM killer.

Exit codes:
- 0: finished: every rank reported its training complete, the final checkpoint durable. A
  rank that fails after that (rank 0's MLflow close, export or registration) does not change
  it; the launcher names it and the export can be rerun (`python -m trainer export`).
- 143: preempted: a signal reached the launcher, or a rank reports it saved after a signal.
- 128+N: a worker, or a worker's DCP background checkpoint process (async_mode process), died
  of signal N (137 for SIGKILL: OOM killer, lost node; 139 for a segfault) and no rank failed on its own: retryable, the job resumes from its newest
  complete checkpoint. What torchrun records about each failed worker (exit code, negative
  for a signal) comes from `trainer.elastic_run`.
- 141 (128 + SIGPIPE): this node's ranks failed only because a peer on ANOTHER node vanished
  (its collective saw "Connection closed/reset by peer"). Each node's launcher sees only its
  own ranks; the node that lost the worker exits 128+N, and this one must be retryable too,
  or `restartPolicy: ExitCode` fails the whole job for one OOM kill on one node.
- 135 (128 + SIGBUS): a rank's error names a GPU fault (trainer/gpu_faults.py): retried on
  another node; the pod's termination message names the node, rank and fault.
- 3: your code's requirements.txt could not be installed (trainer/requirements_env.py): permanent.
- anything else (1-127): a real failure, permanent: a rank raised an exception that neither
  a signal nor a lost peer explains (a bug, a bad config, a non-finite loss).
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from trainer import retries
from trainer.gpu_faults import EXIT_GPU_FAULT, termination_message, watchdog_faults

EXIT_PREEMPTED = 143
# A broken connection to a peer, like a write to a closed pipe: retryable (128-255).
EXIT_PEER_LOST = 128 + signal.SIGPIPE
# Karpenter's spot notice is 120 s; the pod's grace period must exceed this, and the
# trainer's save must fit inside it. See docs/trainer.md, "Spot interruptions and exit 143".
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = "90"


def read_json_or_none(path: str):
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def worker_reports(status_dir: str) -> dict[int, dict]:
    """The latest attempt's report of each rank. Read defensively: a file that is missing,
    half-written (from an older trainer) or not JSON is skipped, never a launcher crash."""
    reports: dict[int, dict] = {}
    for name in sorted(os.listdir(status_dir)) if os.path.isdir(status_dir) else []:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        report = read_json_or_none(os.path.join(status_dir, name))
        if report is None or not isinstance(report.get("reason"), str):
            continue
        try:
            rank = int(name[len("rank-"):-len(".json")])
        except ValueError:
            continue
        reports[rank] = {**report, "rank": rank}
    latest = max((r.get("attempt", 0) for r in reports.values()), default=0)
    return {rank: r for rank, r in reports.items() if r.get("attempt", 0) == latest}


def worker_reasons(status_dir: str) -> list[str]:
    return [r["reason"] for _, r in sorted(worker_reports(status_dir).items())]


def exit_code(torchrun_code: int, signalled: bool, reasons: list[str],
              reports: list[dict] | None = None, failures: list[dict] | None = None,
              agent_error: dict | None = None) -> int:
    if signalled or "preempted" in reasons:
        return EXIT_PREEMPTED
    if torchrun_code == 0:
        return 0
    by_rank = {r.get("rank"): r for r in reports or [] if "rank" in r}
    # Every rank reported "completed": the final checkpoint was durable and the ranks had
    # parted. What failed after that is rank 0's tracking, export or registration (or an
    # exit-time crash), which neither a retry nor a failed job would mend: the job is done.
    if reasons and all(r == "completed" for r in reasons) and all(
            by_rank.get(f.get("rank"), {}).get("reason") == "completed" for f in failures or []):
        return 0

    def consequence(report: dict | None) -> bool:
        return bool(report and (report.get("signalled") or report.get("peer_lost") or report.get("child_signal")))

    # An error naming a GPU fault (ECC, a GPU off the bus, an Xid the platform treats as a node
    # fault): not the program's fault; retried on another node, bounded by the retry count.
    if any(r.get("gpu_fault") for r in reports or []):
        return EXIT_GPU_FAULT
    # A rank that failed on its own (an exception, or an error exit such as a bad config)
    # and not because of a signal or a vanished peer is the root cause; it would fail again
    # on retry: permanent.
    crashed = [r for r in reports or [] if r.get("reason") == "failed" and not consequence(r)]
    crashed += [f for f in failures or [] if isinstance(f.get("exitcode"), int) and f["exitcode"] > 0
                and not consequence(by_rank.get(f.get("rank")))]
    if crashed:
        return torchrun_code if torchrun_code > 0 else 1
    signals = [-f["exitcode"] for f in sorted(failures or [], key=lambda f: (f.get("timestamp", 0), f.get("rank", 0)))
               if isinstance(f.get("exitcode"), int) and f["exitcode"] < 0]
    # A rank's own child (DCP's background checkpoint process) killed by a signal, e.g. the
    # OOM killer: a signal death like the worker's own.
    signals += [r["child_signal"] for r in reports or [] if isinstance(r.get("child_signal"), int)]
    # Once one worker died, torchrun SIGTERMs the others: SIGTERM deaths are consequences,
    # and the trainer itself handles SIGTERM by saving. Any other signal (SIGKILL from the
    # OOM killer, SIGSEGV, SIGBUS) is the cause and a retry may well succeed.
    causes = [s for s in signals if s != signal.SIGTERM] or signals
    if causes:
        return 128 + causes[0]
    # Nothing died here and nothing failed on its own: the ranks failed because a peer (on
    # another node: multi-node jobs) is gone. That node reports the cause; this one retries.
    if torchrun_code != 0 and any(consequence(r) for r in reports or []):
        return EXIT_PEER_LOST
    # torchrun's agent could not meet the other nodes (a peer that never came within the
    # rendezvous timeout, a store that refused the connection): no worker ran here, nothing is
    # wrong with the job; the recreated pods meet again (a limit of 1 made one lost node permanent).
    if torchrun_code > 0 and agent_error and agent_error.get("rendezvous"):
        return EXIT_PEER_LOST
    # A negative code means torchrun itself died of a signal (e.g. -9): report it shell-style.
    return 128 - torchrun_code if torchrun_code < 0 else torchrun_code


def checkpoint_line(reports: dict[int, dict]) -> str:
    """Whether the workers' final checkpoint landed (is durable, marker written)."""
    main = reports.get(0)
    if not main or main.get("reason") == "running":
        return "final checkpoint: unknown (rank 0 did not report)"
    durable, step = main.get("checkpoint_step"), main.get("step")
    if main.get("reason") not in ("preempted", "completed"):
        return f"no final checkpoint (the newest durable one is step {durable})"
    if durable is None:
        return f"final checkpoint: none landed (stopped at step {step})"
    if isinstance(step, int) and step > durable:
        return f"final checkpoint: step {durable} landed (steps {durable + 1}-{step} will be recomputed)"
    return f"final checkpoint: step {durable} landed"


EXIT_BAD_INPUT = 2


def _option(argv: list[str], *names: str) -> str | None:
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                return argv[index + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def launch_world_size(torchrun_argv: list[str]) -> int | None:
    """nnodes x nproc-per-node from torchrun's own arguments (None when they do not say)."""
    nnodes = _option(torchrun_argv, "--nnodes") or "1"
    nproc = _option(torchrun_argv, "--nproc-per-node", "--nproc_per_node") or "1"
    try:
        return int(nnodes.split(":")[-1]) * int(nproc)
    except ValueError:  # "gpu", "auto", an unexpanded variable: known only to torchrun
        return None


def check_trainer_input(argv: list[str]) -> int:
    """The trainer's config checks, here, before torchrun starts any process.

    Run inside torchrun, a bad config makes every rank exit 2 and torchrun exit 1: the same
    verdict (permanent), but N copies of the message and the wrong code. Returns 0 or 2.
    """
    try:
        start = next(i for i in range(len(argv) - 2) if argv[i:i + 3] == ["-m", "trainer", "train"])
    except StopIteration:
        return 0
    from trainer.__main__ import train_input_problem

    problem = train_input_problem(argv[start + 3:], world_size=launch_world_size(argv[:start]))
    if problem:
        print(problem, file=sys.stderr)
        print(f"[trainer.launch] the trainer's input is invalid: not starting torchrun; exiting {EXIT_BAD_INPUT}",
              file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    return 0


def train_config(argv: list[str]):
    """The trainer's config from `... -m trainer train --config F overrides`, or None."""
    try:
        start = next(i for i in range(len(argv) - 2) if argv[i:i + 3] == ["-m", "trainer", "train"])
    except StopIteration:
        return None
    from trainer.__main__ import _add_train_arguments
    from trainer.config import ConfigError, load_config
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer train")
    _add_train_arguments(parser)
    try:
        args = parser.parse_args(argv[start + 3:])
        return load_config(args.config, args.overrides)
    except (SystemExit, ConfigError):  # already reported by check_trainer_input
        return None


def node_rank(torchrun_argv: list[str]) -> int:
    value = _option(torchrun_argv, "--node-rank", "--node_rank") or os.environ.get("PET_NODE_RANK") or "0"
    try:
        return int(value)
    except ValueError:
        return 0


class AttemptLog:
    """This node's attempts in `<checkpoint.dir>/attempts/` (see trainer.retries)."""

    def __init__(self, argv: list[str]):
        cfg = train_config(argv)
        if cfg is not None:
            self.dir, self.limit = cfg.checkpoint.dir, cfg.checkpoint.max_attempts_without_progress
        else:
            # Your own code (trainer/contract/): the same bound, counted in the job's checkpoint
            # directory, whose step-N/complete.json markers are progress.
            from trainer.config import CheckpointConfig

            self.dir = os.environ.get("TRAINER_CHECKPOINT_DIR") if not _runs_builtin_trainer(argv) else None
            self.limit = CheckpointConfig().max_attempts_without_progress if self.dir else 0
        self.path = retries.history_path(self.dir, node_rank(argv)) if self.dir else None
        self.started_at = time.time()
        self.step_at_start = retries.newest_complete_step(self.dir) if self.dir else None

    def refusal(self) -> str | None:
        if not self.path:
            return None
        return retries.refusal(retries.read_history(self.path), self.limit, self.step_at_start)

    def record(self, exit_code: int) -> None:
        if not self.path:
            return
        try:
            retries.record_attempt(self.path, exit_code, self.step_at_start,
                                   retries.newest_complete_step(self.dir), self.started_at)
        except OSError as exc:  # never turn the exit code into a launcher crash
            print(f"[trainer.launch] could not record this attempt in {self.path}: {exc}", file=sys.stderr)


RENDEZVOUS_TIMEOUT_ENV = "TRAINER_RENDEZVOUS_TIMEOUT_SECONDS"
# How long a node's agent waits for the others to arrive (static rendezvous: the TCPStore's
# connect and wait-for-workers timeout, torch/distributed/elastic/rendezvous/
# static_tcp_rendezvous.py, default 600 s). It covers the slowest pod's node launch and image
# pull, and must exceed parallelism.init_timeout_seconds plus a pod's restart: a survivor of a
# start-up failure exits after the latter, and its recreated pod must still find the other
# node's new agent waiting (docs/trainer.md, "Bounded failure times").
DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS = 900


def with_rendezvous_timeout(argv: list[str]) -> list[str]:
    """torchrun's arguments with the rendezvous timeout made explicit for static rendezvous
    (`--master-addr`/`--master-port`, how a PyTorchJob runs it). Left alone when the command
    names its own `--rdzv-conf`, another backend, or `--standalone` (one node: no peers)."""
    own = argv[:argv.index("-m")] if "-m" in argv else argv
    if any(a.split("=", 1)[0] in ("--rdzv-conf", "--rdzv_conf", "--rdzv-backend", "--rdzv_backend", "--standalone")
           for a in own):
        return argv
    value = os.environ.get(RENDEZVOUS_TIMEOUT_ENV, "")
    try:
        seconds = int(float(value)) if value else DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS
        if seconds <= 0:
            raise ValueError
    except ValueError:
        print(f"[trainer.launch] {RENDEZVOUS_TIMEOUT_ENV}={value!r}: not a positive number of seconds; "
              f"using {DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS}", file=sys.stderr)
        seconds = DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS
    return [f"--rdzv-conf=timeout={seconds}", *argv]


def _runs_builtin_trainer(argv: list[str]) -> bool:
    return any(argv[i:i + 3] == ["-m", "trainer", "train"] for i in range(len(argv) - 2))


def own_code_dir() -> tuple[str | None, int]:
    """Your code archive, downloaded and verified against its pinned digest (trainer/code_archive.py):
    (the directory torchrun runs in, 0), or (None, 2) when it is refused."""
    from trainer import code_archive

    try:
        return code_archive.materialize(), 0
    except code_archive.CodeArchiveError as exc:
        print(f"[trainer.launch] {exc}", file=sys.stderr)
        print(f"[trainer.launch] not starting torchrun; exiting {EXIT_BAD_INPUT} (permanent)", file=sys.stderr, flush=True)
        return None, EXIT_BAD_INPUT


def own_code_environment(code_dir: str | None):
    """Your code's requirements.txt installed into the job's shared environment
    (trainer/requirements_env.py): (the environment or None, 0), or (None, 3) when pip refused."""
    from trainer import requirements_env

    try:
        return requirements_env.prepare(code_dir), 0
    except requirements_env.RequirementsError as exc:
        print(f"[trainer.launch] {exc}", file=sys.stderr)
        print(f"[trainer.launch] not starting torchrun; exiting {requirements_env.EXIT_REQUIREMENTS} (permanent)",
              file=sys.stderr, flush=True)
        requirements_env.write_termination_message(f"requirements: {exc}")
        return None, requirements_env.EXIT_REQUIREMENTS


class StderrTail:
    """torchrun's stderr (its workers' too: they inherit it) passed through to ours line by
    line, with the last lines kept: what NCCL's watchdog logged before it aborted a worker is
    the only record of a GPU fault that killed it before Python could report it."""

    def __init__(self, pipe, keep_lines: int = 2000):
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._thread = threading.Thread(target=self._pump, args=(pipe,), name="stderr-tail", daemon=True)
        self._thread.start()

    def _pump(self, pipe) -> None:
        out = sys.stderr.buffer
        for line in iter(pipe.readline, b""):
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):  # our own stderr is gone: keep reading, or the workers block
                pass
            self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))
        pipe.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def add_watchdog_faults(reports: dict[int, dict], failures: list[dict], lines) -> None:
    """A worker that died without a report of its fault (NCCL's watchdog aborted it: SIGABRT)
    gets the GPU fault its watchdog logged, if it named one."""
    faults = watchdog_faults(lines)
    for failure in failures:
        rank = failure.get("rank")
        if rank not in faults or (reports.get(rank) or {}).get("gpu_fault"):
            continue
        report = reports.setdefault(rank, {"rank": rank, "reason": "failed", "local_rank": failure.get("local_rank")})
        report["gpu_fault"] = faults[rank]


def main(argv: list[str]) -> int:
    code_dir, code = own_code_dir()
    if code != 0:
        return code
    venv, code = own_code_environment(code_dir)
    if code != 0:
        return code
    if (code := check_trainer_input(argv)) != 0:
        return code
    attempts = AttemptLog(argv)
    if (why := attempts.refusal()) is not None:
        print(f"[trainer.launch] {why}", file=sys.stderr)
        print(f"[trainer.launch] not starting torchrun; exiting {retries.EXIT_RETRIES_EXHAUSTED} (permanent)",
              file=sys.stderr, flush=True)
        # Recorded too: a permanent exit ends the count, so a resubmitted job starts afresh.
        attempts.record(retries.EXIT_RETRIES_EXHAUSTED)
        return retries.EXIT_RETRIES_EXHAUSTED
    argv = with_rendezvous_timeout(argv)
    env = dict(os.environ)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_SECONDS)
    with tempfile.TemporaryDirectory(prefix="trainer-exit-") as status_dir:
        env["TRAINER_EXIT_STATUS_DIR"] = status_dir
        failures_file = os.path.join(status_dir, "torchrun-failures.json")
        env["TRAINER_TORCHRUN_FAILURES"] = failures_file
        if code_dir:
            # The archive's root is the working directory and first on the path (the image's /app,
            # with trainer.contract, stays importable after it).
            env["PYTHONPATH"] = os.pathsep.join(p for p in (code_dir, env.get("PYTHONPATH") or os.getcwd()) if p)
        python = sys.executable
        if venv is not None:
            # torchrun starts the workers with its own interpreter: the environment's, which sees
            # its packages first, then the image's. Its bin/ first on PATH for `--no-python` commands.
            python = venv.python
            env["VIRTUAL_ENV"] = venv.venv
            env["PATH"] = os.pathsep.join(p for p in (os.path.join(venv.venv, "bin"), env.get("PATH")) if p)
        child = subprocess.Popen([python, "-m", "trainer.elastic_run", *argv], env=env, cwd=code_dir,
                                 stderr=subprocess.PIPE)
        tail = StderrTail(child.stderr)
        signalled = []

        def forward(signum, frame):
            signalled.append(signum)
            # SIGUSR1 would kill torchrun outright; SIGTERM is the one it forwards to workers.
            child.send_signal(signal.SIGTERM)

        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, forward)
        code = child.wait()
        tail.join(timeout=10)
        reports = worker_reports(status_dir)
        record = read_json_or_none(failures_file) or {}
        failures = record.get("failures") or []
        add_watchdog_faults(reports, failures, tail.lines)
        agent_error = record.get("agent_error") if isinstance(record.get("agent_error"), dict) else None
    reasons = [r["reason"] for _, r in sorted(reports.items())]
    final = exit_code(code, bool(signalled), reasons, list(reports.values()), failures, agent_error)
    dead = ", ".join(f"rank {f.get('rank')} {f.get('signal') or 'exit ' + str(f.get('exitcode'))}" for f in failures)
    agent = (f"; torchrun's agent failed: {agent_error.get('type')}"
             f"{' (rendezvous: the other nodes did not meet this one)' if agent_error.get('rendezvous') else ''}"
             if agent_error else "")
    if final == 0 and code != 0:
        print(f"[trainer.launch] every rank completed training and the final checkpoint is durable; a rank failed "
              f"after that ({dead or 'torchrun exited ' + str(code)}): its export or registration may be missing, "
              "rerun it with `python -m trainer export --checkpoint <final step dir> --out <dir>`",
              file=sys.stderr, flush=True)
    print(f"[trainer.launch] torchrun exited {code}; workers: {reasons or 'no report'}"
          f"{'; failed workers: ' + dead if dead else ''}{agent}; signal: {bool(signalled)}; "
          f"{checkpoint_line(reports)}; exiting {final}", file=sys.stderr, flush=True)
    # 135 is also 128+SIGBUS, a worker's death by SIGBUS (an mmap'd data shard truncated on FSx):
    # the GPU is named only when a rank reported a GPU fault.
    faulty = [r for r in reports.values() if r.get("gpu_fault")]
    if final == EXIT_GPU_FAULT and faulty:
        report_gpu_fault(faulty)
    attempts.record(final)
    return final


TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath


def report_gpu_fault(reports: list[dict], path: str | None = None) -> None:
    """Say which GPU failed where the node's readiness agent reads it: the container's
    termination message (the kubelet copies the file into the pod's status,
    `containerStatuses[].state.terminated.message`, at most 4096 bytes). The format is
    trainer/gpu_faults.py's, which the agent parses."""
    message = termination_message(os.environ.get("NODE_NAME", "?"), reports)
    print("[trainer.launch] " + message.replace("\n", "; ") + f"; exiting {EXIT_GPU_FAULT} (retryable: another node)",
          file=sys.stderr, flush=True)
    path = path or os.environ.get("TRAINER_TERMINATION_LOG", TERMINATION_LOG)
    if os.path.exists(path):
        try:
            with open(path, "w") as f:
                f.write(message)
        except OSError as exc:  # the exit code still says it
            print(f"[trainer.launch] could not write {path}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
