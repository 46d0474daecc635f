"""`python -m infra.deploy`, kept for the Makefile, CI and docs: the tool lives in ``infra.plan.deploy``.

Imported, this name is that module (same object), so old imports keep working.
"""
import sys

from infra.plan import deploy as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
