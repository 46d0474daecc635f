"""The MIG profile table and the per-instance tables outside catalog/gpus.py name only what the
catalog holds, so adding a GPU type or renaming one cannot leave them pointing at nothing.

NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles": the full-GPU profile (7g) of each
table is the whole GPU ("7g.80gb ... 79.25 GB" on H100-SXM5-80GB), so it never exceeds the memory of
the GPU type that carries it.
"""
from __future__ import annotations

from catalog.gpu_sharing import MIG_PROFILES
from catalog.gpus import GPU_TYPES, instance_shapes


def test_mig_profiles_are_keyed_by_catalog_gpu_types():
    assert set(MIG_PROFILES) <= set(GPU_TYPES), sorted(set(MIG_PROFILES) - set(GPU_TYPES))


def test_each_mig_table_fits_the_memory_of_its_gpu_type():
    for name, profiles in MIG_PROFILES.items():
        whole = max(profiles.values(), key=lambda p: p.compute_slices)
        assert whole.memory_gib <= GPU_TYPES[name].gpu_memory_gib, (name, whole.name)
        # The profile name rounds the memory up to the GPU's marketed size (e.g. 7g.80gb on 80 GB).
        assert whole.name.endswith(f".{GPU_TYPES[name].gpu_memory_gib}gb"), (name, whole.name)


def test_instance_tables_outside_the_catalog_name_catalog_shapes():
    from workloads.readiness import BUSBW_REFERENCES

    shapes = set(instance_shapes())
    assert set(BUSBW_REFERENCES) <= shapes, sorted(set(BUSBW_REFERENCES) - shapes)
