"""Pulumi ComponentResources of the ML training platform.

Each module owns one concern and exposes ``<Name>Args`` (frozen, documented) and
``<Name>`` (a ``pulumi.ComponentResource`` with type token ``mlplatform:<module>:<Type>``).
Components never read ``pulumi.Config`` or the environment: callers pass plain values and
the objects they depend on.
"""
