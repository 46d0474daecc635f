"""Component Args and workload specs that take an enum accept its string value (or refuse it clearly)."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from enum import Enum

import pytest

import components
import workloads
from components.network import NatStrategy, NetworkArgs
from workloads.problems import InvalidInputError, _enum_in, _type_hints
from workloads.karpenter import CapacityType, GpuPoolSpec


def enum_dataclasses():
    """Every dataclass in components/ and workloads/ with an enum-typed field."""
    found = {}
    for package in (components, workloads):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for value in vars(module).values():
                if (isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
                        and any(_enum_in(hint)[0] for hint in _type_hints(value).values())):
                    found[f"{module.__name__}.{value.__name__}"] = value
    return found


def test_there_are_enum_args_to_check():
    names = set(enum_dataclasses())
    assert {"components.network.NetworkArgs", "components.cluster.ClusterArgs", "components.tracking.TrackingArgs",
            "workloads.karpenter.GpuPoolSpec"} <= names


@pytest.mark.parametrize("name", sorted(enum_dataclasses()))
def test_every_enum_dataclass_coerces_its_enum_fields(name):
    cls = enum_dataclasses()[name]
    hook = cls.__post_init__ if hasattr(cls, "__post_init__") else cls.__init__
    assert getattr(hook, "__wrapped__", None) is not None, f"{name} lacks @accepts_enum_values"


def network_args(**overrides):
    args = dict(cidr="10.0.0.0/16", availability_zones=["us-west-2a", "us-west-2b"],
                private_subnet_cidrs=["10.0.0.0/18", "10.0.64.0/18"], public_subnet_cidrs=["10.0.192.0/24", "10.0.193.0/24"],
                cluster_name="c", flow_logs_bucket=None)
    return NetworkArgs(**{**args, **overrides})


@pytest.mark.parametrize("given", ["none", "NONE", NatStrategy.NONE])
def test_network_nat_none_given_as_a_string_is_none(given):
    assert network_args(nat=given).nat is NatStrategy.NONE


@pytest.mark.parametrize("bad", ["no-nat", 0, None])
def test_unknown_enum_value_is_refused_naming_field_value_and_choices(bad):
    if bad is None:  # a required enum given None: no silent default either
        args = network_args(nat=None)
        assert args.nat is None
        return
    with pytest.raises(InvalidInputError) as info:
        network_args(nat=bad)
    (problem,) = info.value.problems
    assert problem.path == "NetworkArgs.nat" and problem.value == bad and "one_per_az" in problem.fix


def test_network_with_nat_none_as_string_creates_no_nat_gateway():
    import pulumi
    import pulumi_aws as aws

    from components.network import Network
    from infra.plan.mock_engine import run_recorded

    def program():
        provider = aws.Provider("p", region="us-west-2")
        bucket = aws.s3.Bucket("logs", opts=pulumi.ResourceOptions(provider=provider))
        Network("net", network_args(nat="none", flow_logs_bucket=bucket, interface_endpoints=False),
                opts=pulumi.ResourceOptions(providers={"aws": provider}))

    recording = run_recorded(program, project="p", stack="s")
    assert recording.by_type("aws:ec2/natGateway:NatGateway") == []
    assert recording.by_type("aws:ec2/vpc:Vpc")


def test_sequences_of_enums_are_coerced():
    field_names = {f.name for f in dataclasses.fields(GpuPoolSpec)}
    assert "capacity_types" in field_names
    from workloads.problems import coerce_enums

    @dataclasses.dataclass(frozen=True)
    class Spec:
        kinds: tuple[CapacityType, ...]
        one: CapacityType | None = None

    spec = Spec(kinds=["spot", "ON_DEMAND"], one="reserved")
    coerce_enums(spec)
    assert spec.kinds == (CapacityType.SPOT, CapacityType.ON_DEMAND) and spec.one is CapacityType.RESERVED
    with pytest.raises(InvalidInputError, match=r"Spec.kinds\[1\]"):
        coerce_enums(Spec(kinds=["spot", "cheap"]))


@pytest.mark.parametrize("key,bad", [("cidr", "10.0.0.1/16"), ("cidr", "nope"), ("private_subnet_cidrs", ["10.0.0.0/18", "10.0.64.0/33"])])
def test_network_args_refuse_malformed_cidrs_without_a_traceback(key, bad):
    with pytest.raises(InvalidInputError) as info:
        network_args(**{key: bad})
    assert any(p.path == f"NetworkArgs.{key}" for p in info.value.problems)
