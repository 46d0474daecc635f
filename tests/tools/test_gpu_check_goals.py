"""`make gpu-check` fails the run on a missed goal (review trainer-4 §2.5-2.6: "No thresholds";
MFU 28% passed). The goals read the benchmarks' JSON; here the JSON is written by hand, the
way benchmarks/mfu.py and benchmarks/checkpoint_stall.py write it on an H100."""
import json

from tools import gpu_check

H100 = {"gpu": True, "device": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1}


def figures(tmp_path, mfu: float, blocked: list[float], sealing: list[float]) -> str:
    (tmp_path / "mfu-16.json").write_text(json.dumps({"mfu": mfu}))
    (tmp_path / "checkpoint_stall.json").write_text(json.dumps({"async_blocked_s": blocked, "async_finalize_s": sealing}))
    return str(tmp_path)


def verdicts(goals) -> dict:
    return {g["name"]: g["verdict"] for g in goals}


def test_the_h100_goals_are_met_by_good_figures_and_missed_by_the_reviewed_ones(tmp_path):
    good = gpu_check.performance_goals(H100, figures(tmp_path, 0.46, [0.05, 0.04, 0.05], [0.01, 0.01, 0.01]), {})
    assert verdicts(good) == {"mfu": "met", "mfu_floor": "met", "async_blocked_s": "met", "first_save_ratio": "met"}
    # The documented goal is 45% (docs/trainer-reference.md, "Performance goals"): 39% clears the regression floor
    # (35%) and still misses the goal, so the run does not pass.
    floor_only = gpu_check.performance_goals(H100, figures(tmp_path, 0.39, [0.05] * 3, [0.01] * 3), {})
    assert (verdicts(floor_only)["mfu"], verdicts(floor_only)["mfu_floor"]) == ("MISSED", "met")
    # What the H100 measured before the fixes: 27.8% MFU, async saves blocking about 1 s.
    bad = gpu_check.performance_goals(H100, figures(tmp_path, 0.278, [1.16, 0.97, 1.0], [0.0, 0.0, 0.0]), {})
    assert verdicts(bad)["mfu_floor"] == "MISSED" and verdicts(bad)["async_blocked_s"] == "MISSED"
    # Sealing the save at the next step boundary counts: 0.05 s at the save + 0.08 s after it.
    sealed = gpu_check.performance_goals(H100, figures(tmp_path, 0.39, [0.05] * 3, [0.08] * 3), {})
    assert verdicts(sealed)["async_blocked_s"] == "MISSED"


def test_a_raised_floor_misses_and_a_gpu_without_a_floor_is_not_a_pass(tmp_path):
    out = figures(tmp_path, 0.46, [0.05] * 3, [0.0] * 3)
    assert verdicts(gpu_check.performance_goals(H100, out, {"mfu_floor": 0.9}))["mfu_floor"] == "MISSED"
    assert verdicts(gpu_check.performance_goals(H100, out, {"mfu": 0.5}))["mfu"] == "MISSED"
    a10g = {"gpu": True, "device": "NVIDIA A10G", "memory_gib": 22.0}
    assert verdicts(gpu_check.performance_goals(a10g, out, {}))["mfu_floor"] == "n/a"
    assert verdicts(gpu_check.performance_goals(a10g, out, {}))["mfu"] == "n/a"
    cpu = {"gpu": False}
    assert verdicts(gpu_check.performance_goals(cpu, out, {}))["mfu_floor"] == "n/a"


def test_on_a_cpu_the_save_goals_are_reported_and_judged_only_on_request(tmp_path):
    """A CPU copy's time follows whatever shares the cores (a first save 1.34 x the median was
    measured in `make test` with the other xdist workers running): shown, not judged, unless a target is
    given, as the GPU figures are."""
    cpu = {"gpu": False}
    out = figures(tmp_path, 0.39, [1.4, 1.0, 1.0], [0.0] * 3)
    goals = {g["name"]: g for g in gpu_check.performance_goals(cpu, out, {})}
    assert (goals["first_save_ratio"]["verdict"], goals["first_save_ratio"]["measured"]) == ("n/a", "1.40 x")
    assert goals["async_blocked_s"]["verdict"] == "n/a" and "GPU state" in goals["first_save_ratio"]["note"]
    asked = verdicts(gpu_check.performance_goals(cpu, out, {"first_save_ratio": 1.2, "async_blocked_s": 0.1}))
    assert (asked["first_save_ratio"], asked["async_blocked_s"]) == ("MISSED", "MISSED")
    assert verdicts(gpu_check.performance_goals(H100, out, {}))["first_save_ratio"] == "MISSED"


def test_a_missed_goal_fails_the_run_and_the_report_says_which(tmp_path, monkeypatch):
    """main() end to end with the GPU parts replaced by their outputs: the figures meet every
    goal, so it exits 0; the same figures against a raised MFU floor exit 1."""
    def fake_benchmarks(gpu, out_dir, quick, budget=False, after_each=None):
        figures(tmp_path, 0.46, [0.05] * 3, [0.01] * 3)
        return [{"label": "fake", "command": "fake", "returncode": 0, "output": "", "seconds": 0.0}]

    env = {**H100, "date": "2026-11-27 00:00 UTC", "torch": "x", "cuda": "x", "driver": "x"}
    monkeypatch.setattr(gpu_check, "environment", lambda: env)
    monkeypatch.setattr(gpu_check, "benchmarks", fake_benchmarks)
    monkeypatch.setattr(gpu_check, "record_planning_figures", lambda env, out: "not recorded (test)")
    monkeypatch.setattr(gpu_check, "determinism_goals", lambda env: [
        gpu_check.goal("determinism", "bitwise", "equal; default differs", True),
        gpu_check.goal("bitwise_resume", "bitwise", "equal", True)])
    base = ["gpu_check.py", "--out", str(tmp_path), "--mode", "budget", "--skip-tests"]
    monkeypatch.setattr("sys.argv", base)
    assert gpu_check.main() == 0
    monkeypatch.setattr("sys.argv", base + ["--goal", "mfu_floor=0.9"])
    assert gpu_check.main() == 1
    report = (tmp_path / "report.md").read_text()
    assert "| mfu_floor | >= 90.0% (regression floor, h100) | 46.0% | MISSED |" in report
    assert "| mfu | >= 45.0% (goal, h100) | 46.0% | met |" in report
    assert "## Budget mode: not run" in report
