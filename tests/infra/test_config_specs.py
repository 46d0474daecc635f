"""Config sections build the specs and Args they mirror: a field both sides share is copied by
name (never by hand in a capability module), and where both declare a default it is the spec's."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import pytest
from pydantic import Field

from components.cluster import NodeGroupArgs
from components.datasets import FsxArgs
from infra.config import GpuPoolConfig, load_platform_config
from infra.config.common import _Model
from tests.conftest import stack_config
from workloads.karpenter import GpuPoolSpec


@pytest.fixture(scope="module")
def prod():
    return load_platform_config(stack_config("prod"))


def _shared(model: type, target: type) -> list[str]:
    return [f.name for f in dataclasses.fields(target) if f.name in model.model_fields]


# Shared names whose config value the spec holds translated: the pool's alias falls back to
# karpenter's; ``sharing`` is the config's mode plus its sizing fields, as the spec's PoolSharing.
_TRANSLATED = ("ami_alias", "sharing")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_gpu_pool_spec_carries_every_field_of_its_config(stack):
    config = load_platform_config(stack_config(stack))
    assert _shared(GpuPoolConfig, GpuPoolSpec) == [f.name for f in dataclasses.fields(GpuPoolSpec)]
    assert any(pool.sharing_spec().shared for pool in config.gpu_pools), "each stack file declares a shared pool"
    for pool in config.gpu_pools:
        spec = pool.spec(config.karpenter.ami_alias)
        for name in _shared(GpuPoolConfig, GpuPoolSpec):
            want = getattr(pool, name)
            if name == "ami_alias":
                want = pool.ami_alias or config.karpenter.ami_alias
            if name == "sharing":
                want = pool.sharing_spec()
                assert spec.sharing.mode is pool.sharing
            assert getattr(spec, name) == (tuple(want) if isinstance(want, list) else want), name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_config_builds_its_pool_specs_once_and_a_copy_builds_its_own(stack):
    config = load_platform_config(stack_config(stack))
    assert config.gpu_pool_specs == tuple(pool.spec(config.karpenter.ami_alias) for pool in config.gpu_pools)
    assert config.gpu_pool_specs is config.gpu_pool_specs and config.cpu_pool_spec is config.cpu_pool_spec
    assert config.cpu_pool_spec == config.karpenter.cpu_pool.spec(config.karpenter.ami_alias)
    # An updated copy sees its own pools and AMI, never the original's cached specs.
    karpenter = config.karpenter.model_copy(update={"ami_alias": "al2023@v20991231"})
    copied = config.model_copy(update={"karpenter": karpenter, "gpu_pools": config.gpu_pools[:1]})
    assert [s.name for s in copied.gpu_pool_specs] == [config.gpu_pools[0].name]
    assert copied.cpu_pool_spec.ami_alias == "al2023@v20991231"
    # Caches are not config: the model's fields and dump are unchanged by them.
    assert "gpu_pool_specs" not in config.model_dump() and config == load_platform_config(stack_config(stack))


def test_shared_defaults_are_the_specs():
    for name in _shared(GpuPoolConfig, GpuPoolSpec):
        field = next(f for f in dataclasses.fields(GpuPoolSpec) if f.name == name)
        config_default = GpuPoolConfig.model_fields[name].get_default(call_default_factory=True)
        if field.default is not dataclasses.MISSING and name not in _TRANSLATED:
            assert config_default == field.default or (list(field.default) == config_default), name
    # An unshared pool's translated sharing is the spec's default.
    pool = GpuPoolConfig(name="p", gpu_type="l4", gpus_per_node=1, capacity_types=["spot"], max_gpus=1)
    assert pool.sharing_spec() == GpuPoolSpec.sharing


def test_fsx_args_rename_and_build_the_associations(prod):
    fsx = prod.datasets.fsx
    args = fsx.args()
    assert isinstance(args, FsxArgs)
    assert args.throughput_mb_per_tib == fsx.per_unit_storage_throughput_mb_per_tib
    assert [a.file_system_path for a in args.associations] == [d.file_system_path for d in fsx.data_repository_associations]
    assert args.storage_capacity_gib == fsx.storage_capacity_gib and args.log_level == fsx.log_level


def test_a_field_added_to_both_sides_is_carried_without_a_copy(prod):
    """What a new pool field costs: nothing in the capability module."""

    @dataclasses.dataclass(frozen=True)
    class Target:
        name: str
        zones: Sequence[str] = ()
        new_knob: Optional[int] = None

    class Source(_Model):
        name: str
        zones: list[str] = Field(default_factory=list)
        new_knob: Optional[int] = None
        config_only: int = 0

    built = Source(name="p", zones=["us-west-2a"], new_knob=3).copy_into(Target)
    assert built == Target(name="p", zones=("us-west-2a",), new_knob=3)


@dataclasses.dataclass(frozen=True)
class _ClusterLike:
    version: str = ""
    system_node_group: object = None


def test_a_nested_section_must_be_translated_by_its_own_section(prod):
    with pytest.raises(TypeError, match="ClusterConfig.system_node_group is a section"):
        prod.cluster.copy_into(_ClusterLike)
    group = prod.cluster.system_node_group.args()
    assert isinstance(group, NodeGroupArgs)
    # NodeGroupArgs takes the capacity type as EKS's string, the config as an enum.
    assert group.capacity_type == prod.cluster.system_node_group.capacity_type.value == "ON_DEMAND"
    assert group.instance_types == tuple(prod.cluster.system_node_group.instance_types)
