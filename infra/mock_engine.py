"""Moved to ``infra.plan.mock_engine`` (the offline wing); the graph type is ``infra.recording``.

Imported, this name is that module (same object), so imports written before the move keep
working. Deprecated: import ``infra.plan.mock_engine`` or ``infra.recording``.
"""
import sys

from infra.plan import mock_engine as _moved

sys.modules[__name__] = _moved
