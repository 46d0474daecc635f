"""The GPU catalog is complete: every shape of every GPU type has its EC2 facts, a price and a peak.

Rules checked from their sources, not from our constants:
- EC2 g5/g6/g6e ladders (aws.amazon.com/ec2/instance-types/g5/): "g5.48xlarge | 8 GPUs | 192 vCPUs |
  768 GiB"; 4 vCPUs per xlarge across the family.
- NVIDIA H100 datasheet: "BF16 Tensor Core | H100 SXM 1,979 teraFLOPS* | H100 PCIe 1,513 teraFLOPS*
  ... * With sparsity" (dense = half).
"""
from __future__ import annotations

import dataclasses

import pytest

from catalog import gpus, prices


def test_every_shape_of_every_gpu_type_has_facts_a_price_and_a_peak():
    assert gpus.catalog_problems() == []
    for gpu in gpus.GPU_TYPES.values():
        assert gpu.peak_bf16_tflops > 0 and gpus.peak_tflops_for(gpu.cuda_device_name) == gpu.peak_bf16_tflops
        for shape in gpu.shapes:
            assert prices.price(shape.instance_type).on_demand_usd_per_hour == shape.on_demand_usd_per_hour > 0
            assert shape.vcpus > 0 and shape.memory_gib > 0 and shape.network_gbps > 0


def test_the_check_names_what_an_entry_lacks(monkeypatch):
    h100 = gpus.GPU_TYPES["h100"]
    broken = dataclasses.replace(
        h100, name="x1", peak_bf16_tflops=0.0, cuda_device_name="NVIDIA A10", cuda_name_key="A10",
        shapes=(dataclasses.replace(h100.shapes[0], instance_type="x1.48xlarge", on_demand_usd_per_hour=0.0),))
    monkeypatch.setattr(gpus, "GPU_TYPES", {**gpus.GPU_TYPES, "x1": broken})
    found = gpus.catalog_problems()
    assert "GPU type 'x1' has no peak bf16 TFLOP/s" in found
    assert "x1.48xlarge (x1): on_demand_usd_per_hour is 0.0, must be > 0" in found
    assert "GPU type 'x1': key 'A10' is also an other-device key" in found


def test_g_family_ladder_matches_the_ec2_pages():
    g5 = {s.instance_type: s for s in gpus.gpu_type("a10g").shapes}
    assert (g5["g5.48xlarge"].num_gpus, g5["g5.48xlarge"].vcpus, g5["g5.48xlarge"].memory_gib) == (8, 192, 768)
    assert all(s.vcpus == 4 * int(s.instance_type.split(".")[1].removesuffix("xlarge") or 1) for s in g5.values())


@pytest.mark.parametrize("device, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A10G", 70.0), ("NVIDIA A10", 125.0), ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0),
    ("NVIDIA GH200 480GB", 989.0), ("some CPU", None),
])
def test_device_names_resolve_to_the_most_specific_peak(device, peak):
    assert gpus.peak_tflops_for(device) == peak


def test_a_device_is_the_catalog_type_its_name_and_memory_say():
    assert gpus.gpu_type_for_device("NVIDIA A100-SXM4-80GB", 79.0) == "a100-80gb"
    assert gpus.gpu_type_for_device("NVIDIA A100-SXM4-40GB", 39.0) == "a100"
    # A PCIe H100 is not the p5's SXM part: no pool offers it, so no measurement is filed under h100.
    assert gpus.gpu_type_for_device("NVIDIA H100 PCIe", 79.0) is None


def test_the_readme_lists_the_catalog_gpu_types():
    from infra.config import GpuPoolConfig

    assert GpuPoolConfig.model_fields["gpu_type"].description == " | ".join(gpus.GPU_TYPES)
