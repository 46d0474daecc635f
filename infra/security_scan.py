"""Deprecated: `python -m infra.security_scan` is `python -m infra.plan.security_scan`, and is removed in 1.0.0.

Run as a command it prints that notice on stderr and runs the tool; imported, this name is the
tool's module (same object).
"""
import sys

from infra.plan import security_scan as _tool

if __name__ == "__main__":
    print("python -m infra.security_scan is deprecated and is removed in 1.0.0: run python -m infra.plan.security_scan", file=sys.stderr)
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
