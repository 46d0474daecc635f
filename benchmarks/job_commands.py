"""How long an ML engineer waits for the job commands, against a real control plane, with a team
member's identity: `preflight`, `list` and `describe`, cold (the first command after a change: the
stack's facts are planned) and warm (the facts cache is hit), each a fresh `python -m workloads`
process as the engineer runs it; and whether the command imported torch (it must not: none of
these needs it).

    python3 benchmarks/job_commands.py [--stack dev] [--repeats 3] [--json PATH]

The control plane is the one tests/cluster use (tools/cluster/stack.py: kube-apiserver 1.32,
etcd, controller-manager, scheduler, the charts' controllers; `make cluster-tools`) with the
stack's in-cluster layer installed from its plan; a job from examples/ is submitted as the team so that `describe` has one to read.
Goal: warm <= 1.5 s per command on an idle 2-core machine. The machine's load average heads the
output: figures at a high load are that many times slower.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}
GOAL_WARM_S = 1.5


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, bool, str]:
    """(wall seconds, exit code, torch imported, stderr tail) of one command in a fresh process."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "workloads", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    imported = any(line.rstrip().endswith("| torch") for line in done.stderr.splitlines())
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    return seconds, done.returncode, imported, "\n".join(errors[-3:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="dev", choices=sorted(EXAMPLE))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    from infra.plan import build_plan
    from jobs.client import JobClient
    from jobs.kube import KubectlApi
    from tools.cluster.paths import tool_path
    from tools.cluster.stack import StackCluster
    from tools.schemas import schemas_dir
    from workloads.jobspec import load_job_spec
    from workloads.tenancy import team_group

    spec = load_job_spec(ROOT / EXAMPLE[args.stack])
    namespace = f"team-{spec.team}"
    print(f"job commands, stack {args.stack}, team {spec.team}; python {sys.version.split()[0]}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    started = time.monotonic()
    with StackCluster(args.stack, schemas_dir(ROOT), plan=build_plan(args.stack, ROOT)) as cluster:
        plane = cluster.plane
        print(f"control plane with the {args.stack} layer and its controllers: {time.monotonic() - started:.0f} s")
        kubeconfig = plane.kubeconfig(f"alice@{namespace}", [team_group(namespace)])
        cache = Path(tempfile.mkdtemp(prefix="mlp-facts-"))
        bin_dir = Path(tempfile.mkdtemp(prefix="mlp-kubectl-"))
        (bin_dir / "kubectl").symlink_to(tool_path("kubectl"))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "MLP_FACTS_CACHE": str(cache), "HOME": str(plane.workdir),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
        kube = KubectlApi(kubectl=str(tool_path("kubectl")), environ=env)
        JobClient(args.stack, kube=kube, offline=True).submit(spec)
        commands = {
            "preflight": ["preflight", EXAMPLE[args.stack], "--stack", args.stack, "--offline"],
            "list": ["list", "--stack", args.stack, "--offline"],
            "describe": ["describe", spec.name, "--stack", args.stack, "--offline"],
        }
        figures: dict[str, dict[str, object]] = {}
        for name, command in commands.items():
            for stale in cache.glob("*.json"):
                stale.unlink()  # cold: the stack's facts must be planned again
            cold, code, torch_cold, error = timed(command, env)
            if code:
                print(f"{name}: exit {code}: {error}")
                return 1
            warm = [timed(command, env) for _ in range(args.repeats)]
            seconds = [w[0] for w in warm]
            figures[name] = {"cold_s": round(cold, 2), "warm_s": [round(s, 2) for s in seconds],
                             "warm_median_s": round(statistics.median(seconds), 2),
                             "torch_imported": torch_cold or any(w[2] for w in warm)}
        print(f"{'command':<10} {'cold s':>7} {'warm s (median)':>16} {'warm s (each)':>22}  torch")
        for name, row in figures.items():
            print(f"{name:<10} {row['cold_s']:>7.2f} {row['warm_median_s']:>16.2f} "
                  f"{', '.join(f'{s:.2f}' for s in row['warm_s']):>22}  {'imported' if row['torch_imported'] else 'no'}")
        worst = max(row["warm_median_s"] for row in figures.values())
        print(f"warm goal {GOAL_WARM_S} s: worst median {worst:.2f} s ({worst / GOAL_WARM_S:.2f} x the goal) at load "
              f"{os.getloadavg()[0]:.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"stack": args.stack, "load": os.getloadavg()[0], "commands": figures},
                                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
