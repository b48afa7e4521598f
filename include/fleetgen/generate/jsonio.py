"""JSON for the hot path: orjson when it is installed, the standard library otherwise.

Both give compact UTF-8 bytes with keys in insertion order, so files read the same either way.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    loads = orjson.loads
    JSONDecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - depends on the environment
    _encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def dumps(value: Any) -> bytes:
        return _encoder.encode(value).encode()

    loads = json.loads
    JSONDecodeError = ValueError
