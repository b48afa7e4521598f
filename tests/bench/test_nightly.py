"""bench/nightly.py in its small mode: three DAG runs, and its figures per night."""

import pytest


@pytest.mark.slow
def test_nightly_smoke_reports_three_nights(run_bench, tmp_path):
    figures = run_bench("nightly", "--dir", str(tmp_path / "nights"))
    assert set(figures) == {"relaunched", "generated", "seconds"}
    assert all(len(parts) == 3 for parts in figures.values()), figures
    relaunched, generated, seconds = figures["relaunched"], figures["generated"], figures["seconds"]
    assert relaunched[0] >= 1 and all(count >= 0 for count in relaunched), figures  # night 1 starts a cold node
    assert generated[0] == 100 and all(0 <= count <= 103 for count in generated), figures  # 100 prompts, +3 % night 3
    assert all(part > 0 for part in seconds), figures
