"""bench/prompt_plan.py in its small mode: it runs and ends with its figures."""

SECONDS = ("scan_s", "hash_pass_s", "snapshot_s", "plan_s", "shard_check_s", "planned_read_s")


def test_prompt_plan_smoke_reports_the_scan_and_its_alternative(run_bench):
    figures = run_bench("prompt_plan")
    assert set(figures) == {"prompts", "file_bytes", "snapshot_bytes", "scan_disk_bytes", "scan_json_bytes", *SECONDS}
    assert figures["prompts"] == [3000]
    assert all(figures[key][0] >= 0 for key in SECONDS), figures  # printed rounded: a small step reads as 0
    # the snapshot copies the scanned bytes (whole blocks on disk); valid prompts leave no rejects
    assert figures["snapshot_bytes"][0] >= figures["file_bytes"][0] > 0, figures
    assert figures["scan_disk_bytes"] == [0] and figures["scan_json_bytes"][0] > 0, figures
