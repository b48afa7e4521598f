"""bench/validate.py in its small mode: it runs and ends with its figures."""

import pytest


@pytest.mark.slow
def test_validate_smoke_reports_the_rows_it_validated(run_bench):
    figures = run_bench("validate")
    assert set(figures) == {"seconds", "peak_mib", "rows"}
    assert figures["rows"] == [1998]  # 2,000 prompts less the 0.1 % written as permanent errors
    assert figures["seconds"][0] > 0 and figures["peak_mib"][0] > 0, figures
