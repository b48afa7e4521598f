"""The reconnect budget of the readiness wait: attempts or seconds, whichever runs out first."""

import random

import pytest

from fleetgen.nodes.reconnect import MAX_BACKOFF_S, ReconnectBudget


def test_attempts_run_out_after_the_last_reconnect_fails():
    budget = ReconnectBudget(attempts=3, seconds=1000)
    for failure in range(1, 4):
        budget.record_failure(now=float(failure))
        assert not budget.spent(now=float(failure))
    budget.record_failure(now=4.0)
    assert budget.spent(now=4.0)
    assert budget.describe(now=4.0) == "4 failed connection(s) over 3 s (budget: 3 reconnects, 1000 s)"


def test_seconds_run_out_from_the_first_failure_and_a_good_poll_starts_afresh():
    budget = ReconnectBudget(attempts=100, seconds=60)
    budget.record_failure(now=100.0)
    budget.record_failure(now=150.0)
    assert not budget.spent(now=159.0) and budget.spent(now=160.0)
    budget.reset()
    assert not budget.spent(now=500.0) and budget.failures == 0
    budget.record_failure(now=500.0)
    assert budget.elapsed(now=530.0) == 30.0


def test_backoff_grows_is_capped_and_never_overshoots_the_time_left():
    budget = ReconnectBudget(attempts=50, seconds=10_000, _random=random.Random(7))
    delays = []
    for failure in range(12):
        budget.record_failure(now=0.0)
        delays.append(budget.delay(now=0.0))
    assert delays[0] < delays[3] and all(MAX_BACKOFF_S <= d <= 1.5 * MAX_BACKOFF_S for d in delays[6:])
    nearly_spent = ReconnectBudget(attempts=50, seconds=10)
    nearly_spent.record_failure(now=0.0)
    for _ in range(8):
        nearly_spent.record_failure(now=9.5)
    assert nearly_spent.delay(now=9.5) == pytest.approx(0.5)


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError):
        ReconnectBudget(attempts=-1, seconds=10)


class EdgeOfJitter:
    """A random source that always draws one end of the jitter range, and records the ranges asked for."""

    def __init__(self, end: str) -> None:
        self.end = end
        self.ranges = []

    def uniform(self, low, high):
        self.ranges.append((low, high))
        return low if self.end == "low" else high


def test_a_drop_a_recovery_and_a_second_drop_get_a_whole_budget_each():
    budget = ReconnectBudget(attempts=2, seconds=100)
    for now in (10.0, 11.0):  # first drop: two reconnects fail
        budget.record_failure(now=now)
    assert not budget.spent(now=11.0)
    budget.reset()  # a full poll succeeded
    assert budget.elapsed(now=500.0) == 0.0 and budget.describe(now=500.0).startswith("0 failed connection(s) over 0 s")
    budget.record_failure(now=1000.0)  # second drop, long after the first: its clock starts now
    budget.record_failure(now=1050.0)
    assert budget.failures == 2 and budget.first_failure_at == 1000.0
    assert not budget.spent(now=1099.0) and budget.elapsed(now=1099.0) == 99.0
    assert budget.spent(now=1100.0)
    budget.record_failure(now=1060.0)
    assert budget.spent(now=1060.0)  # attempts, not only time, run out on the second drop too


def test_later_failures_do_not_move_the_start_of_the_time_budget():
    budget = ReconnectBudget(attempts=10, seconds=60)
    budget.record_failure(now=5.0)
    budget.record_failure(now=50.0)
    assert budget.first_failure_at == 5.0 and budget.elapsed(now=64.0) == 59.0
    assert not budget.spent(now=64.0) and budget.spent(now=65.0)


def test_a_zero_budget_is_allowed_and_spent_at_the_first_failure():
    no_retries = ReconnectBudget(attempts=0, seconds=100)
    assert not no_retries.spent(now=0.0)
    no_retries.record_failure(now=0.0)
    assert no_retries.spent(now=0.0)
    no_time = ReconnectBudget(attempts=5, seconds=0)
    no_time.record_failure(now=3.0)
    assert no_time.spent(now=3.0) and no_time.delay(now=3.0) == 0.0


def test_a_negative_time_budget_is_refused_naming_both_limits():
    with pytest.raises(ValueError, match=r"never negative: 3 attempts, -1 s"):
        ReconnectBudget(attempts=3, seconds=-1)


def test_backoff_doubles_from_one_second_up_to_the_cap_with_up_to_half_again_of_jitter():
    without_jitter = EdgeOfJitter("low")
    budget = ReconnectBudget(attempts=50, seconds=10_000, _random=without_jitter)
    assert budget.delay(now=0.0) == 1.0  # before any failure
    bases = []
    for _ in range(8):
        budget.record_failure(now=0.0)
        bases.append(budget.delay(now=0.0))
    assert bases == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert without_jitter.ranges[1:] == [(0, base / 2) for base in bases]
    full_jitter = ReconnectBudget(attempts=50, seconds=10_000, _random=EdgeOfJitter("high"))
    full_jitter.record_failure(now=0.0)
    full_jitter.record_failure(now=0.0)
    assert full_jitter.delay(now=0.0) == 3.0


def test_the_wait_is_cut_to_the_time_left_and_never_negative():
    budget = ReconnectBudget(attempts=50, seconds=20, _random=EdgeOfJitter("low"))
    for _ in range(5):
        budget.record_failure(now=100.0)  # base 16 s
    assert budget.delay(now=100.0) == 16.0
    assert budget.delay(now=110.0) == 10.0
    assert budget.delay(now=125.0) == 0.0


def test_the_description_says_failures_time_and_both_limits():
    budget = ReconnectBudget(attempts=8, seconds=300)
    budget.record_failure(now=10.0)
    budget.record_failure(now=40.0)
    assert budget.describe(now=72.6) == "2 failed connection(s) over 63 s (budget: 8 reconnects, 300 s)"
