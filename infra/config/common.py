"""What every config section shares: the base model, environment, CIDR, name, region and tag types,
and the rules more than one section applies (log retention in prod, internet exposure).
"""
from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
import unicodedata
from enum import Enum
from typing import Annotated, Any, Callable, Iterator, Optional, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer
from pydantic.alias_generators import to_camel

from catalog.limits import Limit
from catalog.regions import PARTITION_OF_REGION, partition_of
from workloads.problems import Problem
from infra.config.engine import Rule, invalid
from infra.config.syntax import (
    account_id_problem, checked, dns_name_problem, domain_name_problem, git_ref_problem, image_reference_problem,
    role_arn_problem, zone_id_problem,
)

T = TypeVar("T")


def _spec_value(value: Any, annotation: str) -> Any:
    if isinstance(value, ipaddress.IPv4Network):
        return str(value)
    if isinstance(value, list):
        items = [_spec_value(v, "") for v in value]
        return tuple(items) if annotation.startswith(("Sequence", "tuple", "Tuple")) else items
    if isinstance(value, Enum) and annotation == "str":
        return value.value
    return value


_NAME = re.compile(r"^[a-z][a-z0-9-]{1,22}[a-z0-9]$")
PROD_OBJECT_LOCK_RETENTION_DAYS = 365
# Log retention floor in prod (CIS AWS Foundations / EKS Best Practices: keep audit logs a year).
PROD_MIN_LOG_RETENTION_DAYS = 365
# CloudWatch Logs accepts only these retention periods.
RETENTION_SOURCE = "CloudWatch Logs PutRetentionPolicy (https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_PutRetentionPolicy.html)"
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)


class Environment(str, Enum):
    """What kind of environment a stack is; prod turns on every protection."""

    DEV = "dev"
    PROD = "prod"


class CapacityType(str, Enum):
    ON_DEMAND = "ON_DEMAND"
    SPOT = "SPOT"


class _Model(BaseModel):
    # camelCase in the stack file (Pulumi's convention), snake_case in Python.
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, use_enum_values=False,
        # .inf and .nan are valid YAML floats that no AWS size or period accepts.
        allow_inf_nan=False,
    )

    def copy_into(self, target: type[T], /, **given: Any) -> T:
        """``target`` (a component's frozen Args or a manifest spec) built from this section.

        Every field the two share by name is copied (a CIDR as its string, a list as a tuple where
        the target declares a Sequence, an enum as its value where the target wants a ``str``);
        ``given`` supplies what the section does not hold (other components, platform-wide
        settings) and overrides a shared field whose meaning differs. A shared field that is itself
        a config section must be given: its translation is that section's own.
        """
        fields = {f.name: f for f in dataclasses.fields(target)}
        values: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name not in fields or name in given:
                continue
            value = getattr(self, name)
            if isinstance(value, BaseModel):
                raise TypeError(f"{type(self).__name__}.{name} is a section: pass {target.__name__}'s {name}= explicitly")
            values[name] = _spec_value(value, str(fields[name].type))
        return target(**values, **given)


def _ipv4_network(value: Any) -> ipaddress.IPv4Network:
    if isinstance(value, ipaddress.IPv4Network):
        return value
    if not isinstance(value, str):
        raise invalid("must be an IPv4 CIDR string", "write a block such as 10.0.0.0/16")
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ipaddress.NetmaskValueError as exc:
        raise invalid(f"is not a valid IPv4 CIDR ({exc})", "use a block such as 10.0.0.0/16") from None
    except ValueError as exc:
        if "has host bits set" in str(exc):
            fixed = ipaddress.IPv4Network(value, strict=False)
            raise invalid("has host bits set", f"use the network address {fixed}") from None
        raise invalid("is not a valid IPv4 CIDR", "use a block such as 10.0.0.0/16") from None


Cidr = Annotated[
    ipaddress.IPv4Network,
    BeforeValidator(_ipv4_network),
    PlainSerializer(str, return_type=str),
]


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise invalid("is not a valid platform name", "use 3-24 lowercase letters, digits and '-', starting with a letter (e.g. mlp-dev)")
    return value


def _check_region(value: str) -> str:
    if partition_of(value) is None:
        close = difflib.get_close_matches(value, sorted(PARTITION_OF_REGION), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise invalid(
            "is not a region of the aws, aws-cn or aws-us-gov partitions (table: catalog/regions.py, from botocore's endpoints.json)",
            f"{hint}use a region name such as us-west-2",
        )
    return value


# AWS tag rules (the pattern AWS APIs enforce, e.g. EFS API_Tag:
# ^(?![aA][wW][sS]:)([\p{L}\p{Z}\p{N}_.:/=+\-@]+)$, and "Tag naming limits and requirements",
# https://docs.aws.amazon.com/tag-editor/latest/userguide/best-practices-and-strats.html):
# key 1-128 characters, value 0-256, letters, digits, spaces and _ . : / = + - @,
# no aws: prefix on keys or values, at most 50 user tags per resource.
MAX_TAGS_PER_RESOURCE = 50
# The platform adds its own tags (platform, environment, managed-by, Name, kubernetes.io/cluster/...,
# karpenter.sh/discovery ...): leave them room under AWS's 50.
NUM_PLATFORM_TAGS_RESERVED = 10
_TAG_SPECIALS = set("_.:/=+-@")


def _tag_text_problem(text: str, kind: str, max_length: int, min_length: int) -> Optional[str]:
    if not min_length <= len(text) <= max_length:
        return f"{kind} is {len(text)} characters (AWS allows {min_length}-{max_length})"
    if text[:4].lower() == "aws:":
        return f"{kind} starts with the reserved 'aws:' prefix"
    bad = sorted({c for c in text if not (c in _TAG_SPECIALS or unicodedata.category(c)[0] in "LNZ")})
    if bad:
        return f"{kind} has characters AWS tags refuse: {bad}"
    return None


def _check_tags(value: dict[str, str]) -> dict[str, str]:
    limit = MAX_TAGS_PER_RESOURCE - NUM_PLATFORM_TAGS_RESERVED
    if len(value) > limit:
        raise invalid(
            f"{len(value)} tags: AWS allows {MAX_TAGS_PER_RESOURCE} per resource and the platform adds up to "
            f"{NUM_PLATFORM_TAGS_RESERVED} of its own", f"keep at most {limit} tags")
    found = []
    for key, tag_value in value.items():
        reason = _tag_text_problem(key, f"key {key!r}", 128, 1) or _tag_text_problem(tag_value, f"value of {key!r}", 256, 0)
        if reason:
            found.append(reason)
    if found:
        raise invalid("; ".join(found), "AWS tag rules: keys 1-128 and values 0-256 characters of letters, digits, "
                      "spaces and _ . : / = + - @, no 'aws:' prefix")
    return value


def at_most(limit: Limit) -> AfterValidator:
    """A field validator refusing values above ``limit`` (catalog/limits.py), naming it and its source."""

    def check(value: Any) -> Any:
        if value is not None and value > limit.maximum:
            maximum = int(limit.maximum) if float(limit.maximum).is_integer() else limit.maximum
            raise invalid(f"exceeds {limit.what}: at most {maximum} (source: {limit.source})",
                          f"use a value <= {maximum}")
        return value

    return AfterValidator(check)


PlatformName = Annotated[str, AfterValidator(_check_name)]
Region = Annotated[str, AfterValidator(_check_region)]
Tags = Annotated[dict[str, str], AfterValidator(_check_tags)]


def syntax(problem: Callable[[str], Optional[str]], fix: str) -> AfterValidator:
    """A string type's check (infra/config/syntax.py): ``problem(value)`` says what is wrong, ``fix``
    what to write instead; the loader reports both with the field's path and the value."""
    return AfterValidator(lambda value: checked(problem(value), fix, value))


# Strings the config hands to AWS, Git or a registry, each checked by the consumer's own rule
# when the stack file is read (one problem per bad value, at its own path: a list's index too).
AccountId = Annotated[str, syntax(account_id_problem, "use the 12-digit id, quoted in YAML (e.g. '012345678901')")]
RoleArn = Annotated[str, syntax(role_arn_problem, "use arn:aws:iam::<account id>:role/<name>")]
DnsName = Annotated[str, syntax(dns_name_problem, "use a host name such as argocd.dev.example.com")]
DomainName = Annotated[str, syntax(domain_name_problem, "use one such as mlflow.dev.example.com")]
ImageRef = Annotated[str, syntax(
    image_reference_problem, "use <registry>/<repository>@sha256:<digest> or <registry>/<repository>:<tag>")]
GitRef = Annotated[str, syntax(git_ref_problem, "name a branch or tag git accepts (git check-ref-format), e.g. main or "
                                                 "v1.4.0, or a 40-character commit id")]
ZoneId = Annotated[str, syntax(
    zone_id_problem, "use the hosted zone's id (aws route53 list-hosted-zones), e.g. Z0123456789ABCDEFGHIJ")]


# Judged by what a list covers together: 0.0.0.0/1 + 128.0.0.0/1 is the whole internet too.
# No office or VPN egress needs more than a /8 of public addresses.
MAX_OPEN_ADDRESSES = 2 ** 24


def _exposure(path: str, cidrs: list[ipaddress.IPv4Network]) -> Optional[tuple[str, Any, str]]:
    """(path, value, description) when ``cidrs`` together are (nearly) the whole internet."""
    union = list(ipaddress.collapse_addresses(cidrs))
    num_addresses = sum(n.num_addresses for n in union)
    everything = ipaddress.IPv4Network("0.0.0.0/0")
    if num_addresses <= MAX_OPEN_ADDRESSES:
        return None
    single = next((i for i, c in enumerate(cidrs) if c.num_addresses == num_addresses), None)
    at, value = (f"{path}[{single}]", str(cidrs[single])) if single is not None else (path, [str(c) for c in cidrs])
    if union == [everything]:
        return at, value, "the whole internet"
    return at, value, f"{num_addresses:,} addresses ({num_addresses / everything.num_addresses:.0%} of IPv4), more than a /8"


def check_log_retention(value: int) -> int:
    """A field validator's body: CloudWatch Logs accepts only the retention periods it lists."""
    if value not in LOG_RETENTION_DAYS:
        raise invalid(f"is not a retention period {RETENTION_SOURCE} accepts", f"use one of {LOG_RETENTION_DAYS}")
    return value


def prod_retention_rule(path: str) -> Rule:
    """CloudWatch log retention at ``path`` is at least a year in prod."""

    def rule(environment: Environment, retention_days: int) -> Iterator[Problem]:
        if environment is Environment.PROD and retention_days < PROD_MIN_LOG_RETENTION_DAYS:
            allowed = [d for d in LOG_RETENTION_DAYS if d >= PROD_MIN_LOG_RETENTION_DAYS]
            yield Problem(path, retention_days,
                          f"prod keeps CloudWatch logs at least {PROD_MIN_LOG_RETENTION_DAYS} days (audit and incident response)",
                          f"use one of {allowed}")

    return Rule(("environment", path), rule)
