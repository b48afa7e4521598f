"""bench/client_cost.py in its small mode: it runs and ends with its figure."""


def test_client_cost_smoke_reports_cpu_per_request(run_bench):
    figures = run_bench("client_cost")
    assert set(figures) == {"us_per_request"}
    assert figures["us_per_request"][0] > 0, figures
