"""The EFA pool gate: NCCL's own log lines say which transport it used, and the bus bandwidth
floor per instance type. Logs under data/nccl are built from NCCL INFO lines quoted in public
issues:

- NVIDIA/nccl#1597 (p5en, aws-ofi-nccl): ``NCCL INFO Using network Libfabric`` and
  ``NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)``;
- aws/aws-ofi-nccl#64 (p4d, older plugin): ``NCCL INFO Using network AWS Libfabric`` era channel
  lines ``Channel 01 : 9[101d0] -> 0[101c0] [receive] via NET/AWS Libfabric/0`` (no GDRDMA);
- NVIDIA/nccl#707 / nccl-tests#133: the GPUDirect RDMA suffix, ``... [receive] via NET/IB/5/GDRDMA``
  (the efa-gdr-pass log puts it on Libfabric channels, as NCCL prints it for any net plugin);
- NVIDIA/nccl#952 and aws/aws-ofi-nccl#889: the TCP fallback, ``NET/Socket : Using [0]eth0:...``,
  ``fi_getinfo: provider efa output empty list`` and channels ``via NET/Socket/3``.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.nccl_transport import main, parse_log, problems
from workloads.readiness import BUSBW_REFERENCES, FLOOR_FRACTION, gate_floor_gb_per_s, gpu_check_script, has_gpudirect_rdma

DATA = Path(__file__).parent / "data" / "nccl"
ROOT = Path(__file__).resolve().parents[2]


def check(name, *, gdr=True, floor=360.0):
    return problems(parse_log((DATA / name).read_text()), expect_efa=True, require_gdr=gdr, min_busbw_gb_per_s=floor)


def test_efa_with_gpudirect_rdma_and_enough_bandwidth_passes():
    transport = parse_log((DATA / "efa-gdr-pass.log").read_text())
    assert transport.networks == ("Libfabric",) and transport.providers == ("efa",)
    assert transport.net_channels == transport.gdr_channels == 4
    assert transport.busbw_gb_per_s == 527.0
    assert check("efa-gdr-pass.log") == []


def test_tcp_fallback_fails_on_the_transport_and_the_bandwidth():
    found = check("tcp-fallback.log")
    assert any("not Libfabric" in p and "TCP fallback" in p for p in found)
    assert any("provider is not reported, not efa" in p for p in found)
    assert "inter-node channels run over Socket" in found
    assert any("2.2 GB/s is below the floor 360" in p for p in found)


def test_missing_gpudirect_rdma_fails_only_where_the_instance_has_it():
    assert check("efa-no-gdr.log", gdr=True) == ["2 of 2 inter-node channels lack GPUDirect RDMA (no /GDRDMA): "
                                                 "check FI_EFA_USE_DEVICE_RDMA=1 and the driver's peer-memory support"]
    assert check("efa-no-gdr.log", gdr=False) == []


def test_low_bandwidth_on_a_good_transport_fails_on_the_floor_alone():
    assert check("efa-low-bandwidth.log") == ["all-reduce bus bandwidth 117.7 GB/s is below the floor 360 GB/s"]


@pytest.mark.parametrize("log, code", [("efa-gdr-pass.log", 0), ("tcp-fallback.log", 1), ("efa-low-bandwidth.log", 1)])
def test_cli_exit_codes(log, code, capsys):
    assert main([str(DATA / log), "--expect", "efa", "--require-gdr", "--min-busbw-gb-per-s", "360"]) == code
    assert ('"ok": true' in capsys.readouterr().out) is (code == 0)


def test_floors_per_instance_type_have_a_source():
    # 2 x p5.48xlarge, 1024 MB all_reduce_perf: busbw 435.14 GB/s (aws-gpu-communication-benchmark data).
    assert gate_floor_gb_per_s("p5.48xlarge", efa=True) == round(435.1 * FLOOR_FRACTION, 1) == 326.3
    assert gate_floor_gb_per_s("p4de.24xlarge", efa=True) == round(57.2 * FLOOR_FRACTION, 1)
    assert all(r.source for r in BUSBW_REFERENCES.values())
    # No measured reference: the line-rate rule.
    from workloads.instances import busbw_floor_gb_per_s
    assert gate_floor_gb_per_s("g6e.48xlarge", efa=True) == busbw_floor_gb_per_s("g6e.48xlarge", efa=True)
    assert has_gpudirect_rdma("p5.48xlarge") and not has_gpudirect_rdma("g6e.48xlarge")


def _fake_bin(tmp_path: Path, log: Path, all_reduce_rc: int) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\ncase \"$*\" in *index*) seq 0 7;; *ecc*) for i in 0 1 2 3 4 5 6 7; do echo 0; done;; esac\n")
    # `python -m trainer.launch ...` prints the recorded NCCL log; `python -m trainer.nccl_transport` is the real one.
    (bin_dir / "python").write_text(
        f"#!/bin/sh\nif [ \"$2\" = trainer.launch ]; then cat {log}; exit {all_reduce_rc}; fi\nexec {sys.executable} \"$@\"\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize("log, all_reduce_rc, code", [("efa-gdr-pass.log", 0, 0), ("tcp-fallback.log", 0, 1),
                                                      ("efa-gdr-pass.log", 1, 1)])
def test_the_pods_script_gates_on_the_transport(tmp_path, log, all_reduce_rc, code):
    """Runs the rendered script with sh, nvidia-smi and the all-reduce replaced by recorded output."""
    from types import SimpleNamespace

    pool = SimpleNamespace(gpus_per_node=8, efa=True, instance_types=["p5.48xlarge"])
    script = gpu_check_script(pool, 360.0, "p5.48xlarge").replace("/tmp/readiness.log", str(tmp_path / "run.log"))
    env = {"PATH": _fake_bin(tmp_path, DATA / log, all_reduce_rc) + ":/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           **{k: "1" for k in ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")}}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
