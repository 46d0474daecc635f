"""The ML engineer's side of the platform: run your own code, follow a job through its life,
and drive it from Python (``jobs.client.JobClient``) or the command line (``python -m workloads``).

This package sits above ``infra/``: it reads a stack's facts and renders with ``workloads/``;
nothing below imports it (tests/infra/test_layout.py).
"""
