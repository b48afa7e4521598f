"""bench/model_identity.py in its small mode (two tiny checkpoints): it runs and ends with its figures."""


def test_model_identity_smoke_reports_header_and_full_hash_of_a_split_checkpoint(run_bench):
    figures = run_bench("model_identity")
    assert set(figures) == {"header_seconds", "full_seconds", "full_gib_per_s", "bytes"}
    assert figures["header_seconds"][0] > 0 and figures["full_seconds"][0] > 0, figures  # a process start each
    # printed to 0.01 GiB/s: a checkpoint of under 1 MB, read by a fresh process, reads as 0
    assert figures["full_gib_per_s"][0] >= 0 and figures["bytes"][0] > 0, figures
