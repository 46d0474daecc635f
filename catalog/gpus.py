"""The GPU types an ML engineer names, and every EC2 instance type that carries them: one entry
per GPU type, each shape with its vCPUs, memory, network, EFA cards and on-demand price.

Adding a GPU type (or an instance of one) is one entry in ``GPU_TYPES`` below; the import-time
check at the end refuses an entry that lacks a figure, so nothing is found missing later
(preflight, the plan's cost report, the trainer's MFU and the README's config reference all read
this table).

Sources, Nov 2026:
- instance shapes, vCPUs, memory, network bandwidth, EFA network cards: the EC2 accelerated-
  computing instance pages (https://aws.amazon.com/ec2/instance-types/p5/, /p4/, /g6/, /g5/, /g6e/)
  and the EC2 User Guide's "Maximum network interfaces" / EFA tables. Where two GPU types share a
  Karpenter gpu-name (a100 40 GB on p4d, a100 80 GB on p4de), the instance family tells them apart.
- on-demand prices: USD per instance-hour, Linux, us-east-1 and us-west-2 (the same in both), from
  https://aws.amazon.com/ec2/pricing/on-demand/ after AWS's June 2025 GPU price reduction
  ("Announcing up to 45% price reduction for Amazon EC2 NVIDIA GPU-accelerated instances",
  2025-06-05); recorded offline, check them against the page before quoting a budget
  (catalog/prices.py holds the source, date and spot assumption).
- peak dense bf16 tensor TFLOP/s per GPU, no sparsity (the datasheets print the sparse figure,
  twice these, with an asterisk):
    H100 SXM 989 / PCIe 756 / NVL 835: nvidia.com/en-us/data-center/h100 (datasheet table)
    H200 989: nvidia.com/en-us/data-center/h200
    A100 312: nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    L40S 362: nvidia.com/en-us/data-center/l40s ; L40 181: L40 datasheet
    L4 121: nvidia.com/en-us/data-center/l4
    A10 125: nvidia.com/en-us/data-center/products/a10-gpu
    A10G 70: AWS's g5 variant of the A10 has no public NVIDIA datasheet (the A10 datasheet's 125 is
      the A10's); 70 is the dense bf16 figure of the A10 vs A10G spec comparison
      (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference: "the A10 prioritizes tensor
      compute, while the A10G has a higher CUDA core performance"). Preflight and the trainer's
      MFU both use 70 (they once disagreed: 125 vs 70).
- CUDA device names: what ``torch.cuda.get_device_name()`` reports on the catalog's instances.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

# EC2 gives a spot instance two minutes between the interruption notice and reclaiming it
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
SPOT_NOTICE_SECONDS = 120


@dataclass(frozen=True)
class InstanceShape:
    """One EC2 instance type of a GPU type, with the facts jobs, readiness checks and costs need."""

    instance_type: str
    num_gpus: int
    # 0 = no EFA; otherwise the number of network cards that each get an EFA interface.
    num_efa_network_cards: int
    vcpus: int
    memory_gib: int
    network_gbps: float
    on_demand_usd_per_hour: float

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def efa(self) -> bool:
        return self.num_efa_network_cards > 0


@dataclass(frozen=True)
class GpuType:
    """A GPU model as ML engineers name it, where EC2 offers it, and how fast it is."""

    name: str  # the config value: "h100"
    karpenter_gpu_name: str  # value of karpenter.k8s.aws/instance-gpu-name
    gpu_memory_gib: int
    peak_bf16_tflops: float  # dense, per GPU (module docstring: sources)
    # torch.cuda.get_device_name() on its instances, and the part of it that identifies the
    # GPU model (matched as a substring, the longest match wins: "A10G" is not "A10").
    cuda_device_name: str
    cuda_name_key: str
    shapes: tuple[InstanceShape, ...] = field(default_factory=tuple)
    description: str = ""

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(sorted({s.family for s in self.shapes}))

    @property
    def gpus_per_node_options(self) -> tuple[int, ...]:
        return tuple(sorted({s.num_gpus for s in self.shapes}))

    @property
    def efa_gpus_per_node_options(self) -> tuple[int, ...]:
        return tuple(sorted({s.num_gpus for s in self.shapes if s.efa}))

    @property
    def supports_efa(self) -> bool:
        return any(s.efa for s in self.shapes)

    def shapes_for(self, num_gpus: int, *, efa: bool) -> tuple[InstanceShape, ...]:
        """Instance types a pool of ``num_gpus`` GPUs per node may launch.

        With EFA, only EFA-capable types that share the first one's network-card layout: one
        EC2NodeClass describes one set of EFA interfaces, and a layout with fewer cards than the
        instance has would leave bandwidth unused.
        """
        shapes = tuple(s for s in self.shapes if s.num_gpus == num_gpus and (s.efa or not efa))
        if efa and shapes:
            shapes = tuple(s for s in shapes if s.num_efa_network_cards == shapes[0].num_efa_network_cards)
        return shapes


# g5 / g6 / g6e share one size ladder: 1 GPU up to 16xlarge, 4 GPUs at 12/24xlarge, 8 at
# 48xlarge, 4 vCPUs per xlarge; EFA from 8xlarge up (one network card, except 48xlarge).
_G_LADDER = (  # size, GPUs, vCPUs, EFA from here
    ("xlarge", 1, 4, False), ("2xlarge", 1, 8, False), ("4xlarge", 1, 16, False), ("8xlarge", 1, 32, True),
    ("16xlarge", 1, 64, True), ("12xlarge", 4, 48, True), ("24xlarge", 4, 96, True), ("48xlarge", 8, 192, True),
)
_G_MEMORY_GIB = {"xlarge": 16, "2xlarge": 32, "4xlarge": 64, "8xlarge": 128, "16xlarge": 256, "12xlarge": 192,
                 "24xlarge": 384, "48xlarge": 768}
_G_NETWORK_GBPS = {"xlarge": 10, "2xlarge": 10, "4xlarge": 25, "8xlarge": 25, "16xlarge": 25, "12xlarge": 40,
                   "24xlarge": 50, "48xlarge": 100}


def _g_family(family: str, *, efa_cards_48xl: int, usd_per_hour: Mapping[str, float], memory_factor: int = 1,
              network_gbps: Mapping[str, float] = _G_NETWORK_GBPS) -> tuple[InstanceShape, ...]:
    return tuple(
        InstanceShape(f"{family}.{size}", gpus, (efa_cards_48xl if size == "48xlarge" else 1) if efa else 0,
                      vcpus, _G_MEMORY_GIB[size] * memory_factor, network_gbps[size], usd_per_hour[size])
        for size, gpus, vcpus, efa in _G_LADDER
    )


GPU_TYPES: Mapping[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("a100", "a100", 40, 312.0, "NVIDIA A100-SXM4-40GB", "A100",
                (InstanceShape("p4d.24xlarge", 8, 4, 96, 1152, 400, 21.96),), "NVIDIA A100 40 GB (p4d)"),
        GpuType("a100-80gb", "a100", 80, 312.0, "NVIDIA A100-SXM4-80GB", "A100",
                (InstanceShape("p4de.24xlarge", 8, 4, 96, 1152, 400, 27.45),), "NVIDIA A100 80 GB (p4de)"),
        GpuType(
            "h100", "h100", 80, 989.0, "NVIDIA H100 80GB HBM3", "H100",
            # p5.4xlarge (1 GPU) is listed without EFA here: multi-node jobs use p5.48xlarge.
            (InstanceShape("p5.48xlarge", 8, 32, 192, 2048, 3200, 55.04),
             InstanceShape("p5.4xlarge", 1, 0, 16, 256, 100, 6.88)),
            "NVIDIA H100 80 GB (p5)",
        ),
        GpuType(
            "h200", "h200", 141, 989.0, "NVIDIA H200", "H200",
            # p5en first: an EFA pool uses one network-card layout (see shapes_for).
            (InstanceShape("p5en.48xlarge", 8, 16, 192, 2048, 3200, 63.30),
             InstanceShape("p5e.48xlarge", 8, 32, 192, 2048, 3200, 63.30)),
            "NVIDIA H200 141 GB (p5e, p5en)",
        ),
        GpuType("l4", "l4", 24, 121.0, "NVIDIA L4", "L4", _g_family("g6", efa_cards_48xl=1, usd_per_hour={
            "xlarge": 0.8048, "2xlarge": 0.9776, "4xlarge": 1.3232, "8xlarge": 2.0144, "16xlarge": 3.3968,
            "12xlarge": 4.6016, "24xlarge": 6.6752, "48xlarge": 13.3504}), "NVIDIA L4 24 GB (g6)"),
        GpuType("a10g", "a10g", 24, 70.0, "NVIDIA A10G", "A10G", _g_family("g5", efa_cards_48xl=1, usd_per_hour={
            "xlarge": 1.006, "2xlarge": 1.212, "4xlarge": 1.624, "8xlarge": 2.448, "16xlarge": 4.096,
            "12xlarge": 5.672, "24xlarge": 8.144, "48xlarge": 16.288}), "NVIDIA A10G 24 GB (g5)"),
        GpuType("l40s", "l40s", 48, 362.0, "NVIDIA L40S", "L40S", _g_family(
            "g6e", efa_cards_48xl=4, memory_factor=2,
            network_gbps={"xlarge": 20, "2xlarge": 20, "4xlarge": 20, "8xlarge": 25, "16xlarge": 35, "12xlarge": 100,
                          "24xlarge": 200, "48xlarge": 400},
            usd_per_hour={"xlarge": 1.861, "2xlarge": 2.24208, "4xlarge": 3.00424, "8xlarge": 4.52856,
                          "16xlarge": 7.57719, "12xlarge": 10.49264, "24xlarge": 15.06559, "48xlarge": 30.13118}),
                "NVIDIA L40S 48 GB (g6e)"),
    )
}

# Peaks of GPUs the trainer may run on that no platform pool offers (a laptop, another cloud),
# keyed like GpuType.cuda_name_key; same sources as above (B200/GB200: nvidia.com/en-us/data-center/dgx-b200,
# /gb200-nvl72; V100 has no bf16: its fp16 figure).
OTHER_DEVICE_PEAK_BF16_TFLOPS: Mapping[str, float] = {
    "GB200": 2500.0, "B200": 2250.0, "GH200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H800": 989.0,
    "A800": 312.0, "L40": 181.0, "A10": 125.0, "V100": 125.0,
}


def gpu_type(name: str) -> GpuType:
    try:
        return GPU_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_TYPES))}") from None


def instance_shapes() -> dict[str, InstanceShape]:
    """Every GPU instance type of the catalog, by name."""
    return {s.instance_type: s for g in GPU_TYPES.values() for s in g.shapes}


def device_peaks() -> dict[str, float]:
    """Peak bf16 TFLOP/s by device-name key: the catalog's GPU types, then the other devices."""
    return {**{g.cuda_name_key: g.peak_bf16_tflops for g in GPU_TYPES.values()}, **OTHER_DEVICE_PEAK_BF16_TFLOPS}


def _longest_key(device_name: str, keys: list[str]) -> Optional[str]:
    found = [k for k in keys if k.lower() in device_name.lower()]
    return max(found, key=len) if found else None


def peak_tflops_for(device_name: str) -> Optional[float]:
    """Peak dense bf16 TFLOP/s of a device named as torch.cuda.get_device_name() names it."""
    peaks = device_peaks()
    key = _longest_key(device_name, list(peaks))
    return peaks[key] if key else None


def gpu_type_for_device(device_name: str, memory_gib: float) -> Optional[str]:
    """The catalog GPU type a device is (the one whose memory is closest where the name is shared:
    an A100 with 80 GB is ``a100-80gb``), or None for a device no pool offers."""
    key = _longest_key(device_name, list(device_peaks()))
    matches = [g for g in GPU_TYPES.values() if g.cuda_name_key == key]
    return min(matches, key=lambda g: abs(g.gpu_memory_gib - memory_gib)).name if matches else None


def catalog_problems() -> list[str]:
    """What an entry lacks or contradicts; empty when every shape of every GPU type is complete."""
    out = []
    shapes: dict[str, str] = {}
    for g in GPU_TYPES.values():
        if not g.shapes:
            out.append(f"GPU type {g.name!r} has no instance shapes")
        if g.peak_bf16_tflops <= 0:
            out.append(f"GPU type {g.name!r} has no peak bf16 TFLOP/s")
        if g.cuda_name_key.lower() not in g.cuda_device_name.lower():
            out.append(f"GPU type {g.name!r}: key {g.cuda_name_key!r} is not part of {g.cuda_device_name!r}")
        elif peak_tflops_for(g.cuda_device_name) != g.peak_bf16_tflops:
            out.append(f"GPU type {g.name!r}: {g.cuda_device_name!r} resolves to another peak")
        if g.cuda_name_key in OTHER_DEVICE_PEAK_BF16_TFLOPS:
            out.append(f"GPU type {g.name!r}: key {g.cuda_name_key!r} is also an other-device key")
        for s in g.shapes:
            if s.instance_type in shapes:
                out.append(f"{s.instance_type} is listed under {shapes[s.instance_type]!r} and {g.name!r}")
            shapes[s.instance_type] = g.name
            for figure in ("num_gpus", "vcpus", "memory_gib", "network_gbps", "on_demand_usd_per_hour"):
                if not getattr(s, figure) > 0:
                    out.append(f"{s.instance_type} ({g.name}): {figure} is {getattr(s, figure)!r}, must be > 0")
    for key in {g.cuda_name_key for g in GPU_TYPES.values()}:
        peaks = {g.peak_bf16_tflops for g in GPU_TYPES.values() if g.cuda_name_key == key}
        if len(peaks) > 1:
            out.append(f"GPU types sharing device key {key!r} disagree on the peak: {sorted(peaks)}")
    return out


def _check() -> None:
    problems = catalog_problems()
    if problems:
        raise RuntimeError("catalog/gpus.py: " + "; ".join(problems))


_check()
