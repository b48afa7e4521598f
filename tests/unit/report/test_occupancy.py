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
