"""Syntax of the strings the config hands to AWS, Git or a file system, checked where they are read.

Each check returns None or the reason, and each ``check_*`` raises ``invalid`` (message + fix) for
a pydantic ``field_validator``, so the loader reports the field, the value and the fix with every
other problem. The rules are the consumers' own:

- Git ref names: git's Documentation/git-check-ref-format.txt (rules 1-10, plus `--branch`
  refusing a leading "-"); a full 40-hex commit id is also a revision Argo CD accepts.
- DNS names: RFC 1123 labels (1-63 characters, letters, digits, "-", not at either end), 253 in all.
- S3 prefixes: S3 User Guide, "Object key naming guidelines" (keys with "." or ".." segments
  are refused by some tools and make relative paths); no leading "/", no empty segment.
- Relative paths inside the repository: no absolute path, no ".." segment.
- Secrets Manager names: CreateSecret Name, 1-512 of ``A-Z a-z 0-9 / _ + = . @ -``, or the ARN.
- Route 53 hosted zone ids: ``Z`` followed by upper-case letters and digits (CreateHostedZone).
- Account ids: 12 digits; IAM role ARNs: ``arn:<partition>:iam::<account id>:role/<path and name>``
  (IAM User Guide, "IAM identifiers"; role names and paths of letters, digits and ``_+=,.@-``, 512 at most).
- Domain names a public certificate covers: lowercase RFC 1123 labels under an alphabetic
  top-level domain, 4-253 characters.
"""
from __future__ import annotations

import re
from typing import Optional
from urllib.parse import urlparse

from infra.config.engine import invalid

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_SECRET_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
_SECRET_ARN = re.compile(r"^arn:aws(-cn|-us-gov)?:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}$")
_ZONE_ID = re.compile(r"^Z[A-Z0-9]{1,32}$")
_ACCOUNT_ID = re.compile(r"^\d{12}$")
_ROLE_ARN = re.compile(r"^arn:(aws|aws-us-gov|aws-cn):iam::(\d{12}):role/[\w+=,.@/-]{1,512}$")
_DOMAIN_NAME = re.compile(r"^(?=.{4,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")


def git_ref_problem(value: str) -> Optional[str]:
    if _COMMIT.match(value):
        return None
    if not value:
        return "is empty"
    if value.startswith("-"):
        return "starts with '-'"
    if value == "@" or "@{" in value:
        return "is '@' or contains '@{'"
    if _REF_FORBIDDEN.search(value):
        return "contains a space, a control character or one of ~ ^ : ? * [ \\"
    if ".." in value:
        return "contains '..'"
    if value.endswith("/") or value.startswith("/") or "//" in value:
        return "has an empty path component (a leading, trailing or double '/')"
    if value.endswith("."):
        return "ends with '.'"
    for part in value.split("/"):
        if part.startswith("."):
            return f"has a component starting with '.' ({part!r})"
        if part.endswith(".lock"):
            return f"has a component ending with '.lock' ({part!r})"
    return None


def dns_name_problem(value: str) -> Optional[str]:
    if not 1 <= len(value) <= 253:
        return "is not 1-253 characters"
    bad = [label for label in value.split(".") if not _DNS_LABEL.match(label)]
    return f"has labels that are not RFC 1123 labels: {bad}" if bad else None


def s3_prefix_problem(value: str) -> Optional[str]:
    if value == "":
        return None
    if value.startswith("/"):
        return "starts with '/'"
    parts = value.rstrip("/").split("/")
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' segment"
    if any(part == "" for part in parts):
        return "has an empty segment ('//')"
    return None


def relative_path_problem(value: str) -> Optional[str]:
    if value.startswith("/"):
        return "is absolute"
    if any(part == ".." for part in value.split("/")):
        return "has a '..' segment"
    return None


def url_path_problem(url: str) -> Optional[str]:
    path = urlparse(url).path if "://" in url else url.partition(":")[2]
    return "has a '.' or '..' path segment" if any(p in (".", "..") for p in path.split("/")) else None


def https_url_problem(value: str) -> Optional[str]:
    parsed = urlparse(value)
    if parsed.scheme != "https" or not parsed.hostname:
        return "is not an https:// URL with a host"
    return dns_name_problem(parsed.hostname)


def secrets_manager_id_problem(value: str) -> Optional[str]:
    if _SECRET_NAME.match(value) or _SECRET_ARN.match(value):
        return None
    return "is neither a Secrets Manager name (1-512 of A-Z a-z 0-9 / _ + = . @ -) nor a secret ARN"


def zone_id_problem(value: str) -> Optional[str]:
    return None if _ZONE_ID.match(value) else "is not a Route 53 hosted zone id (Z followed by letters and digits)"


def account_id_problem(value: str) -> Optional[str]:
    return None if _ACCOUNT_ID.match(value) else "is not a 12-digit AWS account id"


def role_arn_problem(value: str) -> Optional[str]:
    return None if _ROLE_ARN.match(value) else "is not an IAM role ARN"


def role_arn_account(value: str) -> str:
    """The account id of a role ARN (``role_arn_problem(value)`` is None)."""
    match = _ROLE_ARN.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not an IAM role ARN")
    return match.group(2)


def domain_name_problem(value: str) -> Optional[str]:
    return None if _DOMAIN_NAME.match(value) else "is not a lowercase DNS name under a top-level domain"


def checked(problem: Optional[str], fix: str, value: str) -> str:
    """For validators: the value, or ``invalid(reason, fix)``."""
    if problem is not None:
        raise invalid(problem, fix)
    return value


# distribution/reference (the grammar docker, containerd and ECR share), reference/regexp.go.
_IMAGE_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")


def image_reference_problem(value: str) -> Optional[str]:
    return None if len(value) <= 255 and _IMAGE_REFERENCE.match(value) else "is not an image reference"
