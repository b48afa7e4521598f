"""SGLang-looking log lines: ``[YYYY-MM-DD HH:MM:SS] msg``, and from a scheduler of a parallel server
``[YYYY-MM-DD HH:MM:SS DP1 TP0] msg``: SGLang names the DP rank only with --dp-size > 1 and the TP rank only
with --tp-size > 1 (``sglang/srt/managers/scheduler.py`` ``run_scheduler_process``), so a one-GPU server's
scheduler lines carry no prefix."""

from __future__ import annotations

import sys
import time

_parallel = {"tp": 1, "dp": 1}


def set_parallel(*, tp_size: int, dp_size: int = 1) -> None:
    """The server's sizes, which decide the rank prefixes of the scheduler lines."""
    _parallel.update(tp=int(tp_size), dp=int(dp_size))


def prefix(rank: int | None, dp_rank: int | None = None) -> str:
    where = ""
    if dp_rank is not None and _parallel["dp"] > 1:
        where += f" DP{dp_rank}"
    if rank is not None and _parallel["tp"] > 1:
        where += f" TP{rank}"
    return where


def log(message: str, *, rank: int | None = None, dp_rank: int | None = None) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}{prefix(rank, dp_rank)}] {message}\n")
    sys.stderr.flush()


def traceback_text(exc_type: str, message: str, frames: list[tuple[str, int, str, str]]) -> str:
    """A Python-style traceback ending in ``exc_type: message``."""
    lines = ["Traceback (most recent call last):"]
    for filename, line, function, code in frames:
        lines.append(f'  File "{filename}", line {line}, in {function}')
        lines.append(f"    {code}")
    lines.append(f"{exc_type}: {message}")
    return "\n".join(lines)
