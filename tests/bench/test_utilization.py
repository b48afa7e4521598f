"""bench/utilization.py in its small mode: it runs and ends with the fleet utilisation of both clients."""

import pytest


@pytest.mark.slow
def test_utilization_smoke_reports_a_utilisation_for_both_clients(run_bench):
    figures = run_bench("utilization")
    assert set(figures) == {"fleetgen", "seed_client"}
    # a share of the fleet's capacity; a little over 1 is sampling noise, more would be a wrong capacity
    assert all(0 < figures[client][0] <= 1.05 for client in figures), figures
