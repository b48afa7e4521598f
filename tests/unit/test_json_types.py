"""A value read from JSON, YAML or a DAG parameter is a number only when it is one: ``true`` never counts."""

import math

import pytest

from fleetgen.json_types import is_json_int, is_json_number, is_positive_int


@pytest.mark.parametrize("value", [0, -3, 1, 10**30])
def test_integers_are_json_integers(value):
    assert is_json_int(value)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1]])
def test_bools_floats_and_strings_are_not_json_integers(value):
    assert not is_json_int(value)


@pytest.mark.parametrize("value", [0, -3, 2.5, 10**30, -0.0])
def test_finite_ints_and_floats_are_json_numbers(value):
    assert is_json_number(value)


@pytest.mark.parametrize("value", [True, False, math.inf, -math.inf, math.nan, "1", None])
def test_bools_infinities_nan_and_strings_are_not_json_numbers(value):
    assert not is_json_number(value)


@pytest.mark.parametrize(("value", "positive"), [(1, True), (7, True), (0, False), (-1, False), (True, False),
                                                 (1.0, False), ("2", False)])
def test_a_positive_integer_is_an_integer_of_at_least_one(value, positive):
    assert is_positive_int(value) is positive
