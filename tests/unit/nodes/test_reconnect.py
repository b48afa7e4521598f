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
