"""The report's occupancy and failures sections, from the metrics and events the shards recorded."""

from __future__ import annotations

import json
from pathlib import Path

from report_fixtures import ROWS, report_of
from validate_fixtures import SERVERS, T0, good_row, write_jsonl, write_run

from fleetgen.outputs import RunLayout
from fleetgen.report.build import build_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metric_rows(server: str, running: float, *, cap: int = 40, queue: float = 0.0, token_usage: float = 0.1,
                sent: float = 50.0, count: int = 10) -> list[dict]:
    return [{"t": T0 + 3 + 2 * n, "server": server, "cap": cap, "running": running, "queue": queue,
             "token_usage": token_usage, "accept_length": 3.1, "sent": sent} for n in range(count)]


def run_with_series(tmp_path: Path, metrics: dict[int, list[dict]], events: dict[int, list[dict]] = ()) -> Path:
    out = write_run(tmp_path / "run", [good_row(index) for index in range(ROWS)])
    layout = RunLayout(out)
    for shard, rows in metrics.items():
        write_jsonl(layout.shard_file("metrics", shard), rows)
    for shard, rows in dict(events).items():
        write_jsonl(layout.shard_file("events", shard), rows)
    return out


def test_occupancy_per_server_and_fleet_with_the_likely_reason_of_a_low_one(tmp_path):
    a, b, c = SERVERS
    out = run_with_series(tmp_path, {
        0: metric_rows(a, 38) + metric_rows(b, 8, queue=12, token_usage=0.97),  # KV pool full
        1: metric_rows(a, 40) + metric_rows(c, 4, sent=4)})  # the client sent too little
    _, report = report_of(out, "run")
    occupancy = report["occupancy"]
    rows = occupancy["per_server"]
    assert rows[a]["occupancy"] == round(39 / 40, 4) and "low" not in rows[a]
    assert rows[b]["occupancy"] == 0.2 and "KV cache full" in rows[b]["low"]
    assert rows[c]["occupancy"] == 0.1 and "client kept too few" in rows[c]["low"]
    assert occupancy["fleet_occupancy"] == round((39 + 8 + 4) / 120, 4)
    assert rows[a]["accept_length_mean"] == 3.1 and rows[b]["queue_mean"] == 12
    markdown = (out / "report" / "report.md").read_text()
    assert "## Occupancy" in markdown and f"**{(39 + 8 + 4) / 120 * 100:.1f} %**" in markdown
    assert f"- **{b}**: KV cache full" in markdown
    assert (out / "report" / report["plots"]["occupancy"]).read_bytes().startswith(PNG_MAGIC)


def test_samples_outside_the_generation_span_do_not_count(tmp_path):
    a = SERVERS[0]
    idle_before = [{**row, "t": T0 - 100 + row["t"] - T0, "running": 0} for row in metric_rows(a, 0)]
    out = run_with_series(tmp_path, {0: idle_before + metric_rows(a, 30)})
    _, report = report_of(out, "run")
    assert report["occupancy"]["per_server"][a]["running_mean"] == 30


def test_failures_say_when_which_shard_how_long_and_the_prompts_per_server(tmp_path):
    a, b, _ = SERVERS
    events = {0: [{"at": "2026-11-30T02:10:00Z", "t": T0 + 10, "shard": 0, "event": "down", "server": b,
                   "reason": "http_500: CUDA error"},
                  {"at": "2026-11-30T02:10:00Z", "t": T0 + 10, "shard": 0, "event": "retried", "server": b,
                   "prompt": "p00001", "reason": "CUDA error"},
                  {"at": "2026-11-30T02:10:42Z", "t": T0 + 52, "shard": 0, "event": "recovered", "server": b,
                   "down_s": 42.0}],
              1: [{"at": "2026-11-30T02:11:00Z", "t": T0 + 70, "shard": 1, "event": "failed", "server": a,
                   "prompt": "p00002", "code": "http_400", "reason": "too long"}]}
    out = run_with_series(tmp_path, {0: metric_rows(a, 40)}, events)
    _, report = report_of(out, "run")
    failures = report["failures"]
    assert (failures["down_events"], failures["retried"], failures["failed"]) == (1, 1, 1)
    period = failures["per_server"][b]["down"][0]
    assert period == {"at": "2026-11-30T02:10:00Z", "shard": 0, "reason": "http_500: CUDA error",
                      "recovered_at": "2026-11-30T02:10:42Z", "down_s": 42.0}
    assert failures["per_server"][a] == {"down": [], "retried": 0, "failed": 1, "down_seconds": 0.0}
    markdown = (out / "report" / "report.md").read_text()
    assert "## Failures" in markdown and "| node-a:30001 | 2026-11-30T02:10:00Z | 0 | 2026-11-30T02:10:42Z |" in markdown


def test_a_run_without_series_says_so(tmp_path):
    out = run_with_series(tmp_path, {})
    _, report = report_of(out, "run")
    assert report["occupancy"] is None and report["failures"]["down_events"] == 0
    markdown = (out / "report" / "report.md").read_text()
    assert "No metrics samples" in markdown and "No server was marked down" in markdown


def test_gpu_utilisation_power_and_energy_per_million_tokens(tmp_path):
    out = run_with_series(tmp_path, {})
    layout = RunLayout(out)
    rows = [{"t": T0 + 2 + 2 * n, "node": "node-a", "gpu": gpu, "util": 90.0 + gpu, "power_w": 800.0 + 100 * gpu,
             "mem_mib": 170_000.0} for n in range(15) for gpu in (0, 1)]
    write_jsonl(layout.shard_file("gpu", 0), rows)
    _, report = report_of(out, "run")
    gpus = report["gpus"]
    span = report["timing"]["generation_seconds"]
    assert gpus["per_gpu"]["node-a:gpu1"]["power_mean_w"] == 900.0 and gpus["per_gpu"]["node-a:gpu0"]["util_mean"] == 90
    assert gpus["energy_j"] == round((800 + 900) * span, 1)
    tokens = report["totals"]["completion_tokens"]
    assert gpus["joules_per_million_tokens"] == round((800 + 900) * span / tokens * 1e6, 1)
    markdown = (out / "report" / "report.md").read_text()
    assert "## GPUs" in markdown and "kWh per million output tokens" in markdown
    assert (out / "report" / report["plots"]["gpus"]).read_bytes().startswith(PNG_MAGIC)


def test_kept_and_relaunched_servers_are_counted(tmp_path):
    from fleetgen.report.build import build_report
    from report_fixtures import plan_and_readiness

    out = run_with_series(tmp_path, {})
    plan, readiness = plan_and_readiness(40)
    readiness[0]["kept"], readiness[1]["kept"] = True, False  # the third says nothing: launched by an older run
    build_report(out, run_id="run", plan=plan, readiness=readiness, shard_results=None, validation=None,
                 previous_report=None)
    report = __import__("json").loads((out / "report" / "report.json").read_text())
    assert report["servers"] == {"kept": 1, "relaunched": 2, "kept_servers": [SERVERS[0]],
                                 "relaunched_servers": sorted(SERVERS[1:])}
    assert "- Servers: 1 kept running (already on tonight's plan), 2 (re)launched" in \
        (out / "report" / "report.md").read_text()


def test_reused_completions_count_in_the_run_but_not_in_tonights_throughput(tmp_path):
    data = [good_row(index) for index in range(ROWS)]
    for row in data[:100]:
        row.update(reused_from="night1", finished_at=T0 - 86_400)  # copied from yesterday's run
    out = write_run(tmp_path / "run", data)
    _, report = report_of(out, "run")
    assert report["reuse"] == {"reused": 100, "generated": ROWS - 100, "from_runs": {"night1": 100},
                               "source_runs": [], "regenerated": {}, "passed_over": [], "changed": None}
    assert report["totals"]["completions"] == ROWS - 100
    assert report["timing"]["first_start"] == T0 + 100 * 0.1  # yesterday's timestamps do not stretch the span
    assert "reused unchanged from earlier runs: 100 (night1)" in (out / "report" / "report.md").read_text()


def test_the_reuse_section_says_what_was_generated_again_passed_over_or_changed(tmp_path):
    from fleetgen.generate.reuse import SOURCE_UNREADABLE

    data = [good_row(index) for index in range(ROWS)]
    for row in data[:100]:
        row.update(reused_from="night1", finished_at=T0 - 86_400)
    out = write_run(tmp_path / "run", data)
    torn = {"run": "night3", "reason": "/out/night3/reuse/index.npy is 99 bytes, its index.json recorded 4128"}

    def shard(shard_id: int, regenerated: int) -> dict:
        return {"shard_id": shard_id, "done": 1, "failed": 0, "seconds": 1.0,
                "reuse": {"source": "night2", "skipped": [torn], "changed": None,
                          "regenerated": {SOURCE_UNREADABLE: regenerated}}}

    build_report(out, run_id="run", plan=None, readiness=None, shard_results=[shard(0, 7), shard(1, 5)],
                 validation=None, previous_report=None)
    report = json.loads((out / "report" / "report.json").read_text())["reuse"]
    assert report["source_runs"] == ["night2"] and report["regenerated"] == {SOURCE_UNREADABLE: 12}
    assert report["passed_over"] == [torn] and report["changed"] is None
    text = (out / "report" / "report.md").read_text()
    assert f"copied from run night2; generated again because their earlier copy could not be used: 12 " \
           f"({SOURCE_UNREADABLE})" in text
    assert "passed over run night3: /out/night3/reuse/index.npy is 99 bytes" in text

    changed = {"shard_id": 0, "done": ROWS, "failed": 0, "seconds": 1.0,
               "reuse": {"source": None, "skipped": [], "regenerated": {},
                         "changed": {"run": "night2", "parts": ["model.chat_template", "model.weights"]}}}
    build_report(out, run_id="run", plan=None, readiness=None, shard_results=[changed], validation=None,
                 previous_report=None)
    assert json.loads((out / "report" / "report.json").read_text())["reuse"]["changed"] == changed["reuse"]["changed"]
    assert "nothing reused from run night2: changed since model.chat_template, model.weights" in \
        (out / "report" / "report.md").read_text()


# Fast checks of occupancy.py itself: the series written as the shards write them, read without a report.
from fleetgen.report import occupancy as occupancy_module  # noqa: E402
from fleetgen.report.occupancy import LOW_OCCUPANCY, failures, gpu_usage, occupancy, read_rows  # noqa: E402


def series_layout(tmp_path: Path, kind: str, per_shard: dict[int, list[dict]]) -> RunLayout:
    layout = RunLayout(tmp_path / "series")
    for shard, rows in per_shard.items():
        write_jsonl(layout.shard_file(kind, shard), rows)
    return layout


def sample(server: str, t: float, running: float, cap: int, **more) -> dict:
    return {"t": t, "server": server, "cap": cap, "running": running, **more}


def test_fleet_occupancy_weighs_each_server_by_its_cap(tmp_path):
    layout = series_layout(tmp_path, "metrics", {0: [sample("small", T0 + n, 10, 10, queue=2) for n in range(4)],
                                                 1: [sample("large", T0 + n, 9, 90, queue=2) for n in range(4)]})
    result = occupancy(layout, span=None, down_seconds={})
    assert result["per_server"]["small"]["occupancy"] == 1.0 and result["per_server"]["large"]["occupancy"] == 0.1
    assert result["fleet_occupancy"] == round(19 / 100, 4)  # not the mean of 1.0 and 0.1
    assert list(result["per_server"]) == ["large", "small"]


def test_a_servers_occupancy_is_its_mean_running_over_its_largest_reported_cap(tmp_path):
    rows = [sample("a", T0, 10, 40), sample("a", T0 + 1, 30, 40), sample("a", T0 + 2, 29, 30)]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})
    row = result["per_server"]["a"]
    assert (row["cap"], row["samples"], row["running_mean"], row["running_max"]) == (40, 3, 23.0, 30.0)
    assert row["occupancy"] == round(23 / 40, 4) and row["queue_mean"] is None and "low" not in row
    assert row["token_usage_mean"] is None and row["token_usage_max"] is None and row["mamba_usage_max"] is None
    assert row["series"] == {"bucket": [0, 1, 2], "running": [10.0, 30.0, 29.0], "queue": [], "token_usage": []}


def test_samples_of_several_shards_at_the_same_moment_all_count(tmp_path):
    layout = series_layout(tmp_path, "metrics", {0: [sample("a", T0, 10, 40, sent=5)],
                                                 3: [sample("a", T0, 30, 40, sent=15)],
                                                 12: [sample("a", T0 + 1, 20, 40, sent=10)]})
    row = occupancy(layout, span=None, down_seconds={})["per_server"]["a"]
    assert (row["samples"], row["running_mean"], row["sent_mean"]) == (3, 20.0, 10.0)
    assert row["series"]["running"] == [20.0, 20.0]


def test_the_span_bounds_are_inclusive_and_a_span_without_samples_keeps_them_all(tmp_path):
    rows = [sample("a", T0 + t, running, 40) for t, running in ((0, 1), (10, 20), (20, 30), (30, 2))]
    layout = series_layout(tmp_path, "metrics", {0: rows})
    inside = occupancy(layout, span=(T0 + 10, T0 + 20), down_seconds={})
    assert inside["start"] == T0 + 10 and inside["per_server"]["a"]["running_mean"] == 25.0
    assert inside["per_server"]["a"]["span_s"] == 10.0
    elsewhere = occupancy(layout, span=(T0 + 100, T0 + 200), down_seconds={})
    assert elsewhere["per_server"]["a"]["samples"] == 4 and elsewhere["start"] == T0


def test_series_buckets_widen_to_stay_under_the_point_limit(tmp_path):
    rows = [sample("a", T0 + t, t, 1000, queue=t / 10, token_usage=t / 1000) for t in range(0, 601, 1)]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})
    assert result["bucket_seconds"] == 5.0 and result["low_threshold"] == LOW_OCCUPANCY
    series = result["per_server"]["a"]["series"]
    assert series["bucket"] == list(range(121))
    assert series["running"][:2] == [2.0, 7.0] and series["running"][-1] == 600.0
    assert series["queue"][:2] == [0.2, 0.7] and series["token_usage"][:2] == [0.002, 0.007]
    short = occupancy(series_layout(tmp_path / "short", "metrics", {0: rows[:50]}), span=None, down_seconds={})
    assert short["bucket_seconds"] == 1.0 and len(short["per_server"]["a"]["series"]["bucket"]) == 50
    single = occupancy(series_layout(tmp_path / "one", "metrics", {0: rows[:1]}), span=None, down_seconds={})
    assert single["bucket_seconds"] == 1.0 and single["per_server"]["a"]["span_s"] == 0.0


def test_a_width_that_divides_unevenly_rounds_up(tmp_path):
    rows = [sample("a", T0 + t, 1, 1) for t in (0, 121)]  # 121 s / 120 points -> 2 s buckets
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})
    assert result["bucket_seconds"] == 2 and result["per_server"]["a"]["series"]["bucket"] == [0, 60]


def low_reason(tmp_path, running=10, cap=40, down=0.0, **more) -> str | None:
    rows = [sample("a", T0 + t, running, cap, **more) for t in (0, 100)]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={"a": down})
    return result["per_server"]["a"].get("low")


def test_half_the_cap_is_not_low_and_just_under_is(tmp_path):
    assert low_reason(tmp_path / "half", running=20, cap=40) is None
    assert low_reason(tmp_path / "under", running=19.96, cap=40) is not None


def test_the_likely_reason_of_a_low_server(tmp_path):
    assert low_reason(tmp_path / "a", down=20.0, queue=5, token_usage=1.0) == \
        "down for 20 s of the 100 s span (see Failures)"  # a fifth of the span down is the reason
    kv = low_reason(tmp_path / "b", down=19.9, queue=1, token_usage=0.9)
    assert kv.startswith("KV cache full (token_usage up to 0.90) with requests queued")
    assert low_reason(tmp_path / "c", queue=1, token_usage=0.89, mamba_usage=0.9) == \
        "Mamba state slots full with requests queued: raise --max-mamba-cache-size"
    assert low_reason(tmp_path / "d", queue=0.9, token_usage=1.0, sent=12) == (
        "the client kept too few requests there (queue empty, 12 in flight from the shards on average): "
        "raise headroom, or check parallel_shards and the shards' retries")
    assert low_reason(tmp_path / "e", queue=0.5) .startswith("the client kept too few requests there (queue empty, 0 ")
    assert low_reason(tmp_path / "f", queue=3, token_usage=0.42) == (
        "requests queued (3 on average) while KV use stayed at 0.42: admission is slower than the finishes "
        "(prefill-bound)")
    assert low_reason(tmp_path / "g", queue=3, token_usage=0.95, mamba_usage=0.95).startswith("KV cache full")
    assert low_reason(tmp_path / "h", queue=3, mamba_usage=0.89).startswith("requests queued (3 on average) "
                                                                            "while KV use stayed at 0.00")


def test_a_server_without_a_cap_has_no_occupancy_and_no_fleet_figure(tmp_path):
    layout = series_layout(tmp_path, "metrics", {0: [sample("a", T0, 3, 0), sample("a", T0 + 1, 5, 0)]})
    result = occupancy(layout, span=None, down_seconds={})
    assert result["fleet_occupancy"] is None and result["per_server"]["a"]["occupancy"] is None
    assert "low" not in result["per_server"]["a"]


def test_no_samples_or_no_running_column_is_no_occupancy(tmp_path):
    assert occupancy(RunLayout(tmp_path / "none"), span=None, down_seconds={}) is None
    layout = series_layout(tmp_path, "metrics", {0: [{"t": T0, "server": "a", "cap": 4}]})
    assert occupancy(layout, span=None, down_seconds={}) is None


def test_torn_lines_are_skipped_and_every_file_is_read(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"x": 1}\n{"x": 2}\n{"x": ')
    second.write_text('{"x": 3}\n')
    assert read_rows([first, second])["x"].tolist() == [1, 2, 3]
    assert read_rows([]).empty


def test_a_torn_line_a_resumed_shard_appended_after_is_skipped_and_the_rest_read(tmp_path):
    resumed = tmp_path / "a.jsonl"
    resumed.write_text('{"x": 1}\n{"x": \n{"x": 2}\n')
    assert read_rows([resumed])["x"].tolist() == [1, 2]


def test_means_and_the_fleet_figure_are_given_to_four_decimals(tmp_path):
    rows = [sample("a", T0 + t, running, 3, queue=queue) for t, running, queue in ((0, 1, 0), (1, 1, 0), (2, 1, 1))]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})
    assert result["per_server"]["a"]["queue_mean"] == 0.3333 and result["fleet_occupancy"] == 0.3333


def test_a_low_server_never_down_is_not_called_down_however_short_the_span(tmp_path):
    rows = [sample("a", T0 + t, 1, 40, queue=0) for t in (0, 2)]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})
    assert result["per_server"]["a"]["low"].startswith("the client kept too few requests there")


def event(kind: str, server: str, shard: int, t: float, **more) -> dict:
    return {"at": f"at{t:g}", "t": T0 + t, "shard": shard, "event": kind, "server": server, **more}


def test_two_servers_marked_down_by_two_shards_each_get_their_own_recovery(tmp_path):
    events = {0: [event("down", "b", 0, 10, reason="first"), event("recovered", "b", 0, 40, down_s=30.0),
                  event("down", "b", 0, 50, reason="again"), event("recovered", "b", 0, 55, down_s=5.0),
                  event("retried", "b", 0, 10), event("failed", "a", 0, 12)],
              1: [event("down", "a", 1, 20, reason="other shard"), event("recovered", "b", 1, 21, down_s=1.0),
                  event("retried", "a", 1, 20), event("retried", "a", 1, 21)]}
    result = failures(series_layout(tmp_path, "events", events))
    assert (result["down_events"], result["retried"], result["failed"]) == (3, 3, 1)
    assert list(result["per_server"]) == ["a", "b"]  # sorted for the report's table, not in the files' order
    assert result["per_server"]["b"] == {
        "down": [{"at": "at10", "shard": 0, "reason": "first", "recovered_at": "at40", "down_s": 30.0},
                 {"at": "at50", "shard": 0, "reason": "again", "recovered_at": "at55", "down_s": 5.0}],
        "retried": 1, "failed": 0, "down_seconds": 35.0}
    # shard 1 saw b recover but never saw it down; a's down (seen by shard 1) has no recovery of its own
    assert result["per_server"]["a"] == {
        "down": [{"at": "at20", "shard": 1, "reason": "other shard", "recovered_at": None, "down_s": None}],
        "retried": 2, "failed": 1, "down_seconds": 0.0}


def test_down_periods_are_listed_in_time_order_whatever_order_the_files_hold(tmp_path):
    events = {0: [event("recovered", "a", 0, 95, down_s=5.0), event("down", "a", 0, 90, reason="late"),
                  event("recovered", "a", 0, 8, down_s=3.26), event("down", "a", 0, 5, reason="early")]}
    result = failures(series_layout(tmp_path, "events", events))
    assert [(p["reason"], p["recovered_at"], p["down_s"]) for p in result["per_server"]["a"]["down"]] == [
        ("early", "at8", 3.26), ("late", "at95", 5.0)]
    assert result["per_server"]["a"]["down_seconds"] == 8.3  # to a tenth of a second


def test_a_recovery_before_the_down_is_not_its_end(tmp_path):
    events = {0: [event("recovered", "a", 0, 5, down_s=4.0), event("down", "a", 0, 10, reason="x"),
                  event("recovered", "a", 0, 10, down_s=0.0)]}
    [period] = failures(series_layout(tmp_path, "events", events))["per_server"]["a"]["down"]
    assert (period["recovered_at"], period["down_s"]) == ("at10", 0.0)


def test_no_events_is_no_failures(tmp_path):
    assert failures(RunLayout(tmp_path)) == {"down_events": 0, "retried": 0, "failed": 0, "per_server": {}}


def gpu_row(node: str, gpu: int, t: float, power: float | None, util: float | None = 50.0, mem=1000.0) -> dict:
    return {"t": T0 + t, "node": node, "gpu": gpu, "util": util, "power_w": power, "mem_mib": mem}


def test_gpu_energy_is_mean_power_times_the_generation_span_in_joules_and_kwh(tmp_path):
    rows = [gpu_row("n1", gpu, t, power) for t in (0, 1800, 3600) for gpu, power in ((0, 800.0), (1, 1000.0))]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 3600), completion_tokens=2_000_000)
    assert result["seconds"] == 3600 and result["per_gpu"]["n1:gpu0"]["energy_j"] == 800.0 * 3600
    assert result["energy_j"] == 6_480_000.0 and result["energy_kwh"] == 1.8  # 1 kWh = 3.6 MJ
    assert result["joules_per_million_tokens"] == 3_240_000.0 and result["kwh_per_million_tokens"] == 0.9


def test_a_sampling_gap_does_not_count_as_zero_watts(tmp_path):
    rows = [gpu_row("n1", 0, t, 500.0) for t in (100, 110)]  # sampled for 10 s of a 1000 s span
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 1000), completion_tokens=1000)
    assert result["seconds"] == 1000 and result["energy_j"] == 500_000.0
    assert result["joules_per_million_tokens"] == 500_000_000.0 and result["kwh_per_million_tokens"] == 138.8889


def test_without_a_span_the_samples_own_extent_is_the_span(tmp_path):
    rows = [gpu_row("n1", 0, t, 300.0) for t in (0, 40)]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=None, completion_tokens=0)
    assert (result["seconds"], result["energy_j"], result["start"]) == (40, 12_000.0, T0)
    assert result["joules_per_million_tokens"] is None and result["kwh_per_million_tokens"] is None


def test_per_gpu_figures_and_series_per_node_and_gpu(tmp_path):
    rows = [gpu_row("n2", 1, 0, 100.0, util=90.0, mem=5.0), gpu_row("n2", 1, 1, None, util=None, mem=7.0),
            gpu_row("n2", 1, 2, 300.0, util=70.0, mem=6.0), gpu_row("n1", 0, 0, None, util=None, mem=None)]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0 - 5, T0 + 2), completion_tokens=10)
    assert list(result["per_gpu"]) == ["n1:gpu0", "n2:gpu1"] and result["bucket_seconds"] == 1.0
    busy = result["per_gpu"]["n2:gpu1"]
    assert (busy["samples"], busy["util_mean"], busy["util_min"], busy["power_mean_w"], busy["power_max_w"],
            busy["mem_max_mib"]) == (3, 80.0, 70.0, 200.0, 300.0, 7.0)
    assert busy["energy_j"] == 200.0 * 7 and result["energy_j"] == 1400.0
    assert busy["series"] == {"bucket": [0, 1, 2], "util": [90.0, None, 70.0], "power_w": [100.0, None, 300.0]}
    idle = result["per_gpu"]["n1:gpu0"]
    assert (idle["util_min"], idle["power_mean_w"], idle["power_max_w"], idle["mem_max_mib"], idle["energy_j"]) == (
        None, None, None, None, None)


def test_no_power_samples_is_no_energy(tmp_path):
    rows = [gpu_row("n1", 0, t, None) for t in (0, 10)]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=None, completion_tokens=10)
    assert (result["energy_j"], result["energy_kwh"], result["joules_per_million_tokens"]) == (None, None, None)
    assert gpu_usage(RunLayout(tmp_path / "none"), span=None, completion_tokens=10) is None


def test_a_gauge_some_samples_lack_is_averaged_over_the_others_and_one_none_lack_is_none(tmp_path):
    rows = [sample("a", T0, 10, 40, token_usage=0.2, accept_length=None, mamba_usage=None),
            sample("a", T0 + 1, 10, 40, token_usage=None, accept_length=None, mamba_usage=None),
            sample("a", T0 + 2, 10, 40, token_usage=0.4, accept_length=None, mamba_usage=None)]
    row = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})["per_server"]["a"]
    assert (row["token_usage_mean"], row["token_usage_max"]) == (0.3, 0.4)
    assert row["accept_length_mean"] is None and row["mamba_usage_max"] is None


def test_gpu_samples_on_the_span_bounds_count_and_those_outside_do_not(tmp_path):
    rows = [gpu_row("n1", 0, t, power) for t, power in ((-10, 5000.0), (0, 100.0), (10, 300.0), (20, 9000.0))]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 10), completion_tokens=1)
    assert result["per_gpu"]["n1:gpu0"]["samples"] == 2 and result["per_gpu"]["n1:gpu0"]["power_mean_w"] == 200.0
    assert result["start"] == T0 and result["energy_j"] == 2000.0
    elsewhere = gpu_usage(series_layout(tmp_path / "b", "gpu", {0: rows}), span=(T0 + 100, T0 + 200),
                          completion_tokens=1)
    assert elsewhere["per_gpu"]["n1:gpu0"]["samples"] == 4 and elsewhere["start"] == T0 - 10


def test_gpu_series_buckets_widen_to_stay_under_the_point_limit(tmp_path):
    rows = [gpu_row("n1", 0, t, 100.0 + t) for t in range(0, 601)]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=None, completion_tokens=1)
    assert result["bucket_seconds"] == 5.0
    series = result["per_gpu"]["n1:gpu0"]["series"]
    assert series["bucket"] == list(range(121)) and series["power_w"][:2] == [102.0, 107.0]
    single = gpu_usage(series_layout(tmp_path / "one", "gpu", {0: rows[:1]}), span=None, completion_tokens=1)
    assert single["bucket_seconds"] == 1.0 and single["seconds"] == 0.0


def test_gpus_are_listed_by_node_then_gpu_number(tmp_path):
    rows = [gpu_row(node, gpu, 0, 1.0) for node, gpu in (("n2", 0), ("n1", 1), ("n1", 0))]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=None, completion_tokens=1)
    assert list(result["per_gpu"]) == ["n1:gpu0", "n1:gpu1", "n2:gpu0"]


def test_a_server_sampled_once_is_not_called_down_for_its_whole_span(tmp_path):
    rows = [sample("a", T0, 4, 40, queue=0)]
    result = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={"a": 5.0})
    assert result["per_server"]["a"]["low"].startswith("the client kept too few")


def test_without_queue_samples_a_full_pool_is_not_taken_for_a_queue(tmp_path):
    assert low_reason(tmp_path / "kv", token_usage=0.95).startswith("the client kept too few")
    assert low_reason(tmp_path / "mamba", mamba_usage=0.95).startswith("the client kept too few")


def test_one_request_queued_on_average_is_a_queue(tmp_path):
    assert low_reason(tmp_path, queue=1, token_usage=0.3).startswith("requests queued (1 on average)")


def test_figures_are_rounded_to_the_documented_digits(tmp_path):
    rows = [sample("a", T0 + t, running, 3, queue=running, token_usage=usage, mamba_usage=usage, accept_length=2.5,
                   sent=running) for t, running, usage in ((0, 1, 0.12345), (0.33, 1, 0.12346), (0.66, 2, 0.123456))]
    row = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})["per_server"]["a"]
    assert (row["running_mean"], row["occupancy"], row["span_s"]) == (1.33, 0.4444, 0.7)
    assert (row["token_usage_max"], row["mamba_usage_max"], row["accept_length_mean"]) == (0.1235, 0.1235, 2.5)
    assert row["series"] == {"bucket": [0], "running": [1.33], "queue": [1.33], "token_usage": [0.1235]}


def test_samples_without_a_cap_have_no_occupancy(tmp_path):
    rows = [{"t": T0, "server": "a", "running": 3}]
    row = occupancy(series_layout(tmp_path, "metrics", {0: rows}), span=None, down_seconds={})["per_server"]["a"]
    assert (row["cap"], row["occupancy"]) == (0, None)


def test_gpu_figures_are_rounded_to_the_documented_digits(tmp_path):
    rows = [gpu_row("n1", 0, t, power, util=util) for t, power, util in ((0, 100.0, 90.0), (0.5, 100.06, 90.0),
                                                                         (0.9, 100.94, 91.0))]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 1.23456), completion_tokens=3)
    gpu = result["per_gpu"]["n1:gpu0"]
    mean = (100.0 + 100.06 + 100.94) / 3
    assert (gpu["power_mean_w"], gpu["power_max_w"], result["seconds"]) == (100.3, 100.9, 1.235)
    assert gpu["series"]["util"] == [90.3] and gpu["series"]["power_w"] == [100.3]
    assert gpu["energy_j"] == result["energy_j"] == round(mean * 1.23456, 1) == 123.9
    assert result["joules_per_million_tokens"] == round(123.9 / 3 * 1e6, 1)  # from the GPUs' rounded energies
    assert result["energy_kwh"] == round(mean * 1.23456 / 3.6e6, 4) == 0.0


def test_a_thousand_kwh_is_kept_to_four_decimals(tmp_path):
    rows = [gpu_row("n1", 0, t, 1000.0) for t in (0, 10)]
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 3_600_000), completion_tokens=10**6)
    assert result["energy_kwh"] == 1000.0 and result["kwh_per_million_tokens"] == 1000.0
    small = gpu_usage(series_layout(tmp_path / "s", "gpu", {0: rows}), span=(T0, T0 + 1.2345), completion_tokens=10**6)
    assert small["energy_kwh"] == round(1234.5 / 3.6e6, 4) == 0.0003


def test_energy_per_million_tokens_keeps_one_decimal_when_the_tokens_do_not_divide_it(tmp_path):
    rows = [gpu_row("n1", 0, t, 100.0) for t in (0, 1)]  # 100 J over the 1 s span
    result = gpu_usage(series_layout(tmp_path, "gpu", {0: rows}), span=(T0, T0 + 1), completion_tokens=3_000_000)
    assert result["energy_j"] == 100.0
    assert result["joules_per_million_tokens"] == 33.3  # 100 J / 3 M tokens, neither 33 nor 33.33
