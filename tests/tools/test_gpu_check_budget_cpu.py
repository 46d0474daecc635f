"""`make gpu-check GPU_CHECK_MODE=budget` run for real on a CPU (issue 35: "its budget mode is
timed on CPU with its GPU steps counted"): the report says how many GPU steps the budget holds
and that each was skipped here, and gives the run's wall time, so the CPU part's cost is known
before a device draw is spent on it (docs/performance.md)."""
import os
import re
import subprocess
import sys
import time

from tools import gpu_check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_budget_mode_on_cpu_lists_the_gpu_steps_it_skipped_and_its_wall_time(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRAINER_GPU_TESTS_ON_CPU"}
    env.update(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")  # a CPU run even on a GPU host
    started = time.monotonic()
    run = subprocess.run([sys.executable, "tools/gpu_check.py", "--mode", "budget", "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    elapsed = time.monotonic() - started
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    report = (tmp_path / "report.md").read_text()

    expected = ([f"benchmark: {label}" for label, _, _ in gpu_check.budget_gpu_benchmarks(str(tmp_path))]
                + [f"GPU test: {name}" for name in gpu_check.BUDGET_TESTS]
                + [f"trainer launch for the goals: {name}" for name in gpu_check.GOAL_LAUNCHES])
    assert len(expected) == 8  # 2 GPU benchmarks, the pinned-staging test, 5 launches
    assert f"GPU steps run: 0; GPU steps skipped (no GPU here): {len(expected)} of {len(expected)}" in report
    listed = re.findall(r"^- skipped: (.+)$", report, re.MULTILINE)
    assert listed == expected
    wall = re.search(r"^Wall time: (\d+) s \(CPU, ", report, re.MULTILINE)
    assert wall, report[-2000:]
    assert 0 < int(wall.group(1)) <= elapsed + 1  # the run's own clock, not a made-up figure
    summary = next(line for line in run.stdout.splitlines() if line.startswith("gpu-check budget mode:"))
    assert summary.endswith(f"GPU steps skipped: {len(expected)} of {len(expected)}"), summary
