"""bench/dag_utilization.py in its small mode: the DAG on Airflow standalone, and the fleet utilisation."""

import pytest


@pytest.mark.slow
def test_dag_utilization_smoke_reports_a_utilisation_and_the_shards_at_once(run_bench):
    figures = run_bench("dag_utilization")
    assert set(figures) == {"fleet", "shards"}
    assert 0 < figures["fleet"][0] <= 1.05, figures
    assert 1 <= figures["shards"][0] <= 2, figures  # the smoke run's pool has 2 slots
