"""Readiness of SGLang servers: fatal log lines, ``/server_info`` readback. Pure functions.

The fatal messages are SGLang 0.5.23's own (sglang-facts sections 2.1-2.3, 3 and 5); a line that
matches fails the wait at once with that line, instead of waiting out a timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetgen.errors import ServerError

# (kind, pattern). Specific causes first: the first specific match in a log wins over a generic one.
_SPECIFIC = (
    ("oom_weights", "Loaded weights leave no GPU memory for the KV cache"),             # 2.1
    ("oom_kv", "Not enough memory. Please try to increase --mem-fraction-static"),       # 2.2
    ("oom_mamba", "Not enough GPU memory for hybrid (mamba/linear-attention) state cache"),  # 2.3
    ("oom_mamba", "Hybrid (mamba/linear-attention) state cache is too small to serve any requests"),  # 3
    ("oom_cuda_graph", "Capture cuda graph failed"),                                     # 5.4
    ("oom_runtime", "CUDA out of memory"),
    ("oom_runtime", "OutOfMemoryError"),
    ("bad_args", "error: unrecognized arguments"),
    ("bad_args", "error: ambiguous option"),
    ("bad_args", "error: argument"),
    ("bad_args", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
    ("port_in_use", "Address already in use"),
    ("port_in_use", "address already in use"),  # uvicorn's wording
)
_GENERIC = (
    ("exited", re.compile(r"scheduler died during initialization")),                    # 5.1
    ("exited", re.compile(r"Initialization failed\.")),
    ("exited", re.compile(r"^Traceback \(most recent call last\)")),
)

OOM_KINDS = frozenset({"oom_weights", "oom_kv", "oom_mamba", "oom_cuda_graph", "oom_runtime"})

_HINTS = {
    "oom_weights": "the weights leave no room at this --mem-fraction-static; fleetgen re-plans smaller automatically",
    "oom_kv": "the KV pool did not fit; lower --max-mamba-cache-size or raise --mem-fraction-static",
    "oom_mamba": "the Mamba state pool did not fit; lower --max-mamba-cache-size or --max-running-requests",
    "oom_cuda_graph": "activations/CUDA graphs did not fit outside the static pool; lower --mem-fraction-static, "
                      "--chunked-prefill-size or --cuda-graph-max-bs-decode",
    "oom_runtime": "CUDA ran out of memory; check for foreign processes on the GPU (nvidia-smi) and lower "
                   "--mem-fraction-static",
    "bad_args": "SGLang refused its command line: check server.extra_args in the fleet description against the "
                "installed SGLang version",
    "port_in_use": "another process listens on this port: find it with `ss -ltnp` on the node",
    "exited": "read the log lines above the failure for the cause",
}


@dataclass(frozen=True)
class FatalLine:
    kind: str
    line: str
    line_number: int  # 1-based, within the lines scanned

    @property
    def is_oom(self) -> bool:
        return self.kind in OOM_KINDS

    @property
    def hint(self) -> str:
        return _HINTS[self.kind]


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
