"""Prices: moved to catalog/prices.py (instance prices with their shapes in catalog/gpus.py);
re-exported here under the names other modules import."""
from __future__ import annotations

from catalog.prices import (  # noqa: F401  (re-exported)
    HOURS_PER_MONTH, PRICES, PRICES_AS_OF, REGIONS, SOURCE_URL, SPOT_DISCOUNT, STACK_PRICES, STACK_PRICES_AS_OF,
    InstancePrice, UnitPrice, price,
)
