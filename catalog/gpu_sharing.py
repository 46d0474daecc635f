"""MIG (Multi-Instance GPU) profiles per GPU model, as data, with the rule that packs a layout.

Source: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): the
A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB and H200-SXM5-141GB tables (profile, fraction of
memory and of SMs, instances available). Memory is split into 8 slices and compute into 7; a GPU
instance takes a contiguous run of memory slices at one of its profile's placements (the guide's
"A100 MIG profiles" placement figure; ``nvidia-smi mig -lgipp`` prints the same
``{starts}:width``). The same profile names and counts are in NVIDIA's default mig-parted
configuration shipped by the GPU Operator (gpu-operator v25.3.0
assets/state-mig-manager/0400_configmap.yaml: ``all-1g.10gb`` is 7 x 1g.10gb on A100-80GB/H100-80GB
and 4 x 1g.10gb on A100-40GB).

The ``+me`` (media extension) profiles are left out: one per GPU, no use for training.
Which EC2 instances carry these GPUs: p4d (A100 40 GB), p4de (A100 80 GB), p5 (H100 80 GB),
p5e/p5en (H200 141 GB) (EC2 accelerated computing instance types).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

SOURCE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
COMPUTE_SLICES_PER_GPU = 7
MEMORY_SLICES_PER_GPU = 8


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: ``<compute>g.<memory>gb``."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_gib: float  # the guide's memory column (the name rounds it)
    max_instances: int
    placements: tuple[int, ...]  # first memory slice of each allowed position

    @property
    def resource_name(self) -> str:
        """The extended resource the device plugin's mixed strategy advertises."""
        return f"nvidia.com/mig-{self.name}"


def _profiles(*rows: tuple[str, int, int, float, int, tuple[int, ...]]) -> Mapping[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


# The guide lists memory in GB as the profile names do; the column values are what a CUDA
# process sees (e.g. A100-80GB 1g.10gb: 9.75 GB).
_A100_40GB = _profiles(
    ("1g.5gb", 1, 1, 4.75, 7, (0, 1, 2, 3, 4, 5, 6)),
    ("1g.10gb", 1, 2, 9.75, 4, (0, 2, 4, 6)),
    ("2g.10gb", 2, 2, 9.75, 3, (0, 2, 4)),
    ("3g.20gb", 3, 4, 19.62, 2, (0, 4)),
    ("4g.20gb", 4, 4, 19.62, 1, (0,)),
    ("7g.40gb", 7, 8, 39.25, 1, (0,)),
)
_80GB = _profiles(  # A100-SXM4-80GB and H100-SXM5-80GB share the table
    ("1g.10gb", 1, 1, 9.75, 7, (0, 1, 2, 3, 4, 5, 6)),
    ("1g.20gb", 1, 2, 19.62, 4, (0, 2, 4, 6)),
    ("2g.20gb", 2, 2, 19.62, 3, (0, 2, 4)),
    ("3g.40gb", 3, 4, 39.50, 2, (0, 4)),
    ("4g.40gb", 4, 4, 39.50, 1, (0,)),
    ("7g.80gb", 7, 8, 79.25, 1, (0,)),
)
_H200_141GB = _profiles(
    ("1g.18gb", 1, 1, 16.5, 7, (0, 1, 2, 3, 4, 5, 6)),
    ("1g.35gb", 1, 2, 32.5, 4, (0, 2, 4, 6)),
    ("2g.35gb", 2, 2, 32.5, 3, (0, 2, 4)),
    ("3g.71gb", 3, 4, 66.5, 2, (0, 4)),
    ("4g.71gb", 4, 4, 66.5, 1, (0,)),
    ("7g.141gb", 7, 8, 130.5, 1, (0,)),
)

# Keyed by the platform's GPU type names (catalog/gpus.py GPU_TYPES; tests/catalog checks it). Any
# type not listed has no MIG (L4, A10G, L40S: the guide lists only A30, A100, H100, H200, GH200,
# B200 and later).
MIG_PROFILES: Mapping[str, Mapping[str, MigProfile]] = {
    "a100": _A100_40GB,
    "a100-80gb": _80GB,
    "h100": _80GB,
    "h200": _H200_141GB,
}


def mig_capable(gpu_type: str) -> bool:
    return gpu_type in MIG_PROFILES


def pack(gpu_type: str, layout: Mapping[str, int]) -> Optional[list[tuple[str, int]]]:
    """One placement of every GPU instance of ``layout`` on one GPU, or None if none exists.

    A layout fits when its instances occupy disjoint memory slices at allowed placements and use
    at most 7 compute slices (the guide's rule; it is what ``nvidia-mig-parted apply`` asks the
    driver for, and the driver refuses a layout with no placement).
    """
    profiles = MIG_PROFILES[gpu_type]
    if sum(profiles[name].compute_slices * count for name, count in layout.items()) > COMPUTE_SLICES_PER_GPU:
        return None
    wanted = sorted((profiles[name] for name, count in layout.items() for _ in range(count)),
                    key=lambda p: -p.memory_slices)
    used = [False] * MEMORY_SLICES_PER_GPU
    placed: list[tuple[str, int]] = []

    def place(index: int) -> bool:
        if index == len(wanted):
            return True
        profile = wanted[index]
        for start in profile.placements:
            span = range(start, start + profile.memory_slices)
            if span.stop <= MEMORY_SLICES_PER_GPU and not any(used[i] for i in span):
                for i in span:
                    used[i] = True
                placed.append((profile.name, start))
                if place(index + 1):
                    return True
                placed.pop()
                for i in span:
                    used[i] = False
        return False

    return placed if place(0) else None
