"""SGLang-looking log lines: ``[YYYY-MM-DD HH:MM:SS] msg`` and ``[... TP0] msg`` from the scheduler."""

from __future__ import annotations

import sys
import time


def log(message: str, *, rank: int | None = None) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    where = f" TP{rank}" if rank is not None else ""
    sys.stderr.write(f"[{stamp}{where}] {message}\n")
    sys.stderr.flush()


def traceback_text(exc_type: str, message: str, frames: list[tuple[str, int, str, str]]) -> str:
    """A Python-style traceback ending in ``exc_type: message``."""
    lines = ["Traceback (most recent call last):"]
    for filename, line, function, code in frames:
        lines.append(f'  File "{filename}", line {line}, in {function}')
        lines.append(f"    {code}")
    lines.append(f"{exc_type}: {message}")
    return "\n".join(lines)
