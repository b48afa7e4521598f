"""bench/jsonl_framing.py in its small mode: it runs and ends with its figures."""


def test_jsonl_framing_smoke_reports_both_readers_over_every_prompt(run_bench):
    figures = run_bench("jsonl_framing")
    assert set(figures) == {"own_s", "jsonlines_s", "jsonlines/own", "prompts"}
    assert figures["prompts"] == [20_000]
    assert figures["own_s"][0] >= 0 and figures["jsonlines_s"][0] >= 0  # printed to 0.01 s: a small file reads as 0
    assert figures["jsonlines/own"][0] > 0, figures
