"""bench/sigterm_hang.py in its small mode: it runs and ends with its figures."""

import pytest


@pytest.mark.slow
def test_sigterm_hang_smoke_reports_the_share_of_hung_trials(run_bench):
    figures = run_bench("sigterm_hang")
    assert set(figures) == {"trials", "hung", "rate"}
    (trials,), (hung,), (rate,) = figures["trials"], figures["hung"], figures["rate"]
    assert trials == 2 and 0 <= hung <= trials, figures
    assert rate == pytest.approx(hung / trials, abs=5e-4), figures
