"""Physical names that fit their service's limit for every name the config accepts.

Pulumi autonames a resource ``<logical name>-<7 random hex>`` and refuses one that would not fit
(pulumi/pulumi sdk/go/common/resource/resource_id.go: "name '%s' plus %d random chars is longer
than maximum length %d"; pulumi-aws provider/resources.go sets the maximum per resource, e.g.
``"name": tfbridge.AutoName("name", 32, "-")`` for a target group). ``fitted_name`` keeps
autonaming whenever it fits, so existing stacks keep their names, and otherwise gives an
explicit name: as much of the logical name as fits, then a stable hash of the whole of it, so
two long names that share a prefix stay distinct and a re-run gives the same name.
"""
from __future__ import annotations

import hashlib
from typing import Optional

# "-" + 7 random characters (resource_id.go NewUniqueName, the suffix pulumi-aws asks for).
AUTONAME_SUFFIX_CHARS = 8
HASH_CHARS = 8

# AWS limits of the names the platform lets Pulumi generate (each service's quota page / API reference).
IAM_ROLE_NAME_MAX = 64               # IAM User Guide, "IAM and AWS STS quotas": role name 64
EVENT_RULE_NAME_MAX = 64             # EventBridge PutRule: Name, 1-64
LOAD_BALANCER_NAME_MAX = 32          # ELBv2 CreateLoadBalancer: Name, at most 32 characters
TARGET_GROUP_NAME_MAX = 32           # ELBv2 CreateTargetGroup: Name, at most 32 characters


def fitted_name(logical: str, limit: int) -> Optional[str]:
    """None when ``logical`` plus Pulumi's random suffix fits ``limit`` (autonaming as before);
    otherwise ``<prefix>-<8 hex of sha256(logical)>`` of at most ``limit`` characters
    (alphanumerics and hyphens, never ending in a hyphen, as ELB names require)."""
    if len(logical) + AUTONAME_SUFFIX_CHARS <= limit:
        return None
    digest = hashlib.sha256(logical.encode()).hexdigest()[:HASH_CHARS]
    prefix = logical[:limit - HASH_CHARS - 1].rstrip("-")
    return f"{prefix}-{digest}"
