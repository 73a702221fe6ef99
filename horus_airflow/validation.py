"""Checks for numbers read from users' files and arguments: one wording for every entry point.

Each raises :class:`ValueError` whose message names the value and the accepted range; callers add where
the value came from (a profile, a cluster state) and turn it into their own typed error.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any, name: str) -> float:
    """A finite int or float (not a bool, a string or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def in_range(value: Any, name: str, low: float = -math.inf, high: float = math.inf, *, above: bool = False) -> float:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``above``)."""
    number = finite(value, name)
    if number < low or (above and number == low) or number > high:
        raise ValueError(f"{name} must be {_bounds(low, high, above)}, got {value!r}")
    return number


def whole(value: Any, name: str, low: int = 0, high: float = math.inf) -> int:
    """An int (not a bool, not 2.5) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number {_bounds(low, high, False)}, got {value!r}")
    return value


def _bounds(low: float, high: float, above: bool) -> str:
    parts = []
    if low != -math.inf:
        parts.append(f"{'>' if above else '>='} {low:g}")
    if high != math.inf:
        parts.append(f"<= {high:g}")
    return " and ".join(parts) or "any number"
