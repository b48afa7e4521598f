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


# Fast checks of build.py's figures: stats tables as load_stats gives them, reports built without drawing plots.
import pandas as pd  # noqa: E402
from validate_fixtures import T0, write_jsonl  # noqa: E402

from fleetgen.outputs import RunLayout  # noqa: E402
from fleetgen.report import build as build_module  # noqa: E402
from fleetgen.report.build import (_bucket_seconds, _delta, _load_previous, _net_of_dead_tries,  # noqa: E402
                                   _reuse_lookups, _server_gpus, _servers, _shards, _timeline, _tuning,
                                   compare_reports, summarize_stats)
from fleetgen.validation.stats_table import load_stats  # noqa: E402


def stats_of(tmp_path: Path, rows: list[dict], shards: int = 1) -> pd.DataFrame:
    return load_stats(write_run(tmp_path / "stats_run", rows, shards=shards))


def row(index: int, server: str, finished: float, tokens: int, latency: float = 1.0, **more) -> dict:
    return {"id": f"p{index:05d}", "prompt_tokens": 10 + index, "completion_tokens": tokens, "finish_reason": "stop",
            "reasoning_chars": 0, "content_chars": 1, "server": server, "latency_s": latency,
            "finished_at": T0 + finished, **more}


@pytest.fixture
def no_plots(monkeypatch):
    """build_report without matplotlib: the plots have their own tests."""
    monkeypatch.setattr(build_module, "write_plots", lambda report, folder: {})


@pytest.mark.parametrize("span, width", [(0.5, 1), (120, 1), (120.5, 2), (240, 2), (241, 5), (600, 5), (601, 10),
                                         (86_400 * 120, 86_400), (86_400 * 120 + 1, 86_401)])
def test_the_timeline_bucket_is_the_smallest_nice_width_that_keeps_120_buckets(span, width):
    assert _bucket_seconds(span) == width


def test_the_timeline_gives_tokens_per_second_in_buckets_longer_than_a_second(tmp_path):
    # 300 s span -> 5 s buckets: 1000 tokens finishing in one bucket are 200 tokens/s, not 1000
    rows = [row(0, "a", 1.0, 10, latency=1.0), row(1, "a", 7.0, 1000), row(2, "b", 8.0, 500),
            row(3, "b", 300.0, 250)]  # the last finish, exactly at the span's end, counts in the last bucket
    timeline = summarize_stats(stats_of(tmp_path, rows))["timeline"]
    assert timeline["start"] == T0 and timeline["bucket_seconds"] == 5.0
    assert len(timeline["overall"]) == 60
    assert timeline["overall"][:2] == [2.0, 300.0] and timeline["overall"][-1] == 50.0 and sum(timeline["overall"]) == 352
    assert timeline["per_server"]["a"][:2] == [2.0, 200.0] and sum(timeline["per_server"]["a"]) == 202
    assert timeline["per_server"]["b"][1] == 100.0 and timeline["per_server"]["b"][-1] == 50.0
    assert list(timeline["per_server"]) == ["a", "b"]


def test_a_timeline_shorter_than_a_second_has_one_bucket():
    frame = pd.DataFrame({"finished_at": [T0 + 0.2, T0 + 0.4], "completion_tokens": [3, 4],
                          "server": pd.Categorical(["a", "a"])})
    assert _timeline(frame, T0, 0.4) == {"start": T0, "bucket_seconds": 1.0, "overall": [7.0],
                                         "per_server": {"a": [7.0]}}


def test_throughput_per_server_adds_up_to_the_fleet_and_splits_over_its_gpus(tmp_path):
    rows = [row(0, "n1:30000", 10.0, 100, latency=10.0), row(1, "n1:30000", 20.0, 300, latency=2.0),
            row(2, "n2:30000", 30.0, 600, latency=5.0, finish_reason="length"),
            row(3, "other:1", 40.0, 200, latency=4.0)]
    gpus = {"n1:30000": {"host": "n1", "gpu_ids": [0]}, "n2:30000": {"host": "n2", "gpu_ids": [2, 3]},
            "other:1": {"host": "other", "gpu_ids": []}}
    summary = summarize_stats(stats_of(tmp_path, rows), server_gpus=gpus, max_tokens=600)
    assert summary["timing"] == {"first_start": T0, "last_finish": T0 + 40, "generation_seconds": 40.0,
                                 "wall_seconds": None, "basis": "first_start_to_last_finish"}
    assert summary["throughput"] == {"tokens_per_s": 30.0, "tokens_per_s_generation": 30.0,
                                     "tokens_per_s_wall": None, "completions_per_s": 0.1}
    n1, n2, other = (summary["per_server"][name] for name in ("n1:30000", "n2:30000", "other:1"))
    assert (n1["completions"], n1["completion_tokens"], n1["tokens_per_s"]) == (2, 400, 10.0)
    assert (n1["active_seconds"], n1["tokens_per_s_active"], n1["mean_latency_s"]) == (20.0, 20.0, 6.0)
    assert n1["p95_latency_s"] == round(2.0 + 0.95 * 8.0, 3) and n1["gpus"] == [0] and n1["length_share"] == 0.0
    assert (n2["tokens_per_s"], n2["active_seconds"], n2["length_share"], n2["gpus"]) == (15.0, 5.0, 1.0, [2, 3])
    assert other["gpus"] == [] and other["tokens_per_s"] == 5.0
    assert summary["per_gpu"] == {"n1:gpu0": {"server": "n1:30000", "completion_tokens": 400.0, "tokens_per_s": 10.0},
                                  "n2:gpu2": {"server": "n2:30000", "completion_tokens": 300.0, "tokens_per_s": 7.5},
                                  "n2:gpu3": {"server": "n2:30000", "completion_tokens": 300.0, "tokens_per_s": 7.5}}
    assert summary["length_share"] == 0.25 and summary["finish_reasons"] == {"stop": 3, "length": 1}
    assert summary["totals"] == {"completions": 4, "prompt_tokens": 10 + 11 + 12 + 13, "completion_tokens": 1200}
    assert summary["prompt_tokens"]["max"] == 13 and summary["prompt_tokens"]["mean"] == 11.5
    assert summary["prompt_tokens"]["p99"] == pytest.approx(12.97)


def test_measured_wall_time_is_the_headline_and_the_span_figure_stays(tmp_path):
    rows = [row(0, "a", 10.0, 100, latency=10.0), row(1, "a", 20.0, 300)]
    summary = summarize_stats(stats_of(tmp_path, rows), wall_seconds=40.0)
    assert summary["timing"]["basis"] == "wall_seconds" and summary["timing"]["wall_seconds"] == 40.0
    assert summary["throughput"] == {"tokens_per_s": 10.0, "tokens_per_s_generation": 20.0, "tokens_per_s_wall": 10.0,
                                     "completions_per_s": 0.05}


def test_token_statistics_and_a_histogram_that_keeps_rows_above_max_tokens(tmp_path):
    rows = [row(n, "a", 1.0 + n, tokens) for n, tokens in enumerate((64, 128, 640, 1280))]
    summary = summarize_stats(stats_of(tmp_path, rows), max_tokens=640)
    tokens = summary["completion_tokens"]
    assert (tokens["mean"], tokens["min"], tokens["p50"], tokens["max"]) == (528.0, 64.0, 384.0, 1280.0)
    assert tokens["p90"] == pytest.approx(1280 - 0.3 * 640) and tokens["p99"] == pytest.approx(1280 - 0.03 * 640)
    histogram = tokens["histogram"]
    assert histogram["edges"][0] == 0 and histogram["edges"][-1] == 1280 and len(histogram["counts"]) == 64
    assert histogram["edges"][1] == 20.0 and histogram["counts"][3] == 1 and histogram["counts"][-1] == 1
    assert sum(histogram["counts"]) == 4 and histogram["max_tokens"] == 640
    assert summarize_stats(stats_of(tmp_path / "b", rows[:2]), max_tokens=640)["completion_tokens"]["histogram"][
        "edges"][-1] == 640


def test_rows_without_tokens_count_as_completions_but_not_in_throughput(tmp_path):
    rows = [row(0, "a", 10.0, 100, latency=10.0), row(1, "a", 20.0, 100),
            row(2, "a", 500.0, None, finish_reason=None)]
    summary = summarize_stats(stats_of(tmp_path, rows))
    assert summary["totals"]["completions"] == 3 and summary["timing"]["last_finish"] == T0 + 20
    assert summary["finish_reasons"] == {"stop": 2, "null": 1}


def test_an_empty_stats_table_has_no_figures(tmp_path):
    summary = summarize_stats(stats_of(tmp_path, []))
    assert summary["timeline"] == {"start": None, "bucket_seconds": None, "overall": [], "per_server": {}}
    assert summary["throughput"] == {"tokens_per_s": 0.0, "tokens_per_s_generation": None, "tokens_per_s_wall": None,
                                     "completions_per_s": None}
    assert summary["completion_tokens"]["mean"] is None and summary["completion_tokens"]["histogram"]["counts"] == []
    assert summary["prompt_tokens"] == {"mean": None, "p99": None, "max": None} and summary["length_share"] is None
    assert summary["timing"]["first_start"] is None and summary["timing"]["generation_seconds"] == 0.0
    assert summary["timing"]["last_finish"] is None
    assert all(summary["completion_tokens"][stat] is None for stat in ("min", "p50", "p90", "p99", "max"))


def test_a_single_instant_completion_has_no_rate(tmp_path):
    summary = summarize_stats(stats_of(tmp_path, [row(0, "a", 5.0, 100, latency=0.0)]))
    assert summary["throughput"]["tokens_per_s_generation"] is None
    assert summary["per_server"]["a"]["tokens_per_s"] is None and summary["per_server"]["a"]["tokens_per_s_active"] is None
    assert summary["per_gpu"] == {}
    placed = summarize_stats(stats_of(tmp_path, [row(0, "a", 5.0, 100, latency=0.0)]),
                             server_gpus={"a": {"host": "n", "gpu_ids": [0, 1]}})
    assert placed["per_gpu"]["n:gpu1"] == {"server": "a", "completion_tokens": 50.0, "tokens_per_s": None}


def test_readiness_says_where_a_server_runs_over_the_plan():
    plan = [{"host": "n1", "port": 30000, "gpu_ids": [0, 1]}, {"host": "n2", "port": 30001, "gpu_ids": ["3"]}]
    readiness = [{"server": "n1:30000", "gpu_ids": [1]}, {"server": "n3:40000"}]
    assert _server_gpus(plan, readiness) == {"n1:30000": {"host": "n1", "gpu_ids": [1]},
                                             "n2:30001": {"host": "n2", "gpu_ids": [3]},
                                             "n3:40000": {"host": "n3", "gpu_ids": []}}
    assert _server_gpus(None, None) == {}


def test_the_tuning_rows_pair_the_plan_with_what_each_server_reported():
    plan, readiness = plan_and_readiness(16)
    readiness[2]["calibration"] = {"report_line": "readback"}
    plan[1]["inputs"] = {"workload_mode": {"step": {"cap": 3}}}
    extra = {**readiness[0], "server": "z:1", "host": "z", "port": 1}
    rows = _tuning(plan[:2] + plan[2:], readiness[1:] + [extra])
    assert [row["server"] for row in rows] == sorted(SERVERS) + ["z:1"]
    first = next(row for row in rows if row["server"] == SERVERS[0])
    assert (first["host"], first["port"], first["gpu_ids"]) == ("node-a", 30000, [0])
    assert first["flags"] == {"--max-mamba-cache-size": 200, "--mem-fraction-static": 0.93}
    assert first["effective"] == dict.fromkeys(("max_running_requests", "max_mamba_cache_size",
                                                 "max_total_num_tokens"))
    assert first["matches"] == dict.fromkeys(first["effective"]) and first["version"] is None
    second = next(row for row in rows if row["server"] == SERVERS[1])
    assert second["effective"] == {"max_running_requests": 16, "max_mamba_cache_size": 200,
                                   "max_total_num_tokens": 798_000}
    assert second["matches"] == {"max_running_requests": False, "max_mamba_cache_size": True,
                                 "max_total_num_tokens": True}
    assert second["workload"] == {"cap": 3} and second["version"] == "0.5.23" and second["readback"] is None
    third = next(row for row in rows if row["server"] == SERVERS[2])
    assert third["readback"] == "readback" and third["gpu_ids"] == [0, 1] and third["port"] == 30000
    unplanned = rows[-1]
    assert unplanned["expected"] == dict.fromkeys(unplanned["expected"]) and unplanned["flags"] == {}
    assert unplanned["effective"]["max_running_requests"] == 16 and unplanned["host"] == "z"
    assert (unplanned["port"], unplanned["gpu_ids"], unplanned["version"]) == (1, [0], "0.5.23")
    assert unplanned["matches"]["max_running_requests"] is None


def test_kept_and_relaunched_servers():
    readiness = [{"server": "c", "kept": True}, {"server": "a", "kept": True}, {"server": "b", "kept": False},
                 {"server": "d"}]
    assert _servers(readiness) == {"kept": 2, "relaunched": 2, "kept_servers": ["a", "c"],
                                   "relaunched_servers": ["b", "d"]}
    assert _servers(None) == {"kept": 0, "relaunched": 0, "kept_servers": [], "relaunched_servers": []}


def test_reuse_lookups_of_several_shards_add_up():
    shards = [{"reuse": {"source": "night2", "regenerated": {"torn": 2, "gone": 1},
                         "skipped": [{"run": "night1", "reason": "first"}], "changed": None}},
              {"reuse": None},
              {"reuse": {"source": "night0", "regenerated": {"torn": "3"},
                         "skipped": [{"run": "night1", "reason": "second"}, {"run": "a", "reason": "x"}],
                         "changed": {"run": "r", "parts": ["p"]}}},
              {"reuse": {"source": "night2", "changed": {"run": "later", "parts": []}}}]
    assert _reuse_lookups(shards) == {"source_runs": ["night0", "night2"], "regenerated": {"torn": 5, "gone": 1},
                                      "passed_over": [{"run": "a", "reason": "x"}, {"run": "night1", "reason": "first"}],
                                      "changed": {"run": "r", "parts": ["p"]}}
    assert _reuse_lookups(None) == {"source_runs": [], "regenerated": {}, "passed_over": [], "changed": None}


def test_shard_results_of_a_run_with_shard_zero_and_missing_figures():
    results = [{"shard_id": 0, "done": 5, "failed": 1, "seconds": 2.5, "extra": 1},
               {"shard_id": 1, "done": None, "failed": None, "seconds": None}, {"shard_id": 2, "done": 3, "seconds": 4.0}]
    shards = _shards(results)
    assert {key: shards[key] for key in ("count", "done", "failed", "seconds_max", "seconds_total")} == {
        "count": 3, "done": 8, "failed": 1, "seconds_max": 4.0, "seconds_total": 6.5}
    assert shards["items"][0] == {"shard_id": 0, "done": 5, "failed": 1, "left": None, "prompt_tokens": None,
                                  "completion_tokens": None, "seconds": 2.5}
    assert _shards(None) is None and _shards([])["seconds_max"] == 0.0
    assert _shards([{"seconds": 1.23456}, {"seconds": 2.0}])["seconds_total"] == 3.235
    assert len(_shards([{"shard_id": n} for n in range(600)])["items"]) == 500


def test_deltas_with_a_previous_value_of_zero_or_none():
    assert _delta(4, 5) == {"previous": 4, "current": 5, "delta": 1, "delta_pct": 25.0}
    assert _delta(0, 5) == {"previous": 0, "current": 5, "delta": 5, "delta_pct": None}
    assert _delta(None, 5)["delta"] is None and _delta(5, None)["delta_pct"] is None
    assert _delta(3, 1)["delta_pct"] == -66.67


def small_report(tokens_per_s: float, caps: dict[str, int | None], servers: dict[str, float]) -> dict:
    return {"run_id": "r", "throughput": {"tokens_per_s": tokens_per_s, "tokens_per_s_generation": tokens_per_s},
            "totals": {"completions": 10, "completion_tokens": 100}, "timing": {"generation_seconds": 10.0},
            "length_share": 0.1, "completion_tokens": {"mean": 10.0, "p50": 9.0, "p90": 12.0, "p99": 15.0},
            "tuning": [{"server": server, "effective": {"max_running_requests": cap, "max_mamba_cache_size": 1,
                                                        "max_total_num_tokens": 10}} for server, cap in caps.items()],
            "per_server": {server: {"tokens_per_s": value} for server, value in servers.items()}}


def test_the_comparison_covers_servers_of_either_run_and_a_fleet_total_only_when_every_cap_is_known():
    previous = small_report(100.0, {"a": 10, "b": 20}, {"a": 60.0, "b": 40.0})
    current = small_report(150.0, {"a": 30, "c": None}, {"a": 150.0})
    comparison = compare_reports(current, previous, "/p.json")
    assert (comparison["available"], comparison["previous_run_id"], comparison["previous_report"]) == (
        True, "r", "/p.json")
    assert comparison["metrics"]["tokens_per_s"] == {"previous": 100.0, "current": 150.0, "delta": 50.0,
                                                     "delta_pct": 50.0}
    assert set(comparison["metrics"]) == {"tokens_per_s", "tokens_per_s_generation", "completions",
                                          "completion_tokens", "generation_seconds", "length_share",
                                          "completion_tokens_mean", "completion_tokens_p50", "completion_tokens_p90",
                                          "completion_tokens_p99", "gpu_hours_per_million_tokens",
                                          "cost_per_million_tokens"}
    assert comparison["metrics"]["completion_tokens_p90"]["delta"] == 0
    assert comparison["fleet_caps"]["max_running_requests"] == {"previous": 30, "current": None, "delta": None,
                                                                "delta_pct": None}
    assert comparison["fleet_caps"]["max_total_num_tokens"]["current"] == 20
    assert comparison["caps"]["b"]["max_running_requests"] == {"previous": 20, "current": None, "delta": None,
                                                               "delta_pct": None}
    assert comparison["caps"]["a"]["max_running_requests"]["delta"] == 20 and list(comparison["caps"]) == ["a", "b", "c"]
    assert comparison["per_server_tokens_per_s"] == {
        "a": {"previous": 60.0, "current": 150.0, "delta": 90.0, "delta_pct": 150.0},
        "b": {"previous": 40.0, "current": None, "delta": None, "delta_pct": None}}
    empty = compare_reports(small_report(1.0, {}, {}), small_report(1.0, {}, {}))
    assert empty["fleet_caps"]["max_running_requests"]["previous"] is None


def test_the_comparison_gives_gpu_hours_per_million_tokens_and_their_cost_only_in_one_currency():
    previous, current = small_report(100.0, {}, {}), small_report(100.0, {}, {})
    previous["gpu_hours"] = {"gpu_hours_per_million_tokens": 0.5, "cost_per_million_tokens": 3.0, "currency": "USD"}
    current["gpu_hours"] = {"gpu_hours_per_million_tokens": 0.4, "cost_per_million_tokens": 2.4, "currency": "USD"}
    metrics = compare_reports(current, previous)["metrics"]
    assert metrics["gpu_hours_per_million_tokens"] == {"previous": 0.5, "current": 0.4, "delta": -0.1,
                                                       "delta_pct": -20.0}
    assert metrics["cost_per_million_tokens"]["delta"] == -0.6
    current["gpu_hours"]["currency"] = "EUR"
    assert compare_reports(current, previous)["metrics"]["cost_per_million_tokens"] == {
        "previous": None, "current": 2.4, "delta": None, "delta_pct": None}
    del previous["gpu_hours"]  # a report from before GPU-hours were counted
    assert compare_reports(current, previous)["metrics"]["gpu_hours_per_million_tokens"]["previous"] is None


def test_the_comparison_of_the_length_share_and_of_reports_without_tuning():
    previous, current = small_report(100.0, {}, {}), small_report(100.0, {}, {})
    del previous["tuning"], current["tuning"]
    current["length_share"] = 0.25
    comparison = compare_reports(current, previous)
    assert comparison["metrics"]["length_share"] == {"previous": 0.1, "current": 0.25, "delta": 0.15, "delta_pct": 150.0}
    assert comparison["caps"] == {} and comparison["previous_report"] is None


def test_a_previous_report_of_another_schema_or_not_an_object_is_not_compared(tmp_path, caplog):
    assert _load_previous(None) == (None, None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 0}))
    with caplog.at_level("WARNING", logger="fleetgen.report.build"):
        assert _load_previous(old) == (None, {"available": False, "previous_report": str(old),
                                              "reason": "schema 0, expected 1"})
    assert caplog.messages == [f"previous report {old} not usable, no comparison: schema 0, expected 1"]
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    assert _load_previous(listed)[1]["available"] is False
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema": 1, "run_id": "x"}))
    assert _load_previous(good) == ({"schema": 1, "run_id": "x"}, None)


def test_dead_tries_are_taken_out_of_the_span_once_when_they_overlap():
    report = {"timing": {"first_start": 100.0, "last_finish": 200.0, "generation_seconds": 100.0},
              "throughput": {}, "totals": {"completion_tokens": 6000}}
    _net_of_dead_tries(report, [{"dead_since_s": 110.0, "resumed_s": 130.0}, {"dead_since_s": 120.0, "resumed_s": 140.0}])
    assert report["timing"]["dead_seconds"] == 30.0 and report["timing"]["lost_tries"] == 2
    assert report["throughput"]["tokens_per_s_net_of_dead_time"] == round(6000 / 70, 2)
    _net_of_dead_tries(report, [{"dead_since_s": 0.0, "resumed_s": 300.0}])
    assert report["throughput"]["tokens_per_s_net_of_dead_time"] is None and report["timing"]["lost_tries"] == 1
    report["timing"].update(last_finish=200.5, generation_seconds=100.5)  # half a second was live
    _net_of_dead_tries(report, [{"dead_since_s": 100.0, "resumed_s": 200.0}])
    assert report["throughput"]["tokens_per_s_net_of_dead_time"] == 12000.0
    _net_of_dead_tries(report, [{"dead_since_s": 110.0, "resumed_s": 120.12345}])
    assert report["timing"]["dead_seconds"] == 10.123


def test_a_built_report_leaves_reused_completions_out_of_tonights_figures(tmp_path, no_plots):
    rows = [row(0, SERVERS[0], 10.0, 100, latency=10.0), row(1, SERVERS[1], 20.0, 300),
            row(2, SERVERS[0], -5000.0, 999, reused_from="night1"), row(3, SERVERS[0], -5000.0, 5, reused_from="n0"),
            row(4, SERVERS[1], 20.0, 0)]
    failed = {**error_row("p9", SERVERS[1]), "error": {"code": "http_500", "message": "m"}}  # codes are strings
    out = write_run(tmp_path / "run", rows, errors=[failed, failed, {**error_row("p8"), "error": {}, "server": None}])
    layout = RunLayout(out)
    write_jsonl(layout.shard_file("shards", 0).with_name("shard-00000.lost.jsonl"),
                [{"dead_since_s": T0 + 5, "resumed_s": T0 + 15}])
    write_jsonl(layout.shard_file("metrics", 0), [{"t": T0 + t, "server": SERVERS[0], "cap": 10, "running": 4}
                                                  for t in (0, 10, 30)])
    write_jsonl(layout.shard_file("events", 0), [
        {"at": "x", "t": T0 + 1, "shard": 0, "event": "down", "server": SERVERS[0], "reason": "r"},
        {"at": "y", "t": T0 + 17, "shard": 0, "event": "recovered", "server": SERVERS[0], "down_s": 16.0}])
    write_jsonl(layout.shard_file("gpu", 0), [{"t": T0 + t, "node": "node-a", "gpu": 0, "util": 1.0,
                                               "power_w": 100.0, "mem_mib": 1.0} for t in (0, 50)])
    plan, readiness = plan_and_readiness(40)
    readiness[1]["simulated"] = True
    validation = {"success": True, "thresholds": {"max_tokens": 777}, "expectations": []}
    brief = build_report(out, run_id="night2", plan=plan, readiness=readiness, shard_results=[{"shard_id": 0, "reuse": {"source": "night1"}}],
                         validation=validation, previous_report=None, wall_seconds=None)
    report = json.loads((out / "report" / "report.json").read_text())
    assert (report["schema"], report["run_id"], report["out_dir"], report["run_succeeded"]) == (1, "night2", str(out),
                                                                                                True)
    assert report["reuse"]["reused"] == 2 and report["reuse"]["generated"] == 3
    assert report["generated_at"].endswith("+00:00")
    assert report["reuse"]["from_runs"] == {"night1": 1, "n0": 1}
    assert report["totals"]["completion_tokens"] == 400 and report["timing"]["generation_seconds"] == 20.0
    assert report["totals"]["completions"] == 3
    assert report["completion_tokens"]["histogram"]["max_tokens"] == 777
    assert report["errors"] == {"records": 3, "prompts": 2, "by_code": {"http_500": 2, "none": 1},
                                "per_server": {SERVERS[1]: 2, "unknown": 1}}
    assert report["timing"]["dead_seconds"] == 10.0 and report["throughput"]["tokens_per_s_net_of_dead_time"] == 40.0
    assert report["simulated"] is True and report["plots"] == {} and report["shards"]["count"] == 1
    assert report["occupancy"]["per_server"][SERVERS[0]]["samples"] == 2  # the sample at T0 + 30 is after the span
    assert "down for 16 s of the 10 s span" in report["occupancy"]["per_server"][SERVERS[0]]["low"]
    assert report["gpus"]["seconds"] == 20.0 and report["gpus"]["energy_j"] == 2000.0
    assert report["gpus"]["joules_per_million_tokens"] == 2000.0 / 400 * 1e6
    assert report["reuse"]["source_runs"] == ["night1"]
    assert report["tuning"][0]["expected"]["max_running_requests"] == 40
    assert report["per_server"][SERVERS[0]]["gpus"] == [0] and report["validation"] == validation
    assert report["servers"]["relaunched"] == 3 and report["failures"]["down_events"] == 1
    assert brief == {"report_json": str(out / "report" / "report.json"), "report_md": str(out / "report" / "report.md"),
                     "tokens_per_s": 20.0, "basis": "first_start_to_last_finish",
                     "per_server": {SERVERS[0]: 5.0, SERVERS[1]: 15.0},
                     "per_gpu": {"node-a:gpu0": 5.0, "node-a:gpu1": 15.0}, "comparison": None}
    assert (out / "report" / "report.md").read_text().startswith("# Generation run night2\n")
    assert report["generated_at_epoch"] == pytest.approx(
        __import__("datetime").datetime.fromisoformat(report["generated_at"]).timestamp(), abs=1)


def test_the_brief_carries_the_comparison_with_the_previous_run(tmp_path, no_plots):
    plan, readiness = plan_and_readiness(40)
    first = write_run(tmp_path / "night1", [row(0, SERVERS[0], 10.0, 100, latency=10.0)])
    build_report(first, run_id="night1", plan=plan, readiness=readiness, shard_results=None,
                 validation={"success": True}, previous_report=None)
    second = write_run(tmp_path / "night2", [row(0, SERVERS[0], 10.0, 200, latency=10.0)])
    brief = build_report(second, run_id="night2", plan=plan, readiness=readiness, shard_results=None, validation=None,
                         previous_report=first / "report" / "report.json", wall_seconds=5.0)
    assert brief["basis"] == "wall_seconds" and brief["tokens_per_s"] == 40.0
    assert brief["comparison"] == {
        "previous_run_id": "night1",
        "tokens_per_s": {"previous": 10.0, "current": 40.0, "delta": 30.0, "delta_pct": 300.0},
        "tokens_per_s_generation": {"previous": 10.0, "current": 20.0, "delta": 10.0, "delta_pct": 100.0},
        "completion_tokens_mean": {"previous": 100.0, "current": 200.0, "delta": 100.0, "delta_pct": 100.0},
        "fleet_max_running_requests": {"previous": 120, "current": 120, "delta": 0, "delta_pct": 0.0}}
    report = json.loads((second / "report" / "report.json").read_text())
    assert report["comparison"]["previous_report"] == str(first / "report" / "report.json")
    assert report["run_succeeded"] is False
    unusable = build_report(second, run_id="night2", plan=plan, readiness=readiness, shard_results=None,
                            validation=None, previous_report=tmp_path / "absent.json")
    assert unusable["comparison"]["available"] is False


def test_deltas_are_kept_to_six_decimals():
    assert _delta(0.0, 0.12345678)["delta"] == 0.123457
    assert _delta(0.1, 0.30000000001)["delta"] == 0.2


def test_a_server_new_tonight_and_a_previous_report_without_per_server_figures_are_compared():
    previous = small_report(100.0, {"a": 10}, {"a": 60.0})
    current = small_report(150.0, {"a": 10}, {"a": 100.0, "new": 50.0})
    assert compare_reports(current, previous)["per_server_tokens_per_s"] == {
        "a": {"previous": 60.0, "current": 100.0, "delta": 40.0, "delta_pct": 66.67},
        "new": {"previous": None, "current": 50.0, "delta": None, "delta_pct": None}}
    del previous["per_server"]  # an older report
    assert compare_reports(current, previous)["per_server_tokens_per_s"]["a"] == {
        "previous": None, "current": 100.0, "delta": None, "delta_pct": None}


def test_where_servers_run_comes_from_the_plan_or_from_readiness_alone(tmp_path, no_plots):
    plan, readiness = plan_and_readiness(40)
    out = write_run(tmp_path / "run", [row(0, SERVERS[2], 10.0, 100, latency=10.0)])
    from_plan = build_report(out, run_id="r", plan=plan, readiness=None, shard_results=None, validation=None,
                             previous_report=None)
    assert from_plan["per_gpu"] == {"node-b:gpu0": 5.0, "node-b:gpu1": 5.0}
    from_readiness = build_report(out, run_id="r", plan=None, readiness=readiness, shard_results=None,
                                  validation=None, previous_report=None)
    assert from_readiness["per_gpu"] == {"node-b:gpu0": 5.0, "node-b:gpu1": 5.0}


def test_a_run_folder_that_does_not_exist_yet_gets_its_report_folder(tmp_path, no_plots):
    out = tmp_path / "not" / "yet"
    brief = build_report(out, run_id="r", plan=None, readiness=None, shard_results=None, validation=None,
                         previous_report=None)
    assert Path(brief["report_json"]).is_file() and brief["tokens_per_s"] == 0.0


def test_a_run_without_completions_still_reports_its_samples_over_their_own_span(tmp_path, no_plots):
    out = write_run(tmp_path / "run", [])
    write_jsonl(RunLayout(out).shard_file("metrics", 0), [{"t": T0 + t, "server": "a", "cap": 4, "running": 4}
                                                         for t in (0, 10)])
    write_jsonl(RunLayout(out).shard_file("gpu", 0), [{"t": T0 + t, "node": "n", "gpu": 0, "util": 1.0,
                                                       "power_w": 10.0, "mem_mib": 1.0} for t in (0, 10)])
    build_report(out, run_id="r", plan=None, readiness=None, shard_results=None, validation=None,
                 previous_report=None)
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["occupancy"]["per_server"]["a"]["span_s"] == 10.0 and report["occupancy"]["fleet_occupancy"] == 1.0
    assert report["gpus"]["seconds"] == 10.0 and report["gpus"]["energy_j"] == 100.0


def test_the_report_is_drawn_into_its_folder_written_indented_and_logged(tmp_path, monkeypatch, caplog):
    drawn = []
    monkeypatch.setattr(build_module, "write_plots",
                        lambda report, folder: drawn.append((report["run_id"], folder)) or {"per_server": "p.png"})
    out = write_run(tmp_path / "run", [row(0, "a", 10.0, 100, latency=10.0), row(1, "a", 10.0, 50)])
    with caplog.at_level("INFO", logger="fleetgen.report.build"):
        build_report(out, run_id="r", plan=None, readiness=None, shard_results=None, validation=None,
                     previous_report=None)
    assert drawn == [("r", out / "report")]
    text = (out / "report" / "report.json").read_text()
    assert text.startswith('{\n  "schema": 1,\n  "run_id": "r",') and text.endswith("}\n")
    assert json.loads(text)["plots"] == {"per_server": "p.png"}
    assert f"report {out / 'report' / 'report.json'}: 15.0 completion tokens/s (first_start_to_last_finish), " \
           "2 completions" in caplog.messages


def test_figures_keep_the_precision_the_report_shows_and_servers_are_listed_by_name(tmp_path):
    # "b" answers first; figures with many decimals show whether each keeps its own precision
    rows = [row(0, "b", 1.0, 200, latency=1.0), row(1, "a", 1.5, 100, latency=1.0),
            row(2, "a", 2.2345, 50, latency=1.2346, finish_reason="length"), row(3, "a", 1.5, 10, latency=0.5),
            row(4, "b", 2.5, 7, latency=0.5), row(5, "b", 3.3456, 16, latency=0.5)]
    stats = stats_of(tmp_path, rows)
    summary = summarize_stats(stats, server_gpus={"b": {"host": "n", "gpu_ids": [0, 1, 2]}})
    assert summary["timing"]["generation_seconds"] == 3.346
    assert summary["throughput"] == {"tokens_per_s": 114.48, "tokens_per_s_generation": 114.48,
                                     "tokens_per_s_wall": None, "completions_per_s": 1.793}
    assert summary["length_share"] == 0.166667
    assert list(summary["per_server"]) == ["a", "b"]
    a, b = summary["per_server"]["a"], summary["per_server"]["b"]
    assert (a["tokens_per_s"], a["active_seconds"], a["tokens_per_s_active"]) == (47.82, 1.734, 92.25)
    assert (a["mean_latency_s"], a["p95_latency_s"], a["length_share"]) == (0.912, 1.211, 0.333333)
    assert (b["tokens_per_s"], b["active_seconds"], b["tokens_per_s_active"]) == (66.65, 3.346, 66.65)
    assert summary["per_gpu"]["n:gpu2"] == {"server": "b", "completion_tokens": 223 / 3, "tokens_per_s": 22.22}
    walled = summarize_stats(stats, wall_seconds=7.0)["throughput"]
    assert walled == {"tokens_per_s": 54.71, "tokens_per_s_generation": 114.48, "tokens_per_s_wall": 54.71,
                      "completions_per_s": 0.857}


def test_a_run_shorter_than_a_second_still_has_its_rates(tmp_path):
    rows = [row(0, "a", 0.5, 100, latency=0.25), row(1, "a", 0.75, 50, latency=0.25)]
    summary = summarize_stats(stats_of(tmp_path, rows))
    assert summary["timing"]["generation_seconds"] == 0.5
    assert summary["throughput"]["tokens_per_s"] == 300.0 and summary["throughput"]["tokens_per_s_generation"] == 300.0
    assert summary["per_server"]["a"]["tokens_per_s"] == 300.0
    assert (summary["per_server"]["a"]["active_seconds"], summary["per_server"]["a"]["tokens_per_s_active"]) == (
        0.5, 300.0)


def test_a_row_without_a_latency_started_when_it_finished(tmp_path):
    rows = [row(0, "a", 10.0, 100, latency=None), row(1, "a", 20.0, 100, latency=5.0)]
    summary = summarize_stats(stats_of(tmp_path, rows))
    assert summary["timing"]["first_start"] == T0 + 10.0 and summary["timing"]["generation_seconds"] == 10.0
    assert summary["per_server"]["a"]["active_seconds"] == 10.0 and summary["throughput"]["tokens_per_s"] == 20.0


def test_servers_without_known_gpus_do_not_hide_the_per_gpu_figures_of_the_others(tmp_path):
    rows = [row(0, "a-unplanned:1", 10.0, 100, latency=10.0), row(1, "n1:30000", 20.0, 300)]
    gpus = {"n1:30000": {"host": "n1", "gpu_ids": [0]}}
    summary = summarize_stats(stats_of(tmp_path, rows), server_gpus=gpus)
    assert summary["per_gpu"] == {"n1:gpu0": {"server": "n1:30000", "completion_tokens": 300.0, "tokens_per_s": 15.0}}


def test_a_histogram_of_empty_completions_spans_one_token(tmp_path):
    summary = summarize_stats(stats_of(tmp_path, [row(n, "a", 1.0 + n, 0) for n in range(3)]))
    histogram = summary["completion_tokens"]["histogram"]
    assert histogram["edges"][0] == 0.0 and histogram["edges"][-1] == 1.0 and histogram["counts"][0] == 3
    assert histogram["max_tokens"] is None


def test_every_server_has_a_value_in_every_timeline_bucket_in_tenths_of_a_token_per_second(tmp_path):
    # a 1500 s span -> 15 s buckets: 10 tokens in the first are 0.7 tokens/s, 1000 in the last 66.7
    rows = [row(0, "a", 1.0, 10, latency=1.0), row(1, "b", 1500.0, 1000)]
    timeline = summarize_stats(stats_of(tmp_path, rows))["timeline"]
    assert timeline["bucket_seconds"] == 15.0 and len(timeline["overall"]) == 100
    assert timeline["overall"][0] == 0.7 and timeline["overall"][-1] == 66.7
    assert [len(series) for series in timeline["per_server"].values()] == [100, 100]
    assert timeline["per_server"]["a"][0] == 0.7 and timeline["per_server"]["b"][-1] == 66.7


def test_readiness_named_by_server_or_by_host_and_port_pairs_with_the_plan():
    plan, readiness = plan_and_readiness(16)
    by_server = {key: value for key, value in readiness[0].items() if key not in ("host", "port")}
    by_host_and_port = {key: value for key, value in readiness[1].items() if key != "server"}
    rows = _tuning(plan[:2], [by_server, by_host_and_port])
    assert [row["server"] for row in rows] == list(SERVERS[:2])
    assert all(row["effective"]["max_running_requests"] == 16 for row in rows)
    assert all(row["matches"]["max_running_requests"] is False for row in rows)


def test_a_bare_plan_entry_and_a_bare_readiness_entry_still_make_whole_tuning_rows():
    planned, unplanned = _tuning([{"host": "n1", "port": 30000}], [{"server": "z:1"}])
    assert planned == {"server": "n1:30000", "host": "n1", "port": 30000, "gpu_ids": [], "flags": {},
                       "expected": dict.fromkeys(build_module.CAP_KEYS),
                       "effective": dict.fromkeys(build_module.CAP_KEYS), "version": None, "readback": None,
                       "workload": None, "matches": dict.fromkeys(build_module.CAP_KEYS)}
    assert (unplanned["server"], unplanned["host"], unplanned["port"], unplanned["gpu_ids"]) == ("z:1", None, None, [])
    assert unplanned["flags"] == {} and unplanned["expected"] == dict.fromkeys(build_module.CAP_KEYS)


def test_the_report_lists_the_nodes_the_plan_left_out_and_why(tmp_path):
    from fleetgen.outputs import RunLayout
    from fleetgen.tuning.plan_notes import write_plan_notes

    out = write_run(tmp_path / "run", [good_row(index) for index in range(30)])
    write_plan_notes(RunLayout(out), nodes_left_out={"node1": "cannot reach the node"}, long_prompt=None)
    plan, readiness = plan_and_readiness(40)
    brief = build_report(out, run_id="run", plan=plan, readiness=readiness, shard_results=None, validation=None,
                         previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    assert report["plan_notes"] == {"nodes_left_out": [{"node": "node1", "reason": "cannot reach the node"}],
                                    "long_prompt": None}
    assert "| node1 | cannot reach the node |" in Path(brief["report_md"]).read_text()


def test_a_report_of_a_run_whose_validation_failed_says_it_is_not_validated_nor_indexed(tmp_path):
    out = write_run(tmp_path / "root" / "r1", [good_row(index) for index in range(30)])
    plan, readiness = plan_and_readiness(40)
    failed = {"success": False, "failed_expectations": ["missing_prompts"], "expectations": []}
    brief = build_report(out, run_id="r1", plan=plan, readiness=readiness, shard_results=None, validation=failed,
                         previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    assert report["run_succeeded"] is False
    assert report["not_validated"].startswith("its validation did not pass (1 expectation(s) failed: missing_prompts")
    markdown = Path(brief["report_md"]).read_text()
    assert "Validation: **FAILED**" in markdown
    assert f"> **Not validated**: {report['not_validated']}. Its completions are not indexed" in markdown
    passed = build_report(out, run_id="r1", plan=plan, readiness=readiness, shard_results=None,
                          validation={"success": True, "expectations": []}, previous_report=None)
    assert json.loads(Path(passed["report_json"]).read_text())["not_validated"] is None
    assert "Not validated" not in Path(passed["report_md"]).read_text()


def test_a_built_report_prices_the_gpu_hours_each_server_held_from_its_recorded_launch_and_release(tmp_path,
                                                                                                   no_plots):
    from fleetgen.outputs import record_server_time
    from fleetgen.report.prices import GpuHourPrice

    rows = [row(0, SERVERS[0], 10.0, 100, latency=10.0), row(1, SERVERS[1], 20.0, 300),
            row(2, SERVERS[0], -5000.0, 999, reused_from="night1")]  # copied: none of tonight's GPU time
    out = write_run(tmp_path / "run", rows)
    plan, readiness = plan_and_readiness(40)
    for entry in plan:  # the probe's rows of each server's GPUs, as derive_plan keeps them
        entry["inputs"] = {"gpus": [{"index": gpu, "name": "NVIDIA B200"} for gpu in entry["gpu_ids"]]}
    for server in SERVERS:
        for event, at in (("launched", -360.0), ("ready", -10.0), ("stopped", 3240.0)):  # held one hour
            record_server_time(RunLayout(out), server, event, at=T0 + at)
    build_report(out, run_id="night2", plan=plan, readiness=readiness, shard_results=None, validation=None,
                 previous_report=None, gpu_hour_price=GpuHourPrice(currency="USD", per_gpu_hour={"NVIDIA B200": 2.0}))
    report = json.loads((out / "report" / "report.json").read_text())
    cost = report["gpu_hours"]
    assert cost["gpu_hours"] == {"held": 4.0, "loading": 0.388889, "generating": 0.003056, "idle": 3.608056}
    assert (cost["cost"], cost["completion_tokens"], cost["cost_per_million_tokens"]) == (8.0, 400, 20000.0)
    assert cost["per_server"][SERVERS[0]]["seconds"]["generating"] == 10.0 and \
        cost["per_server"][SERVERS[2]]["gpu_hours"]["held"] == 2.0  # tensor parallel over two GPUs
    markdown = (out / "report" / "report.md").read_text()
    assert "## GPU-hours and cost" in markdown and "Cost: **8.00 USD**; **20,000.00 USD per million output " \
                                                  "tokens**." in markdown
    assert build_report(out, run_id="night2", plan=plan, readiness=readiness, shard_results=None, validation=None,
                        previous_report=None) and json.loads((out / "report" / "report.json").read_text())[
        "gpu_hours"]["cost"] is None  # no price given: GPU-hours only


def test_a_trial_shard_finished_by_a_generate_shard_task_is_one_shard_whose_prompts_count_once_each():
    # the trial's time cap left 40 of shard 0's 100 prompts; generate_shard did those, skipping the 60 done
    results = [{"shard_id": 0, "done": 60, "failed": 0, "left": 40, "seconds": 30.0},
               {"shard_id": 0, "done": 40, "failed": 0, "skipped_already_done": 60, "seconds": 9.0},
               {"shard_id": 1, "done": 100, "failed": 2, "seconds": 20.0}]
    shards = _shards(results)
    assert (shards["count"], shards["done"], shards["failed"]) == (2, 200, 2)
    assert [item["left"] for item in shards["items"]] == [40, None, None]


def test_a_built_report_gives_the_end_of_the_job_per_gpu_of_each_server_where_the_plan_places_it(tmp_path, no_plots):
    plan, _ = plan_and_readiness(8)
    out = write_run(tmp_path / "run", [good_row(index) for index in range(ROWS)])
    # node-b:30000 runs on 2 GPUs: at its batch of 8 to T0 + 30, empty at T0 + 60 (test_drain.py's server), its
    # rows over two shards; node-a:30000 never reached its batch; a row of node-a:30001 has no counters
    table = [(0, 8, 4, 0, 0), (10, 8, 4, 700, 8), (20, 8, 2, 1700, 18), (30, 8, 0, 2700, 28), (40, 5, 0, 3000, 31),
             (50, 2, 0, 3300, 34), (60, 0, 0, 3600, 36)]
    rows = [{"t": T0 + t, "server": "node-b:30000", "cap": 8, "running": running, "queue": queue,
             "generation_tokens": tokens, "requests": requests} for t, running, queue, tokens, requests in table]
    rows += [{"t": T0 + 5.0, "server": "node-a:30000", "cap": 8, "running": 3, "queue": 0, "generation_tokens": 10,
              "requests": 1}, {"t": T0 + 5.0, "server": "node-a:30001", "cap": 8, "running": 8}]
    write_jsonl(RunLayout(out).shard_file("metrics", 0), rows[0::2])
    write_jsonl(RunLayout(out).shard_file("metrics", 1), rows[1::2])
    build_report(out, run_id="r", plan=plan, readiness=None, shard_results=None, validation=None,
                 previous_report=None)
    drain = json.loads((out / "report" / "report.json").read_text())["drain"]
    server = drain["per_server"]["node-b:30000"]
    # 900 tokens in 30 s on 2 GPUs; steady 2,000 tokens in 20 s on 2 GPUs
    assert (server["gpus"], server["tokens_per_s_per_gpu"], server["steady_tokens_per_s_per_gpu"]) == (2, 15.0, 50.0)
    assert list(drain["per_server"]) == ["node-b:30000"] and list(drain["unmeasured"]) == ["node-a:30000"]
    assert drain["fleet"]["gpu_time_share"] == 0.5
    markdown = (out / "report" / "report.md").read_text()
    assert "## End of the job" in markdown and "| node-b:30000 | 2 | 30.0 | 50.0% | 900 | 15 / 50 | 5.0 / 8 (62.5%) |" \
        in markdown
