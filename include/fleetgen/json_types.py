"""What counts as a number in a value read from JSON, YAML or a DAG parameter.

``true`` is a bool there, never the count 1: Python's ``bool`` is an ``int``, so ``isinstance(True, int)``
alone would take it as a port, a slot count or a token budget. Every check of such a value goes through here.
"""

from __future__ import annotations

import math
from typing import Any


def is_json_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_json_number(value: Any) -> bool:
    """A finite integer or float, not a bool (NaN and infinity are no measure of anything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_positive_int(value: Any) -> bool:
    """An integer of at least 1, not a bool."""
    return is_json_int(value) and value >= 1
