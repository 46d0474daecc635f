"""The version pins: their one home is catalog/versions.py (below every layer, so manifests,
config and components read the same pins). Re-exported here under the names components and
infra import; add or change a pin there, never here."""
from __future__ import annotations

from catalog.versions import *  # noqa: F401,F403  (re-exported: every public pin)
