"""Faults injected into one simulated server, read from ``<node>/faults/<port>.json`` at start.

Every key is optional; an absent file means a healthy server.

``crash_after_requests``  N >= 1: the process dies abruptly (SIGKILL on itself, so no cleanup, as
                          the kernel's OOM killer would) right after its N-th finished generation
                          (chat or /generate items; warm-up and health checks do not count).
                          Whatever is queued or running then is lost.
``hang_after_requests``   N >= 1: after its N-th finished generation the server stops answering
                          every route (health included) but keeps connections open; running
                          requests never finish.
``http_500_rate``         0..1: share of generation requests answered with HTTP 500, drawn
                          reproducibly from the request sequence number.
``http_500_after``        N >= 0: every generation request after the N-th one gets HTTP 500.
``slow_start_seconds``    extra wall seconds spent loading weights.
``speed``                 > 0: multiplies decode and prefill speed (0.7 = a 30 % slower server).
``fail_at_launch``        one of ``FAIL_AT_LAUNCH_KINDS``: die during start-up with SGLang's own
                          message for that failure, whatever the memory arithmetic says.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_sim.errors import SimConfigError

# kind -> the SGLang failure it reproduces
FAIL_AT_LAUNCH_KINDS = {
    "oom": "KV pool sizing: 'Not enough memory. Please try to increase --mem-fraction-static ...'",
    "weights_oom": "ValueError 'Loaded weights leave no GPU memory for the KV cache ...'",
    "mamba_oom": "RuntimeError 'Not enough GPU memory for hybrid (mamba/linear-attention) state cache ...'",
    "cuda_graph_oom": "'Capture cuda graph failed: CUDA out of memory ...' with the possible solutions",
}


@dataclass(frozen=True)
class Faults:
    crash_after_requests: int | None = None
    hang_after_requests: int | None = None
    http_500_rate: float = 0.0
    http_500_after: int | None = None
    slow_start_seconds: float = 0.0
    speed: float = 1.0
    fail_at_launch: str | None = None

    def __post_init__(self) -> None:
        for name in ("crash_after_requests", "hang_after_requests"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.http_500_after is not None and (
            not isinstance(self.http_500_after, int) or self.http_500_after < 0
        ):
            raise ValueError(f"http_500_after must be an integer >= 0, got {self.http_500_after!r}")
        if not 0.0 <= float(self.http_500_rate) <= 1.0:
            raise ValueError(f"http_500_rate must be within [0, 1], got {self.http_500_rate!r}")
        if float(self.slow_start_seconds) < 0:
            raise ValueError(f"slow_start_seconds must be >= 0, got {self.slow_start_seconds!r}")
        if not float(self.speed) > 0:
            raise ValueError(f"speed must be > 0, got {self.speed!r}")
        if self.fail_at_launch is not None and self.fail_at_launch not in FAIL_AT_LAUNCH_KINDS:
            raise ValueError(
                f"fail_at_launch must be one of {sorted(FAIL_AT_LAUNCH_KINDS)}, got {self.fail_at_launch!r}"
            )

    @classmethod
    def from_dict(cls, data: dict, *, path: str | None = None) -> "Faults":
        if not isinstance(data, dict):
            raise SimConfigError("faults must be a JSON object", path=path,
                              hint=f"keys: {sorted(cls.__dataclass_fields__)}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise SimConfigError(f"unknown fault keys {unknown}", path=path,
                              hint=f"known keys: {sorted(cls.__dataclass_fields__)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise SimConfigError(f"invalid faults: {exc}", path=path,
                              hint="see include/sglang_sim/faults.py for each key's meaning") from exc

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v != getattr(Faults(), k)}


def faults_path(node_path: str | os.PathLike, port: int) -> Path:
    return Path(node_path) / "faults" / f"{int(port)}.json"


def read_faults(node_path: str | os.PathLike, port: int) -> Faults:
    path = faults_path(node_path, port)
    if not path.exists():
        return Faults()
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SimConfigError(f"faults file is not valid JSON: {exc}", path=str(path), line=exc.lineno,
                          hint="fix or delete the file; it is read when the server starts") from exc
    return Faults.from_dict(data, path=str(path))
