"""The run configuration: the DAG's params, read once into typed groups that validate themselves.

Task callables take a ``RunConfig`` instead of casting ``params`` keys one by one. Each group turns
into the domain object its stage takes (``TunerBounds``, ``GenerationSettings``-to-be,
``ValidationThresholds``). No Airflow import: the params arrive as a plain mapping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fleetgen.errors import ConfigError
from fleetgen.outputs import RunLayout
from fleetgen.tuning import TunerBounds
from fleetgen.tuning.plan import MODES
from fleetgen.validation.thresholds import ValidationThresholds


def _int(params: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"DAG parameter {name} must be an integer in [{low}, {high}], got {value!r}",
                          hint=f"set {name} in the trigger form or the run's conf")
    return value


def _number(params: Mapping[str, Any], name: str, low: float, high: float, *, low_open: bool = False) -> float:
    value = params[name]
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ConfigError(f"DAG parameter {name} must be a number in {bound}, got {value!r}",
                          hint=f"set {name} in the trigger form or the run's conf")
    return float(value)


def _flag(params: Mapping[str, Any], name: str) -> bool:
    value = params[name]
    if not isinstance(value, bool):
        raise ConfigError(f"DAG parameter {name} must be true or false, got {value!r}")
    return value


# reuse_completions: reuse on scheduled runs only (a person's manual run generates everything), always, never
# (fleetgen.generate.reuse.reuse_enabled reads them).
REUSE_MODES = ("scheduled", "always", "never")


def _choice(params: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = params[name]
    if value not in choices:
        raise ConfigError(f"DAG parameter {name} must be one of {', '.join(choices)}, got {value!r}",
                          hint=f"set {name} in the trigger form or the run's conf")
    return value


def _text(params: Mapping[str, Any], name: str, *, required: bool) -> str:
    value = params[name]
    if value is None and not required:  # the form sends null for an optional field left empty
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ConfigError(f"DAG parameter {name} must be {'a non-empty' if required else 'a'} string, got {value!r}",
                          hint=f"set {name} in the trigger form or the run's conf")
    return value.strip()


@dataclass(frozen=True)
class Inputs:
    fleet_file: str           # empty: the Airflow Variable holds the fleet
    prompts_path: Path
    output_root: Path
    dry_run: bool
    keep_servers_up: bool
    relaunch_servers: bool      # stop and relaunch even servers already running tonight's plan

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Inputs:
        return cls(fleet_file=_text(params, "fleet_file", required=False),
                   prompts_path=Path(_text(params, "prompts_path", required=True)).expanduser(),
                   output_root=Path(_text(params, "output_root", required=True)).expanduser(),
                   dry_run=_flag(params, "dry_run"), keep_servers_up=_flag(params, "keep_servers_up"),
                   relaunch_servers=_flag(params, "relaunch_servers"))

    def require_prompts_file(self) -> None:
        """A run (a scheduled one above all) whose prompts file is missing stops in its first task, with
        one line naming the setting, instead of failing later in scan_prompts."""
        if not self.prompts_path.is_file():
            raise ConfigError(f"prompts file {self.prompts_path} not found on this worker: set the DAG parameter "
                              f"prompts_path in the trigger form, or FLEETGEN_PROMPTS_PATH of the deployment "
                              f"for scheduled runs")


@dataclass(frozen=True)
class Tuning:
    mode: str
    memory_margin_mib: int
    max_running_requests: int   # 0: the tuner decides
    context_length: int         # 0: prompt max + max_tokens
    bf16_ssm_state: bool
    no_buffer_radix: bool
    ready_timeout_s: int
    pin_full_context_plan: bool  # off: the workload mode (fleetgen.tuning.workload)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Tuning:
        mode = _text(params, "tuning", required=True)
        if mode not in MODES:
            raise ConfigError(f"DAG parameter tuning must be one of {', '.join(MODES)}, got {mode!r}")
        return cls(mode=mode,
                   memory_margin_mib=_int(params, "memory_margin_mib", 0, 65536),
                   max_running_requests=_int(params, "max_running_requests", 0, 4096),
                   context_length=_int(params, "context_length", 0, 1 << 20),
                   bf16_ssm_state=_flag(params, "bf16_ssm_state"), no_buffer_radix=_flag(params, "no_buffer_radix"),
                   ready_timeout_s=_int(params, "ready_timeout_s", 10, 7200),
                   pin_full_context_plan=_flag(params, "pin_full_context_plan"))

    def bounds(self) -> TunerBounds:
        return TunerBounds(margin_mib=self.memory_margin_mib, max_running_requests=self.max_running_requests or None,
                           context_length=self.context_length or None, bf16_ssm_state=self.bf16_ssm_state,
                           no_buffer_radix=self.no_buffer_radix, mode=self.mode)


@dataclass(frozen=True)
class Generation:
    max_tokens: int
    temperature: float
    top_p: float
    shard_size: int
    parallel_shards: int        # 0: running shards share every server's limit, recounted
    headroom: float
    sample_interval_s: float    # servers' /metrics and nodes' nvidia-smi sampled this often; 0: not at all
    reuse_completions: str      # "scheduled" (reuse on scheduled runs only), "always", "never"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Generation:
        return cls(max_tokens=_int(params, "max_tokens", 1, 262144),
                   temperature=_number(params, "temperature", 0, 2),
                   top_p=_number(params, "top_p", 0, 1, low_open=True),
                   shard_size=_int(params, "shard_size", 1, 10_000_000),
                   parallel_shards=_int(params, "parallel_shards", 0, 16),
                   headroom=_number(params, "headroom", 1, 4),
                   sample_interval_s=_number(params, "sample_interval_s", 0, 300),
                   reuse_completions=_choice(params, "reuse_completions", REUSE_MODES))


_THRESHOLD_PARAMS = ("max_length_share", "min_reasoning_share", "max_empty_answer_share", "max_error_share")


@dataclass(frozen=True)
class RunConfig:
    inputs: Inputs
    tuning: Tuning
    generation: Generation
    validation: ValidationThresholds

    @classmethod
    def param_names(cls) -> frozenset[str]:
        """Every DAG parameter a run reads; the DAG declares exactly these."""
        names = {field.name for group in (Inputs, Generation) for field in fields(group)}
        names |= {field.name for field in fields(Tuning)} - {"mode"} | {"tuning"}
        return frozenset(names | set(_THRESHOLD_PARAMS))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunConfig:
        """Validate and group the params; unknown keys (a typo in a REST trigger's conf) are refused."""
        known = cls.param_names()
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(f"unknown DAG parameter(s) {', '.join(unknown)}; valid ones: {', '.join(sorted(known))}",
                              hint="fix the names in the run's conf")
        missing = sorted(known - set(params))
        if missing:
            raise ConfigError(f"DAG parameter(s) missing: {', '.join(missing)}")
        generation = Generation.from_params(params)
        thresholds = {name: _number(params, name, 0, 1) for name in _THRESHOLD_PARAMS}
        validation = ValidationThresholds(max_tokens=generation.max_tokens, **thresholds)
        return cls(inputs=Inputs.from_params(params), tuning=Tuning.from_params(params), generation=generation,
                   validation=validation)

    def layout(self, run_id: str) -> RunLayout:
        return RunLayout.for_run(self.inputs.output_root, run_id)

    def to_dict(self) -> dict:
        return {"inputs": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.inputs).items()},
                "tuning": asdict(self.tuning), "generation": asdict(self.generation),
                "validation": asdict(self.validation)}
