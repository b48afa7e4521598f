"""The tuner's data types: the workload, the user's bounds and the per-server plan (JSON-safe)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from fleetgen.errors import ConfigError, PlanError
from fleetgen.json_types import is_json_int

# The tuning modes: the tuner sizes the servers (``tuned``), or SGLang sizes them itself from the fleet's own launch
# options, the tuner only predicting what it will reach (``sglang_defaults``).
SGLANG_DEFAULTS = "sglang_defaults"
MODES = ("tuned", SGLANG_DEFAULTS)
# The candidate configuration that is the fleet file's own: its ``server.extra_args`` as written, planned as
# before the tuning trial existed (fleetgen.tuning.candidates names the others).
INCUMBENT = "incumbent"


@dataclass(frozen=True)
class Workload:
    """What the servers will be asked to do: output budget and prompt-token statistics."""

    max_output_tokens: int
    prompt_tokens_mean: float
    prompt_tokens_max: int
    prompt_count: int

    def __post_init__(self) -> None:
        if not is_json_int(self.max_output_tokens) or self.max_output_tokens < 1:
            raise ConfigError(f"workload: max_output_tokens must be a positive integer, got {self.max_output_tokens!r}")
        if not is_json_int(self.prompt_tokens_max) or self.prompt_tokens_max < 1:
            raise ConfigError(f"workload: prompt_tokens_max must be a positive integer, got {self.prompt_tokens_max!r}")
        if not (isinstance(self.prompt_tokens_mean, (int, float)) and math.isfinite(self.prompt_tokens_mean)
                and 0 < self.prompt_tokens_mean <= self.prompt_tokens_max):
            raise ConfigError(f"workload: prompt_tokens_mean must lie in (0, prompt_tokens_max="
                              f"{self.prompt_tokens_max}], got {self.prompt_tokens_mean!r}")
        if not is_json_int(self.prompt_count) or self.prompt_count < 0:
            raise ConfigError(f"workload: prompt_count must be a non-negative integer, got {self.prompt_count!r}")

    @property
    def full_context_tokens(self) -> int:
        """Longest prompt plus the whole output budget: what one request can grow to."""
        return self.prompt_tokens_max + self.max_output_tokens

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TunerBounds:
    """The user's bounds and opt-in trade-offs. Off by default: bf16 SSM state (halves the state but
    changes numerics) and the no_buffer radix strategy (3 slots per request instead of 5).

    ``kv_tokens_mean`` / ``kv_tokens_std`` / ``kv_overflow_z``: the workload mode's KV demand (see
    ``fleetgen.tuning.workload``). When set, ``n`` running requests fit if the pool holds
    ``n x mean + z x sqrt(n) x std`` tokens instead of ``n x context``.
    """

    margin_mib: int = 1024
    max_running_requests: int | None = None
    context_length: int | None = None
    bf16_ssm_state: bool = False
    no_buffer_radix: bool = False
    mode: str = "tuned"
    kv_tokens_mean: float | None = None
    kv_tokens_std: float = 0.0
    kv_overflow_z: float = 0.0

    def __post_init__(self) -> None:
        if not is_json_int(self.margin_mib) or self.margin_mib < 0:
            raise ConfigError(f"tuner bounds: margin_mib must be a non-negative integer, got {self.margin_mib!r}")
        for name in ("max_running_requests", "context_length"):
            value = getattr(self, name)
            if value is not None and (not is_json_int(value) or value < 1):
                raise ConfigError(f"tuner bounds: {name} must be a positive integer, got {value!r}")
        if self.mode not in MODES:
            raise ConfigError(f"tuner bounds: mode must be one of {MODES}, got {self.mode!r}")
        if self.kv_tokens_mean is not None and not (math.isfinite(self.kv_tokens_mean) and self.kv_tokens_mean > 0):
            raise ConfigError(f"tuner bounds: kv_tokens_mean must be a positive number, got {self.kv_tokens_mean!r}")
        for name in ("kv_tokens_std", "kv_overflow_z"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"tuner bounds: {name} must be a non-negative number, got {value!r}")

    def kv_tokens_needed(self, requests: int, full_context_tokens: int) -> int:
        """KV pool tokens ``requests`` running requests need: each at its full context, or the
        workload's demand when the workload mode set it."""
        if self.kv_tokens_mean is None:
            return requests * full_context_tokens
        return math.ceil(requests * self.kv_tokens_mean + self.kv_overflow_z * math.sqrt(requests) * self.kv_tokens_std)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ServerPlan:
    """One server's launch plan.

    ``flags`` are only what the tuner decides (full flag name -> value, True for a bare switch); the
    user's own extra args are appended by the launcher. ``expected`` holds what SGLang should report
    in /server_info. ``budget`` rows are (item, bytes, note). ``inputs`` keeps everything needed to
    re-plan (backoff) without the probe or the model files.

    ``candidate`` names the configuration the plan is for (``INCUMBENT``: the fleet file's own; the tuning
    trial's challengers, fleetgen.tuning.candidates). ``extra_args`` are the SGLang args the launcher appends
    after ``flags``: the candidate's edit of the fleet's ``server.extra_args``; None: the fleet's own.
    """

    host: str
    gpu_ids: list[int]
    port: int
    flags: dict
    expected: dict
    budget: list[dict]
    attempt: int = 0
    mode: str = "tuned"
    notes: list[str] = field(default_factory=list)
    inputs: dict = field(default_factory=dict)
    candidate: str = INCUMBENT
    extra_args: list[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.candidate, str) or not self.candidate:
            raise PlanError(f"plan for port {self.port} names no candidate configuration", host=self.host)
        if self.extra_args is not None and not all(isinstance(arg, str) for arg in self.extra_args):
            raise PlanError(f"plan for port {self.port}: extra_args must be strings, got {self.extra_args!r}",
                            host=self.host)
        if self.mode not in MODES:
            raise PlanError(f"plan mode must be one of {MODES}, got {self.mode!r}", host=self.host)
        missing = {"max_running_requests", "max_mamba_cache_size", "max_total_num_tokens"} - set(self.expected)
        if missing:
            raise PlanError(f"plan for port {self.port} lacks expected value(s) {sorted(missing)}", host=self.host)

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"

    def to_dict(self) -> dict:
        return {"host": self.host, "gpu_ids": list(self.gpu_ids), "port": self.port, "flags": dict(self.flags),
                "expected": dict(self.expected), "budget": [dict(row) for row in self.budget],
                "attempt": self.attempt, "mode": self.mode, "notes": list(self.notes), "inputs": self.inputs,
                "candidate": self.candidate,
                "extra_args": None if self.extra_args is None else list(self.extra_args)}

    @classmethod
    def from_dict(cls, data: dict) -> "ServerPlan":
        try:
            return cls(host=data["host"], gpu_ids=[int(g) for g in data["gpu_ids"]], port=int(data["port"]),
                       flags=dict(data["flags"]), expected=dict(data["expected"]),
                       budget=[dict(row) for row in data["budget"]], attempt=int(data.get("attempt", 0)),
                       mode=data.get("mode", "tuned"), notes=list(data.get("notes", [])),
                       inputs=dict(data.get("inputs", {})), candidate=data.get("candidate", INCUMBENT),
                       extra_args=None if data.get("extra_args") is None else list(data["extra_args"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"not a server plan: {exc!r}") from None

    def budget_row(self, item: str) -> int:
        """The bytes of one budget row, by its name (indentation ignored)."""
        for row in self.budget:
            if row["item"].strip() == item:
                return int(row["bytes"])
        raise PlanError(f"the plan's budget has no row {item!r}", host=self.host, server=self.server)

    def command_args(self) -> list[str]:
        """The plan's flags as SGLang command-line items, in a stable order."""
        args: list[str] = []
        for name in sorted(self.flags):
            value = self.flags[name]
            if value is True:
                args.append(name)
            elif value is False or value is None:
                continue
            else:
                args.extend([name, format_flag_value(value)])
        return args


def format_flag_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)
