"""Stack config validation: pure Python, no Pulumi engine."""
from __future__ import annotations

import pytest

from infra.config import ConfigError, Environment, load_platform_config
from tests.conftest import problems_of, stack_config


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_stack_files_are_valid(stack):
    config = load_platform_config(stack_config(stack))
    assert config.environment is Environment(stack)
    assert config.cluster.version == "1.32"
    assert config.protect_stateful is (stack == "prod")


def test_prod_and_dev_differ_where_environments_should():
    dev, prod = (load_platform_config(stack_config(s)) for s in ("dev", "prod"))
    assert prod.network.nat.value == "one_per_az" and dev.network.nat.value == "single"
    assert prod.cluster.public_access_cidrs == [] and dev.cluster.public_access_cidrs
    assert prod.cluster.log_retention_days > dev.cluster.log_retention_days
    assert prod.log_archive.expiration_days > dev.log_archive.expiration_days


@pytest.mark.parametrize("bad", ["10.40.0.0/33", "10.40.0.1/16", "not-a-cidr", 1040])
def test_malformed_vpc_cidr(bad):
    raw = stack_config("dev")
    raw["network"]["cidr"] = bad
    found = problems_of(raw)["network.cidr"]
    assert found[0].value == bad and "10." in found[0].fix


def test_host_bits_fix_names_the_network_address():
    raw = stack_config("dev")
    raw["network"]["cidr"] = "10.40.0.1/16"
    (problem,) = problems_of(raw)["network.cidr"]
    assert "10.40.0.0/16" in problem.fix


def test_overlapping_subnets_and_subnet_outside_vpc():
    raw = stack_config("dev")
    raw["network"]["publicSubnetCidrs"] = ["10.40.0.0/24", "10.99.0.0/24"]
    found = problems_of(raw)
    assert "overlaps network.privateSubnetCidrs[0]" in found["network.publicSubnetCidrs[0]"][0].message
    assert "outside the VPC CIDR" in found["network.publicSubnetCidrs[1]"][0].message


def test_fewer_than_two_azs():
    raw = stack_config("dev")
    raw["network"]["availabilityZones"] = ["us-west-2a"]
    raw["network"]["privateSubnetCidrs"] = ["10.40.0.0/18"]
    raw["network"]["publicSubnetCidrs"] = ["10.40.192.0/24"]
    (problem,) = problems_of(raw)["network.availabilityZones"]
    assert "at least 2" in problem.message


def test_az_of_another_region_and_subnet_count_mismatch():
    raw = stack_config("dev")
    raw["network"]["availabilityZones"] = ["us-west-2a", "eu-west-1b"]
    raw["network"]["privateSubnetCidrs"] = ["10.40.0.0/18"]
    found = problems_of(raw)
    assert found["network.availabilityZones"][0].value == ["eu-west-1b"]
    assert "1 private subnets for 2 availability zones" in found["network.privateSubnetCidrs"][0].message


@pytest.mark.parametrize("bad", ["12345", "1234567890123", "abcdefghijkl"])
def test_account_id_not_twelve_digits(bad):
    raw = stack_config("dev")
    raw["accounts"]["workload"]["id"] = bad
    (problem,) = problems_of(raw)["accounts.workload.id"]
    assert problem.value == bad and "12-digit" in problem.fix


def test_unquoted_account_id_gets_quoting_fix():
    raw = stack_config("dev")
    raw["accounts"]["logging"]["id"] = 12345678901  # YAML int: the leading zero is already lost
    (problem,) = problems_of(raw)["accounts.logging.id"]
    assert "'012345678901'" in problem.fix


def test_role_arn_in_wrong_account():
    raw = stack_config("dev")
    raw["accounts"]["logging"]["roleArn"] = "arn:aws:iam::444455556666:role/mlp-pulumi-deploy"
    (problem,) = problems_of(raw)["accounts.logging.roleArn"]
    assert "not in the logging account 777788889999" in problem.message
    assert "arn:aws:iam::777788889999:role/" in problem.fix


def test_unknown_eks_version():
    raw = stack_config("prod")
    raw["cluster"]["version"] = "1.29"
    (problem,) = problems_of(raw)["cluster.version"]
    assert problem.value == "1.29" and "1.32" in problem.fix


def test_upgrade_policy_is_required():
    raw = stack_config("dev")
    del raw["cluster"]["upgradePolicy"]
    assert "cluster.upgradePolicy" in problems_of(raw)


def test_node_group_min_greater_than_max():
    raw = stack_config("dev")
    raw["cluster"]["systemNodeGroup"].update(minSize=4, maxSize=2, desiredSize=3)
    (problem,) = problems_of(raw)["cluster.systemNodeGroup.minSize"]
    assert problem.value == 4 and "maxSize (2)" in problem.message


def test_public_endpoint_open_to_internet_in_prod():
    raw = stack_config("prod")
    raw["cluster"]["publicAccessCidrs"] = ["0.0.0.0/0"]
    found = problems_of(raw)
    assert "whole internet" in found["cluster.publicAccessCidrs[0]"][0].message
    assert "private API endpoint only" in found["cluster.publicAccessCidrs"][0].message


def test_any_public_endpoint_is_refused_in_prod_but_listed_cidrs_are_fine_in_dev():
    raw = stack_config("prod")
    raw["cluster"]["publicAccessCidrs"] = ["203.0.113.0/24"]
    assert "cluster.publicAccessCidrs" in problems_of(raw)
    dev = stack_config("dev")
    dev["cluster"]["publicAccessCidrs"] = ["203.0.113.0/24"]
    load_platform_config(dev)


@pytest.mark.parametrize(
    "mutate, path, suggestion",
    [
        (lambda r: r.__setitem__("netwrok", r.pop("network")), "netwrok", "network"),
        (lambda r: r["network"].__setitem__("availabilityZone", ["us-west-2a"]), "network.availabilityZone",
         "availabilityZones"),
        (lambda r: r["cluster"]["systemNodeGroup"].__setitem__("diskSize", 50), "cluster.systemNodeGroup.diskSize",
         "diskSizeGib"),
        (lambda r: r["accounts"]["workload"].__setitem__("rolearn", "x"), "accounts.workload.rolearn", "roleArn"),
    ],
)
def test_unknown_keys_anywhere_suggest_the_right_key(mutate, path, suggestion):
    raw = stack_config("dev")
    mutate(raw)
    problem = problems_of(raw)[path][0]
    assert problem.message == "unknown key" and suggestion in problem.fix


def test_every_problem_is_reported_at_once():
    raw = stack_config("prod")
    raw["network"]["cidr"] = "10.50.0.0/33"
    raw["accounts"]["automation"]["id"] = "123"
    raw["cluster"]["version"] = "2.0"
    raw["cluster"]["systemNodeGroup"].update(minSize=5, maxSize=1, diskSiz=1)
    raw["cluster"]["publicAccessCidrs"] = ["0.0.0.0/0"]
    raw["logArchive"]["expirationDays"] = 10
    found = problems_of(raw)
    for path in ("network.cidr", "accounts.automation.id", "cluster.version", "cluster.systemNodeGroup.minSize",
                 "cluster.systemNodeGroup.diskSiz", "cluster.publicAccessCidrs[0]", "logArchive.expirationDays"):
        assert path in found, f"{path} missing from {sorted(found)}"


def test_error_text_names_field_value_and_fix():
    raw = stack_config("dev")
    raw["cluster"]["systemNodeGroup"]["minSize"] = 9
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw, source="stack 'dev'")
    text = str(info.value)
    assert "stack 'dev'" in text
    assert "cluster.systemNodeGroup.minSize" in text and "(got 9)" in text and "Fix:" in text
