"""Preflight plans with what `make gpu-check` measured on the pool's GPU type (issue 28 item 8):
the measured MFU replaces the 35% default, the measured peak memory of the same model and
micro-batch is shown and checked, and the report says which figure it used. The records
here are test input written to a temporary file, not measurements."""
from __future__ import annotations

import json

from workloads import gpu_measurements


def test_gpu_names_map_to_the_catalog_types():
    assert gpu_measurements.gpu_type_for("NVIDIA H100 80GB HBM3", 79.2) == "h100"
    assert gpu_measurements.gpu_type_for("NVIDIA L40S", 44.4) == "l40s"
    assert gpu_measurements.gpu_type_for("NVIDIA L4", 22.0) == "l4"
    assert gpu_measurements.gpu_type_for("NVIDIA A100-SXM4-80GB", 79.0) == "a100-80gb"
    assert gpu_measurements.gpu_type_for("NVIDIA A100-SXM4-40GB", 39.0) == "a100"
    assert gpu_measurements.gpu_type_for("Some other GPU", 16.0) is None


def test_the_shipped_file_holds_no_invented_figures():
    # Only `make gpu-check` on a GPU writes entries; each must name its device, date and versions.
    for gpu_type, figures in gpu_measurements.load().items():
        for key in ("device", "date", "torch", "cuda", "command", "mfu", "peak_memory_gib", "model"):
            assert key in figures, f"{gpu_type}: measurement without {key}"


def test_planning_mfu_prefers_a_measurement_and_says_which(tmp_path):
    from jobs.preflight import DEFAULT_MFU, planning_mfu

    path = tmp_path / "m.json"
    gpu_measurements.record("h100", {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25", "torch": "2.11.0",
                                     "cuda": "13.0", "mfu": 0.383, "peak_memory_gib": 9.1, "command": "make gpu-check",
                                     "model": {}}, str(path))
    measured = gpu_measurements.load(str(path))
    assert json.loads(path.read_text())["gpus"]["h100"]["mfu"] == 0.383
    mfu, source = planning_mfu("h100", None, measured)
    assert mfu == 0.383 and source.startswith("measured by make gpu-check on NVIDIA H100 80GB HBM3, 2026-11-25")
    mfu, source = planning_mfu("a10g", None, measured)
    assert mfu == DEFAULT_MFU and "nothing measured on a10g" in source
    assert planning_mfu("h100", 0.5, measured) == (0.5, "given")


def test_memory_transfers_only_between_identical_shapes():
    figures = {"model": {"num_layers": 12, "hidden_size": 768, "seq_len": 1024, "micro_batch_size": 16,
                         "vocab_size": 50304}}
    same = dict(num_layers=12, hidden_size=768, seq_len=1024, micro_batch_size=16, vocab_size=50304,
                strategy="ddp", activation_checkpointing=False)
    assert gpu_measurements.matches(figures, **same)
    assert not gpu_measurements.matches(figures, **{**same, "micro_batch_size": 32})
    assert not gpu_measurements.matches(figures, **{**same, "strategy": "fsdp"})
