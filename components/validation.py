"""Deprecated import path: input problems live in ``workloads.problems`` (the bottom layer, which
Kubernetes spec validation needs too); import them from there.

Kept only while ``jobs/render.py`` still imports it; removed once it imports
``workloads.problems``.
"""
from workloads.problems import (  # noqa: F401
    InvalidInputError,
    Problem,
    accepts_enum_values,
    coerce_enums,
    raise_if_any,
)
