"""bench/hung_server.py in its small mode: it runs and ends with its figures."""

import pytest


@pytest.mark.slow
def test_hung_server_smoke_reports_the_capacity_each_arm_lost(run_bench):
    figures = run_bench("hung_server")
    assert set(figures) == {"shared_lost_s", "isolated_lost_s", "shards"}
    assert figures["shards"] == [2]
    assert figures["shared_lost_s"][0] >= 0 and figures["isolated_lost_s"][0] >= 0, figures
