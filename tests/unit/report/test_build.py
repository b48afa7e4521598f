"""build_report figures on a small synthetic run, the comparison with a previous run, and its lookup."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from report_fixtures import ROWS, plan_and_readiness, report_of
from validate_fixtures import MAX_TOKENS, SERVERS, error_row, good_row, write_run

from fleetgen.report.build import build_report
from fleetgen.report.previous import find_previous_report

SPAN = 2.0 + (ROWS - 1) * 0.1  # first request starts at T0 (latency 2 s), the last one ends at T0 + SPAN
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_files_and_figures_of_a_small_run(tmp_path):
    data = [good_row(index) for index in range(ROWS)]
    data[7].update(finish_reason="length", completion_tokens=MAX_TOKENS)
    out = write_run(tmp_path / "run", data, errors=[error_row("p00300")])
    brief, report = report_of(out, "run")
    total = sum(row["completion_tokens"] for row in data)

    folder = out / "report"
    assert brief["report_json"] == str(folder / "report.json") and brief["report_md"] == str(folder / "report.md")
    for name in ("throughput_over_time", "output_tokens", "finish_reasons", "per_server"):
        png = folder / report["plots"][name]
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5_000
    assert report["totals"] == {"completions": ROWS, "prompt_tokens": 270 * ROWS, "completion_tokens": total}
    assert report["timing"]["generation_seconds"] == pytest.approx(SPAN)
    assert report["timing"]["basis"] == "first_start_to_last_finish"
    assert report["throughput"]["tokens_per_s"] == pytest.approx(total / SPAN, abs=0.01)
    assert brief["tokens_per_s"] == report["throughput"]["tokens_per_s"]

    per_server = report["per_server"]
    for offset, server in enumerate(SERVERS):
        mine = data[offset::3]
        tokens = sum(row["completion_tokens"] for row in mine)
        assert per_server[server]["completions"] == len(mine)
        assert per_server[server]["tokens_per_s"] == pytest.approx(tokens / SPAN, abs=0.01)
        active = mine[-1]["finished_at"] - (mine[0]["finished_at"] - 2.0)
        assert per_server[server]["tokens_per_s_active"] == pytest.approx(tokens / active, abs=0.01)
    assert sum(row["tokens_per_s"] for row in per_server.values()) == pytest.approx(total / SPAN, abs=0.05)
    assert per_server["node-a:30001"]["length_share"] == pytest.approx(1 / 100)
    per_gpu = report["per_gpu"]
    assert set(per_gpu) == {"node-a:gpu0", "node-a:gpu1", "node-b:gpu0", "node-b:gpu1"}
    assert per_gpu["node-b:gpu1"]["tokens_per_s"] == pytest.approx(per_server["node-b:30000"]["tokens_per_s"] / 2,
                                                                    abs=0.01)
    assert brief["per_gpu"]["node-a:gpu0"] == per_server["node-a:30000"]["tokens_per_s"]

    timeline = report["timeline"]
    assert sum(timeline["overall"]) * timeline["bucket_seconds"] == pytest.approx(total, rel=1e-3)
    assert sum(timeline["per_server"]["node-b:30000"]) * timeline["bucket_seconds"] == pytest.approx(
        sum(row["completion_tokens"] for row in data[2::3]), rel=1e-3)
    histogram = report["completion_tokens"]["histogram"]
    assert sum(histogram["counts"]) == ROWS and histogram["edges"][-1] == MAX_TOKENS
    assert histogram["counts"][-1] == 1  # the truncated one, at exactly max_tokens
    assert report["finish_reasons"] == {"stop": ROWS - 1, "length": 1}
    assert report["completion_tokens"]["max"] == MAX_TOKENS
    assert report["errors"]["prompts"] == 1 and report["errors"]["by_code"] == {"500": 1}
    assert (report["shards"]["count"], report["shards"]["done"], report["shards"]["seconds_max"]) == (2, 300, 31.5)
    assert report["tuning"][0]["expected"]["max_running_requests"] == 40
    assert report["tuning"][0]["effective"]["max_running_requests"] == 40
    assert report["tuning"][0]["flags"] == {"--max-mamba-cache-size": 200, "--mem-fraction-static": 0.93}
    assert report["run_succeeded"] is True and report["comparison"] is None and brief["comparison"] is None

    markdown = (folder / "report.md").read_text()
    assert f"**{total / SPAN:,.1f} completion tokens/s**" in markdown
    assert "![Throughput over time](throughput_over_time.png)" in markdown
    assert "| node-b:30000 | 0,1 | 100 |" in markdown
    assert "No previous successful run." in markdown


def test_wall_seconds_becomes_the_headline_basis(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(ROWS)])
    total = sum(good_row(index)["completion_tokens"] for index in range(ROWS))
    brief, report = report_of(out, "run", wall_seconds=120.0)
    assert report["timing"]["basis"] == "wall_seconds" and brief["basis"] == "wall_seconds"
    assert report["throughput"]["tokens_per_s"] == pytest.approx(total / 120.0, abs=0.01)
    assert report["throughput"]["tokens_per_s_generation"] == pytest.approx(total / SPAN, abs=0.01)


def test_caps_that_differ_from_the_plan_are_flagged(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    _, report = report_of(out, "run", effective_running=16)
    row = report["tuning"][0]
    assert row["matches"] == {"max_running_requests": False, "max_mamba_cache_size": True,
                              "max_total_num_tokens": True}
    assert "40 / 16 **(differs)**" in (out / "report" / "report.md").read_text()


def test_comparison_with_the_previous_run(tmp_path):
    before = [good_row(index, completion_tokens=100) for index in range(ROWS)]
    _, previous = report_of(write_run(tmp_path / "before", before), "before", effective_running=16)
    after = [good_row(index, completion_tokens=150) for index in range(ROWS)]
    brief, report = report_of(write_run(tmp_path / "after", after), "after", effective_running=40,
                              previous=tmp_path / "before" / "report" / "report.json")
    comparison = report["comparison"]
    assert comparison["available"] and comparison["previous_run_id"] == "before"
    speed = comparison["metrics"]["tokens_per_s"]
    assert speed["previous"] == pytest.approx(100 * ROWS / SPAN, abs=0.01)
    assert speed["current"] == pytest.approx(150 * ROWS / SPAN, abs=0.01)
    assert speed["delta"] == pytest.approx(speed["current"] - speed["previous"])
    assert speed["delta_pct"] == pytest.approx(50.0, abs=0.01)
    assert comparison["metrics"]["completion_tokens_mean"] == {"previous": 100.0, "current": 150.0, "delta": 50.0,
                                                               "delta_pct": 50.0}
    assert comparison["metrics"]["completions"]["delta"] == 0
    assert comparison["caps"]["node-a:30000"]["max_running_requests"] == {"previous": 16, "current": 40,
                                                                          "delta": 24, "delta_pct": 150.0}
    assert comparison["fleet_caps"]["max_running_requests"] == {"previous": 48, "current": 120, "delta": 72,
                                                                "delta_pct": 150.0}
    assert comparison["per_server_tokens_per_s"]["node-b:30000"]["delta_pct"] == pytest.approx(50.0, abs=0.01)
    assert brief["comparison"]["tokens_per_s"] == speed
    assert previous["throughput"]["tokens_per_s"] == speed["previous"]
    row = f"| tokens_per_s | {speed['previous']:,.1f} | {speed['current']:,.1f} | {speed['delta']:,.1f} | +50.0 % |"
    assert row in (tmp_path / "after" / "report" / "report.md").read_text()


def test_an_unusable_previous_report_does_not_fail_the_report(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    brief, report = report_of(out, "run", previous=broken)
    assert report["comparison"]["available"] is False and str(broken) == report["comparison"]["previous_report"]
    assert brief["comparison"]["available"] is False
    _, report = report_of(out, "run", previous=tmp_path / "absent.json")
    assert report["comparison"]["available"] is False


def _stored_report(root: Path, run_id: str, *, succeeded: bool, at: float) -> Path:
    path = root / run_id / "report" / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": 1, "run_id": run_id, "run_succeeded": succeeded,
                                "generated_at_epoch": at}))
    return path


def test_find_previous_report_picks_the_newest_successful_other_run(tmp_path):
    assert find_previous_report(tmp_path, "now") is None
    _stored_report(tmp_path, "first", succeeded=True, at=1_000.0)
    newest = _stored_report(tmp_path, "second", succeeded=True, at=2_000.0)
    _stored_report(tmp_path, "failed", succeeded=False, at=3_000.0)
    _stored_report(tmp_path, "now", succeeded=True, at=4_000.0)
    (tmp_path / "torn" / "report").mkdir(parents=True)
    (tmp_path / "torn" / "report" / "report.json").write_text("{")
    assert find_previous_report(tmp_path, "now") == newest
    assert find_previous_report(tmp_path, "second").parent.parent.name == "now"


def test_a_run_without_validation_is_not_a_successful_previous_run(tmp_path):
    out = write_run(tmp_path / "root" / "r1", [good_row(index) for index in range(30)])
    plan, readiness = plan_and_readiness(40)
    build_report(out, run_id="r1", plan=plan, readiness=readiness, shard_results=None, validation=None,
                 previous_report=None)
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["run_succeeded"] is False and report["shards"] is None
    assert "Validation: **not run**" in (out / "report" / "report.md").read_text()
    assert find_previous_report(tmp_path / "root", "r2") is None
    assert os.path.isfile(out / "report" / "per_server.png")


def test_the_report_shows_where_the_workload_plan_is_on_its_path(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    plan, readiness = plan_and_readiness(40)
    step = {"full_context_cap": 63, "previous_cap": 63, "cap": 79, "target_cap": 80, "ceiling": None,
            "reason": "one step (+25%) from 63 toward 80", "settled": False}
    plan[0]["inputs"] = {"workload_mode": {"step": step, "rows": []}}
    brief = build_report(out, run_id="run", plan=plan, readiness=readiness, shard_results=None, validation=None,
                         previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    assert report["tuning"][0]["workload"] == step and report["tuning"][1]["workload"] is None
    assert "| 63 | 63 | 79 | 80 | - | one step (+25%) from 63 toward 80 |" in (out / "report" / "report.md").read_text()


def test_figures_from_simulated_servers_say_so(tmp_path):
    plan, readiness = plan_and_readiness(40)
    for item in readiness:
        item["simulated"] = True
    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    brief = build_report(out, run_id="sim", plan=plan, readiness=readiness, shard_results=None, validation=None,
                         previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    assert report["simulated"] is True
    assert "**Simulated fleet**" in Path(brief["report_md"]).read_text()
    _, real = report_of(tmp_path / "real", "real")
    assert real["simulated"] is False
    assert "Simulated" not in (tmp_path / "real" / "report" / "report.md").read_text()


def test_the_report_says_what_each_readback_measured_of_the_memory(tmp_path):
    plan, readiness = plan_and_readiness(40)
    line = ("NVIDIA B200|0.5.23|dense|tp1: the plan assumed 182,247 MiB pre-load free; its log says 22,118 MiB free "
            "before the weights; not a measure of the plan's memory: the server runs with --device cpu (no "
            "correction learnt)")
    readiness[1]["calibration"] = {"report_line": line}
    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    brief = build_report(out, run_id="run", plan=plan, readiness=readiness, shard_results=None, validation=None,
                         previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    described = readiness[1]["server"]
    assert {row["server"]: row["readback"] for row in report["tuning"]} == {
        item["server"]: (line if item["server"] == described else None) for item in readiness}
    markdown = Path(brief["report_md"]).read_text()
    assert f"- **{described}**: {line}" in markdown
    assert all(f"- **{item['server']}**" not in markdown for item in readiness if item["server"] != described)
