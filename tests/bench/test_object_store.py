"""bench/object_store.py in its small mode: it runs against a real store and ends with its figures."""


def test_object_store_smoke_reports_the_ratio_the_resume_and_the_objects_written(run_bench):
    figures = run_bench("object_store")
    assert set(figures) == {"utilization_ratio", "resume_1m_s", "resume_1m_mb", "validate_ratio", "objects_per_1k",
                            "beyond_data_pct"}
    assert figures["validate_ratio"][0] > 0, figures
    assert figures["utilization_ratio"][0] > 0 and figures["resume_1m_s"][0] >= 0, figures
    assert figures["resume_1m_mb"][0] > 0 and figures["objects_per_1k"][0] > 0, figures
    assert 0 < figures["beyond_data_pct"][0] < 100, figures
