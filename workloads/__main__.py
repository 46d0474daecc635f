"""`python -m workloads`: the spelling the docs and examples use for the job CLI, kept as a shim.

The CLI itself is ``jobs/__main__.py`` (``python -m jobs`` runs the same thing). workloads/ is
pure functions that build Kubernetes objects; this file is its one module allowed to import a
layer above, and only ``jobs.__main__`` (tests/infra/test_layout.py ``SHIMS`` checks both).
"""
import sys

from jobs.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
