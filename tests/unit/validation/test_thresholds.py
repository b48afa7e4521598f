"""The validation suite's pass/fail bounds as DAG Params give them: defaults, edges, JSON types."""

from __future__ import annotations

import json
import math

import pytest

from fleetgen.errors import ConfigError
from fleetgen.validation.thresholds import ValidationThresholds

SHARES = ("max_length_share", "min_reasoning_share", "max_empty_answer_share", "max_error_share")


def test_the_defaults_are_the_documented_bounds():
    assert ValidationThresholds(max_tokens=1).to_dict() == {
        "max_tokens": 1, "min_mean_completion_tokens": 1, "max_mean_completion_tokens": None,
        "allowed_finish_reasons": ["stop", "length"], "max_length_share": 0.2, "min_reasoning_share": 0.9,
        "max_empty_answer_share": 0.1, "max_error_share": 0.01}


@pytest.mark.parametrize("value", [True, False, 0, -1, 1.0, "4096", None])
def test_max_tokens_must_be_a_whole_number_of_at_least_one_and_json_true_is_not_one(value):
    with pytest.raises(ConfigError, match="max_tokens must be an integer >= 1") as refused:
        ValidationThresholds(max_tokens=value)
    assert refused.value.hint == "pass the max_tokens the generation used"


@pytest.mark.parametrize("name", SHARES)
@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, 0.5])
def test_a_share_of_exactly_zero_or_one_is_accepted(name, value):
    assert getattr(ValidationThresholds(max_tokens=10, **{name: value}), name) == value


@pytest.mark.parametrize("name", SHARES)
@pytest.mark.parametrize("value", [-0.001, 1.001, 5, math.inf, math.nan, True, "0.1", None])
def test_a_share_outside_zero_to_one_or_not_a_number_is_refused_with_the_hint(name, value):
    with pytest.raises(ConfigError, match=f"{name} must be a fraction in") as refused:
        ValidationThresholds(max_tokens=10, **{name: value})
    assert refused.value.hint == "shares are fractions: 0.05 means 5 %"


def test_the_mean_completion_bounds_may_meet_but_not_cross():
    assert ValidationThresholds(max_tokens=10, min_mean_completion_tokens=0).min_mean_completion_tokens == 0
    same = ValidationThresholds(max_tokens=10, min_mean_completion_tokens=5, max_mean_completion_tokens=5)
    assert (same.min_mean_completion_tokens, same.max_mean_completion_tokens) == (5, 5)
    with pytest.raises(ConfigError, match="max_mean_completion_tokens must be None or >= "
                                          r"min_mean_completion_tokens \(5\), got 4.9"):
        ValidationThresholds(max_tokens=10, min_mean_completion_tokens=5, max_mean_completion_tokens=4.9)
    for bad_high in (math.inf, math.nan, True, "9"):
        with pytest.raises(ConfigError, match="max_mean_completion_tokens"):
            ValidationThresholds(max_tokens=10, max_mean_completion_tokens=bad_high)
    for bad_low in (-0.5, math.nan, math.inf, True, "1"):
        with pytest.raises(ConfigError, match="min_mean_completion_tokens must be a number >= 0"):
            ValidationThresholds(max_tokens=10, min_mean_completion_tokens=bad_low)


def test_finish_reasons_are_kept_as_a_tuple_of_non_empty_strings():
    assert ValidationThresholds(max_tokens=10, allowed_finish_reasons=["stop"]).allowed_finish_reasons == ("stop",)
    for bad in ([], ["stop", ""], ["stop", 1], [None]):
        with pytest.raises(ConfigError, match="allowed_finish_reasons must be non-empty strings"):
            ValidationThresholds(max_tokens=10, allowed_finish_reasons=bad)


def test_dag_params_as_json_build_the_thresholds_and_nones_keep_the_defaults():
    params = json.loads('{"max_tokens": 4096, "max_error_share": 0, "min_reasoning_share": null, '
                        '"allowed_finish_reasons": ["stop"], "max_mean_completion_tokens": 3000}')
    thresholds = ValidationThresholds.from_mapping(params)
    assert thresholds == ValidationThresholds(max_tokens=4096, max_error_share=0, allowed_finish_reasons=("stop",),
                                              max_mean_completion_tokens=3000)
    assert thresholds.min_reasoning_share == 0.9
    assert ValidationThresholds.from_mapping(json.loads(json.dumps(thresholds.to_dict()))) == thresholds


def test_unknown_params_are_named_with_the_known_ones_and_max_tokens_is_required():
    with pytest.raises(ConfigError, match="unknown validation threshold[(]s[)]: max_tkens, z_share") as refused:
        ValidationThresholds.from_mapping({"z_share": 1, "max_tokens": 10, "max_tkens": 5})
    assert refused.value.hint == ("known thresholds: allowed_finish_reasons, max_empty_answer_share, max_error_share, "
                                  "max_length_share, max_mean_completion_tokens, max_tokens, "
                                  "min_mean_completion_tokens, min_reasoning_share")
    for params in ({}, {"max_tokens": None}, {"max_error_share": 0.1}):
        with pytest.raises(ConfigError, match="^validation thresholds need max_tokens"):
            ValidationThresholds.from_mapping(params)
    with pytest.raises(ConfigError, match="max_tokens must be an integer"):
        ValidationThresholds.from_mapping({"max_tokens": True})  # JSON true is not 1


@pytest.mark.parametrize("share", [math.nan, math.inf, True])
def test_a_share_that_is_no_finite_number_is_refused(share):
    with pytest.raises(ConfigError, match="max_error_share"):
        ValidationThresholds.from_mapping({"max_tokens": 100, "max_error_share": share})
