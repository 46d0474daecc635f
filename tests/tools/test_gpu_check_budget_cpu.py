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
    assert "Deadline: 720 s for the whole run (budget mode)" in report  # 12 minutes, inside a 15-minute loan
    wall = re.search(r"^Wall time: (\d+) s \(CPU, ", report, re.MULTILINE)
    assert wall, report[-2000:]
    assert 0 < int(wall.group(1)) <= elapsed + 1  # the run's own clock, not a made-up figure
    summary = next(line for line in run.stdout.splitlines() if line.startswith("gpu-check budget mode:"))
    assert summary.endswith(f"GPU steps skipped: {len(expected)} of {len(expected)}"), summary


def test_budget_mode_stops_at_its_deadline_and_says_what_it_did_not_run(tmp_path):
    """Budget mode had no overall deadline: its steps' own timeouts added up to 29 minutes
    against the 15 a device is lent for. With a deadline too short for its checkpoint-stall
    benchmark, the run ends near the deadline, fails, and its report says why."""
    env = {k: v for k, v in os.environ.items() if k != "TRAINER_GPU_TESTS_ON_CPU"}
    env.update(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    started = time.monotonic()
    run = subprocess.run([sys.executable, "tools/gpu_check.py", "--mode", "budget", "--out", str(tmp_path),
                          "--skip-tests", "--deadline-seconds", "8"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    elapsed = time.monotonic() - started
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "the deadline (8 s) cut: benchmark checkpoint stall (CPU)" in out, out[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert "timed out after" in report or "not run: the run's deadline (8 s) had passed" in report, report[-3000:]
    assert "Deadline: 8 s for the whole run (budget mode); it cut: benchmark checkpoint stall (CPU)" in report
    assert elapsed < 8 + 90, f"{elapsed:.0f} s"  # start-up, the cut benchmark's kill, the report: not its 300 s


def test_a_budget_run_cut_off_from_outside_leaves_the_report_of_what_it_measured(tmp_path):
    """The report used to be written only at the end: a run killed at the end of its device
    loan left nothing. It is written after every step."""
    import signal

    env = {k: v for k, v in os.environ.items() if k != "TRAINER_GPU_TESTS_ON_CPU"}
    env.update(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen([sys.executable, "tools/gpu_check.py", "--mode", "budget", "--out", str(tmp_path)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    report = tmp_path / "report.md"
    try:
        deadline = time.monotonic() + 600
        # The GPU tests' step done (skipped here), the benchmarks not yet: cut it off there.
        while time.monotonic() < deadline and proc.poll() is None:
            if report.exists() and "## GPU tests (pytest" in report.read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be cut off"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the process group this test started
        proc.wait()
    text = report.read_text()
    assert "| device |" in text or "| host |" in text
    assert "## GPU tests (pytest" in text and "skipped" in text
    assert "## Not reached" in text and "- goals" in text, text[-2000:]
