"""Deprecated import path: prices live in ``catalog.prices`` (instance prices with their shapes in
catalog/gpus.py); import them from there.

Kept only while ``jobs/client.py`` and ``jobs/preflight.py`` still import it; removed once they
import ``catalog.prices``.
"""
from __future__ import annotations

from catalog.prices import (  # noqa: F401  (re-exported)
    HOURS_PER_MONTH, PRICES, PRICES_AS_OF, REGIONS, SOURCE_URL, SPOT_DISCOUNT, STACK_PRICES, STACK_PRICES_AS_OF,
    InstancePrice, UnitPrice, price,
)
