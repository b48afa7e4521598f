"""Readiness of SGLang servers: fatal log lines, ``/server_info`` readback. Pure functions.

The fatal messages are SGLang 0.5.23's own (sglang-facts sections 2.1-2.3, 3 and 5); a line that
matches fails the wait at once with that line, instead of waiting out a timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetgen.errors import FailureKind, ServerError

K = FailureKind
# (kind, needle). Specific causes first: the first specific match in a log wins over a generic one.
# The messages are SGLang 0.5.23's (docs/sglang-memory-model.md, "Fatal messages").
_SPECIFIC = (
    (K.OOM_WEIGHTS, "Loaded weights leave no GPU memory for the KV cache"),
    (K.OOM_KV, "Not enough memory. Please try to increase --mem-fraction-static"),
    (K.OOM_MAMBA, "Not enough GPU memory for hybrid (mamba/linear-attention) state cache"),
    (K.OOM_MAMBA, "Hybrid (mamba/linear-attention) state cache is too small to serve any requests"),
    (K.OOM_CUDA_GRAPH, "Capture cuda graph failed"),
    (K.OOM_RUNTIME, "CUDA out of memory"),
    (K.OOM_RUNTIME, "OutOfMemoryError"),
    (K.BAD_ARGS, "error: unrecognized arguments"),
    (K.BAD_ARGS, "error: ambiguous option"),
    (K.BAD_ARGS, "error: argument"),
    (K.BAD_ARGS, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
    (K.PORT_IN_USE, "Address already in use"),
    (K.PORT_IN_USE, "address already in use"),  # uvicorn's wording
)
_GENERIC = (
    (K.EXITED, re.compile(r"scheduler died during initialization")),
    (K.EXITED, re.compile(r"Initialization failed\.")),
    (K.EXITED, re.compile(r"^Traceback \(most recent call last\)")),
)


@dataclass(frozen=True)
class FatalLine:
    kind: FailureKind
    line: str
    line_number: int  # 1-based, within the lines scanned

    @property
    def hint(self) -> str:
        return self.kind.hint


def find_fatal(lines: list[str]) -> FatalLine | None:
    """The most telling fatal line in a log excerpt, or None while the server is still healthy."""
    generic: FatalLine | None = None
    for number, line in enumerate(lines, start=1):
        for kind, needle in _SPECIFIC:
            if needle in line:
                return FatalLine(kind, line.strip(), number)
        if generic is None:
            for kind, pattern in _GENERIC:
                if pattern.search(line):
                    generic = FatalLine(kind, line.strip(), number)
                    break
    return generic


@dataclass(frozen=True)
class EffectiveLimits:
    """What a running server reports it allows (sglang-facts section 5, ``/server_info``)."""

    effective_max_running_requests: int
    max_total_num_tokens: int
    max_mamba_cache_size: int | None
    context_length: int | None
    version: str | None
    dp_ranks: int

    def to_dict(self) -> dict:
        return {"effective_max_running_requests": self.effective_max_running_requests,
                "max_total_num_tokens": self.max_total_num_tokens,
                "max_mamba_cache_size": self.max_mamba_cache_size,
                "context_length": self.context_length, "version": self.version, "dp_ranks": self.dp_ranks}


def parse_server_info(info: dict, *, server: str) -> EffectiveLimits:
    """Effective limits from a ``/server_info`` body.

    The top-level ``max_running_requests`` is the *requested* value (sglang-facts 5): the cap that
    binds is ``internal_states[].effective_max_running_requests_per_dp``, summed over DP ranks.
    """
    states = info.get("internal_states")
    if not isinstance(states, list) or not states:
        raise ServerError("/server_info has no internal_states: is this SGLang >= 0.5.15?", server=server,
                          hint="fleetgen reads effective_max_running_requests_per_dp from internal_states")
    try:
        effective = sum(int(state["effective_max_running_requests_per_dp"]) for state in states)
    except (KeyError, TypeError, ValueError):
        raise ServerError("/server_info internal_states lack effective_max_running_requests_per_dp",
                          server=server) from None
    tokens = info.get("max_total_num_tokens", states[0].get("max_total_num_tokens"))
    if tokens is None:
        raise ServerError("/server_info has no max_total_num_tokens", server=server)
    mamba = states[0].get("max_mamba_cache_size", info.get("max_mamba_cache_size"))
    context = info.get("context_length") or states[0].get("context_length")
    return EffectiveLimits(
        effective_max_running_requests=effective,
        max_total_num_tokens=int(tokens),
        max_mamba_cache_size=int(mamba) if mamba is not None else None,
        context_length=int(context) if context is not None else None,
        version=info.get("version"),
        dp_ranks=len(states),
    )


def format_log_excerpt(lines: list[str], limit: int = 50) -> str:
    tail = lines[-limit:]
    return "\n".join(f"    | {line}" for line in tail)
