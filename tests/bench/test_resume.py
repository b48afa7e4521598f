"""bench/resume.py in its small mode: it runs and ends with its figures."""


def test_resume_smoke_reports_the_finished_completions_it_found(run_bench):
    figures = run_bench("resume")
    assert set(figures) == {"seconds", "peak_mib", "completions"}
    assert figures["completions"] == [1000]
    assert figures["seconds"][0] >= 0 and figures["peak_mib"][0] > 0, figures
