"""Deprecated: `python -m infra.urns` is `python -m infra.plan.urns`, and is removed in 1.0.0.

Run as a command it prints that notice on stderr and runs the tool; imported, this name is the
tool's module (same object).
"""
import sys

from infra.plan import urns as _tool

if __name__ == "__main__":
    print("python -m infra.urns is deprecated and is removed in 1.0.0: run python -m infra.plan.urns", file=sys.stderr)
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
