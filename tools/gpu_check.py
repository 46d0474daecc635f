"""`make gpu-check`: the GPU test suite and the GPU benchmarks, then a Markdown report naming
the device, driver, torch and CUDA versions and the date. On a machine without a CUDA GPU it
says so, prints the GPU tests' skip reasons, runs the CPU parts (the benchmarks' CPU modes)
and exits 0 if they pass: no GPU figure is measured or written there.

    PYTHONPATH=. python3 tools/gpu_check.py [--out out/gpu-check] [--quick]

Runs with the packages a PyTorch GPU image already has (torch, numpy, PyYAML, transformers),
no network, no virtual environment; pytest is used when installed, else the tests' functions
are run directly. On a GPU it also records the flagship model's measured MFU and peak memory
for the GPU type in workloads/gpu_measurements.json, which preflight plans with.
Exit: 0 all passed (or no GPU and the CPU parts passed), 1 something failed.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment() -> dict:
    import torch

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda or "none (CPU build)", "gpu": torch.cuda.is_available()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = "not installed"
    if env["gpu"]:
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   memory_gib=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}",
                   cudnn=str(torch.backends.cudnn.version()))
        nccl = getattr(torch.cuda, "nccl", None)
        with_nccl = nccl.version() if nccl and hasattr(nccl, "version") else None
        env["nccl"] = ".".join(map(str, with_nccl)) if isinstance(with_nccl, tuple) else str(with_nccl)
    else:
        env["device"] = "no CUDA GPU (torch.cuda.is_available() is False)"
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
        env["driver"] = out.stdout.strip().splitlines()[0].split(",")[0].strip() if out.returncode == 0 and out.stdout.strip() \
            else f"nvidia-smi failed ({out.returncode})"
    else:
        env["driver"] = "nvidia-smi not found"
    return env


def run_tests(out_dir: str) -> dict:
    """The GPU suite: pytest when installed (skip reasons with -rs), else the test functions."""
    try:
        import pytest  # noqa: F401

        have_pytest = True
    except ImportError:
        have_pytest = False
    started = time.time()
    if have_pytest:
        junit = os.path.join(out_dir, "gpu-tests.xml")
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider",
               f"--junitxml={junit}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
        output = proc.stdout + proc.stderr
        print(output[-6000:])
        results = parse_junit(junit)
        return {"runner": "pytest", "command": " ".join(cmd[1:]), "returncode": proc.returncode, "results": results,
                "seconds": time.time() - started, "output_tail": output[-4000:]}
    results = []
    module = importlib.import_module("tests.gpu.test_gpu_trainer")
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if not name.startswith("test_") or fn.__module__ != module.__name__:
            continue
        t0 = time.time()
        try:
            fn()
            results.append({"name": name, "outcome": "passed", "seconds": time.time() - t0})
        except unittest.SkipTest as exc:
            results.append({"name": name, "outcome": "skipped", "reason": str(exc)})
        except Exception as exc:  # noqa: BLE001 - reported per test
            results.append({"name": name, "outcome": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000],
                            "traceback": traceback.format_exc()[-3000:]})
        print(f"{results[-1]['outcome']:8s} {name} {results[-1].get('reason', '')[:300]}")
    return {"runner": "built-in (no pytest installed)", "command": "tools/gpu_check.py", "results": results,
            "returncode": int(any(r["outcome"] == "failed" for r in results)), "seconds": time.time() - started}


def parse_junit(path: str) -> list[dict]:
    import xml.etree.ElementTree as ET

    if not os.path.isfile(path):
        return []
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = "failed", (child.get("message") or "")[:2000]
            elif child.tag == "skipped":
                outcome, reason = "skipped", child.get("message") or ""
        results.append({"name": case.get("name"), "outcome": outcome, "reason": reason,
                        "seconds": float(case.get("time", 0))})
    return results


def run_benchmark(label: str, args: list[str], out_dir: str, timeout: float) -> dict:
    cmd = [sys.executable, *args]
    print(f"\n== {label}: {' '.join(args)}", flush=True)
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": REPO})
        output, code = proc.stdout + proc.stderr[-3000:] * (proc.returncode != 0), proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = f"timed out after {timeout:.0f} s\n{(exc.stdout or '')[-3000:]}", 124
    print(output)
    return {"label": label, "command": os.path.basename(sys.executable) + " " + " ".join(args), "returncode": code, "output": output.strip(),
            "seconds": time.time() - started}


def benchmarks(gpu: bool, out_dir: str, quick: bool) -> list[dict]:
    j = lambda name: os.path.join(out_dir, name)  # noqa: E731
    if gpu:
        steps = "30" if quick else "60"
        return [
            run_benchmark("checkpoint stall, GPT-2 124M + AdamW on the GPU",
                          ["benchmarks/checkpoint_stall.py", "--size", "gpt2", "--repeats", "3", "--json", j("checkpoint_stall.json")],
                          out_dir, 900),
            run_benchmark("MFU, trainer vs nanoGPT loop, GPT-2 124M, micro-batch 16",
                          ["benchmarks/mfu.py", "--steps", steps, "--micro-batch-size", "16", "--json", j("mfu-16.json")], out_dir, 1200),
            run_benchmark("MFU, micro-batch 32",
                          ["benchmarks/mfu.py", "--steps", steps, "--micro-batch-size", "32", "--json", j("mfu-32.json")], out_dir, 1200),
            run_benchmark("MFU, trainer in deterministic mode (its cost), micro-batch 16",
                          ["benchmarks/mfu.py", "--steps", steps, "--micro-batch-size", "16", "--deterministic", "--json",
                           j("mfu-16-deterministic.json")], out_dir, 1200),
            run_benchmark("world size 1: plain / DDP / FSDP2", ["benchmarks/wrapper_cost.py", "--steps", "30", "--rounds", "3",
                                                               "--json", j("wrapper_cost.json")], out_dir, 1800),
        ]
    return [
        run_benchmark("checkpoint stall (CPU)", ["benchmarks/checkpoint_stall.py", "--size", "small", "--repeats", "3",
                                                 "--device", "cpu", "--json", j("checkpoint_stall.json")], out_dir, 900),
        run_benchmark("world size 1: plain / DDP / FSDP2 (CPU)", ["benchmarks/wrapper_cost.py", "--steps", "10", "--rounds", "3",
                                                                   "--json", j("wrapper_cost.json")], out_dir, 900),
        run_benchmark("MFU (GPU only)", ["benchmarks/mfu.py"], out_dir, 120),
    ]


def record_planning_figures(env: dict, out_dir: str) -> str:
    """The flagship example's model, as preflight plans it, measured here."""
    sys.path.insert(0, REPO)
    from workloads import gpu_measurements

    path = os.path.join(out_dir, "mfu-16.json")
    if not os.path.isfile(path):
        return "not recorded: the MFU benchmark wrote no figures"
    with open(path) as f:
        mfu = json.load(f)
    gpu_type = gpu_measurements.gpu_type_for(env["device"], env["memory_gib"])
    if gpu_type is None:
        return f"not recorded: {env['device']} is not a GPU type of workloads/gpu_catalog.py"
    figures = {"device": env["device"], "date": env["date"][:10], "torch": env["torch"], "cuda": env["cuda"],
               "driver": env["driver"], "command": "make gpu-check (" + mfu["command"] + ")", "mfu": round(mfu["mfu"], 4),
               "tokens_per_second": round(mfu["tokens_per_second"]), "step_seconds": mfu["step_seconds"],
               "peak_memory_gib": round(mfu["peak_memory_gib"], 2), "model": mfu["model"]}
    gpu_measurements.record(gpu_type, figures)
    gpu_measurements.record(gpu_type, figures, os.path.join(out_dir, "gpu_measurements.json"))
    return f"recorded for GPU type {gpu_type} in workloads/gpu_measurements.json: MFU {figures['mfu']:.1%}, peak {figures['peak_memory_gib']} GiB"


def report(env: dict, tests: dict, benches: list[dict], planning: str) -> str:
    counts = {k: sum(r["outcome"] == k for r in tests["results"]) for k in ("passed", "failed", "skipped")}
    lines = ["# GPU check", "", "| | |", "|---|---|"]
    for key in ("date", "device", "device_count", "memory_gib", "capability", "driver", "torch", "cuda", "cudnn", "nccl",
                "transformers", "python", "host"):
        if key in env:
            lines.append(f"| {key} | {env[key]} |")
    lines += [""]
    if not env["gpu"]:
        lines += ["**No CUDA GPU on this machine: the GPU tests skipped (reasons below), the GPU benchmarks said "
                  "\"not measured\", and no GPU figure was measured or recorded. The CPU parts ran.**", ""]
    lines += [f"## GPU tests ({tests['runner']}: `{tests['command']}`)", "",
              f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
              f"({tests['seconds']:.0f} s)", "", "| test | outcome | note |", "|---|---|---|"]
    for r in tests["results"]:
        lines.append(f"| {r['name']} | {r['outcome']} | {(r.get('reason') or '').splitlines()[0][:200] if r.get('reason') else ''} |")
    if not tests["results"]:
        lines += ["", "No test result was read back:", "```", tests.get("output_tail", "")[-3000:], "```"]
    lines += ["", "## Benchmarks", ""]
    for b in benches:
        lines += [f"### {b['label']}", "", f"`{b['command']}` (exit {b['returncode']}, {b['seconds']:.0f} s)", "", "```",
                  b["output"][-5000:], "```", ""]
    lines += ["## Planning figures for preflight", "", planning, ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(REPO, "out", "gpu-check"))
    parser.add_argument("--quick", action="store_true", help="shorter benchmarks")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = environment()
    print("environment:", json.dumps(env, indent=1), flush=True)
    tests = run_tests(args.out) if not args.skip_tests else {"runner": "skipped", "command": "--skip-tests",
                                                               "results": [], "returncode": 0, "seconds": 0}
    benches = benchmarks(env["gpu"], args.out, args.quick)
    planning = record_planning_figures(env, args.out) if env["gpu"] else "not measured: no CUDA GPU on this machine"
    text = report(env, tests, benches, planning)
    path = os.path.join(args.out, "report.md")
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"\nreport: {path}")
    failed_tests = any(r["outcome"] == "failed" for r in tests["results"]) or (
        tests["returncode"] not in (0, 5) and not tests["results"])
    failed_benches = [b["label"] for b in benches if b["returncode"] != 0]
    if failed_tests or failed_benches:
        print(f"gpu-check FAILED: tests failed: {failed_tests}; benchmarks failed: {failed_benches}")
        return 1
    print("gpu-check passed" + ("" if env["gpu"] else " (no GPU: CPU parts only, no GPU figure measured)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
