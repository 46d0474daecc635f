"""The per-section error engine: how a bad value becomes a Problem naming path, value and fix."""
from __future__ import annotations

FIX = " FIX: "  # separates what is wrong from how to fix it in validator messages


def invalid(message: str, fix: str) -> ValueError:
    return ValueError(f"{message}{FIX}{fix}")
