"""`python -m infra.urns`, kept for the Makefile, CI and docs: the tool lives in ``infra.plan.urns``.

Imported, this name is that module (same object), so old imports keep working.
"""
import sys

from infra.plan import urns as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
