"""The pass/fail bounds of the validation suite: light to import (the DAG's run configuration builds them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from fleetgen.errors import ConfigError
from fleetgen.json_types import is_json_number, is_positive_int


@dataclass(frozen=True)
class ValidationThresholds:
    """Pass/fail bounds of the suite. Shares are fractions in [0, 1] of the rows they concern."""

    max_tokens: int
    min_mean_completion_tokens: float = 1
    max_mean_completion_tokens: float | None = None
    allowed_finish_reasons: tuple[str, ...] = ("stop", "length")
    max_length_share: float = 0.2
    min_reasoning_share: float = 0.9
    max_empty_answer_share: float = 0.1
    max_error_share: float = 0.01

    def __post_init__(self) -> None:
        # DAG Params arrive as JSON: accept a list for the finish reasons and keep the tuple.
        object.__setattr__(self, "allowed_finish_reasons", tuple(self.allowed_finish_reasons))
        if not is_positive_int(self.max_tokens):
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
                              hint="pass the max_tokens the generation used")
        if not self.allowed_finish_reasons or not all(
                isinstance(reason, str) and reason for reason in self.allowed_finish_reasons):
            raise ConfigError(f"allowed_finish_reasons must be non-empty strings, got {self.allowed_finish_reasons!r}")
        low, high = self.min_mean_completion_tokens, self.max_mean_completion_tokens
        if not is_json_number(low) or low < 0:
            raise ConfigError(f"min_mean_completion_tokens must be a number >= 0, got {low!r}")
        if high is not None and (not is_json_number(high) or high < low):
            raise ConfigError(f"max_mean_completion_tokens must be None or >= min_mean_completion_tokens ({low}), "
                              f"got {high!r}")
        for name in ("max_length_share", "min_reasoning_share", "max_empty_answer_share", "max_error_share"):
            share = getattr(self, name)
            if not is_json_number(share) or not 0 <= share <= 1:
                raise ConfigError(f"{name} must be a fraction in [0, 1], got {share!r}",
                                  hint="shares are fractions: 0.05 means 5 %")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ValidationThresholds":
        """Build from DAG Params; keys that are absent or None keep their defaults (max_tokens is required)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown validation threshold(s): {', '.join(unknown)}",
                              hint=f"known thresholds: {', '.join(sorted(known))}")
        given = {key: value for key, value in values.items() if value is not None}
        if "max_tokens" not in given:
            raise ConfigError("validation thresholds need max_tokens")
        return cls(**given)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["allowed_finish_reasons"] = list(self.allowed_finish_reasons)
        return out


