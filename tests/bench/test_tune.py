"""bench/tune.py in its small mode (one night): it runs and ends with its figures."""

import pytest


@pytest.mark.slow
def test_tune_smoke_reports_caps_and_throughput_against_the_hand_tuned_flags(run_bench):
    figures = run_bench("tune")
    assert set(figures) == {"plan_cap", "workload_cap", "plan/hand", "workload/hand", "retracted", "nights"}
    assert figures["plan_cap"][0] >= 1 and figures["workload_cap"][0] >= 1, figures
    assert figures["plan/hand"][0] > 0 and figures["workload/hand"][0] > 0, figures
    assert figures["retracted"][0] >= 0 and figures["nights"] == [1], figures
