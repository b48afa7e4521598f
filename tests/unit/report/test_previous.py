"""The previous successful run: its report found among the others, and its measured prompt lengths reused only
for the very same prompts file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fleetgen.outputs import RunLayout
from fleetgen.report.previous import (IDENTITY_KEYS, PromptTokens, find_previous_report, prompt_token_statistics,
                                      prompts_identity)

SCAN = {"path": "/data/prompts.jsonl", "bytes": 1000, "mtime_ns": 123, "count": 10,
        "prompt_tokens_mean": 250.0, "prompt_tokens_max": 900, "other": "not part of the identity"}


def write_report(root: Path, run_id: str, *, schema=1, succeeded=True, epoch=None, mtime=None,
                 prompt_tokens=None, identity=None, text=None) -> Path:
    layout = RunLayout(root / run_id)
    layout.report_dir.mkdir(parents=True)
    report = {"schema": schema, "run_succeeded": succeeded, "prompt_tokens": prompt_tokens}
    if epoch is not None:
        report["generated_at_epoch"] = epoch
    layout.report_json.write_text(text if text is not None else json.dumps(report))
    if mtime is not None:
        os.utime(layout.report_json, (mtime, mtime))
    if identity is not None:
        layout.prompts_identity.write_text(json.dumps(identity))
    return layout.report_json


def test_a_condition_on_the_report_picks_the_newest_that_meets_it(tmp_path):
    wanted = write_report(tmp_path, "auto", epoch=1000, prompt_tokens={"mean": 1.0})
    write_report(tmp_path, "tuned", epoch=2000)
    assert find_previous_report(tmp_path, "tonight") == tmp_path / "tuned" / "report" / "report.json"
    assert find_previous_report(tmp_path, "tonight", where=lambda report: report["prompt_tokens"]) == wanted
    assert find_previous_report(tmp_path, "auto", where=lambda report: report["prompt_tokens"]) is None


def test_the_newest_successful_report_of_another_run_is_found(tmp_path):
    write_report(tmp_path, "night1", epoch=1000)
    newest = write_report(tmp_path, "night2", epoch=3000)
    write_report(tmp_path, "night3", epoch=2000)
    write_report(tmp_path, "failed", epoch=9000, succeeded=False)
    write_report(tmp_path, "old_schema", epoch=9000, schema=0)
    write_report(tmp_path, "torn", text='{"schema": 1, "run_succ')
    write_report(tmp_path, "a_list", text="[1, 2]")
    write_report(tmp_path, "tonight", epoch=9999)
    assert find_previous_report(tmp_path, "tonight") == newest  # tonight's own report is not a previous one
    assert find_previous_report(tmp_path, "tonight") != find_previous_report(tmp_path, "night2") == \
        tmp_path / "tonight" / "report" / "report.json"


def test_without_a_recorded_time_the_files_mtime_orders_the_reports(tmp_path):
    write_report(tmp_path, "a", mtime=5000)
    later = write_report(tmp_path, "b", mtime=6000)
    write_report(tmp_path, "c", epoch=5500)
    write_report(tmp_path, "d", epoch="9999", mtime=4000)  # a string is not a time: the mtime counts
    assert find_previous_report(tmp_path, "x") == later


def test_a_report_written_at_epoch_zero_keeps_that_time(tmp_path):
    write_report(tmp_path, "a", epoch=0)  # its file's mtime is now: a zero taken for "no time" would make it newest
    later = write_report(tmp_path, "b", mtime=100)
    assert find_previous_report(tmp_path, "x") == later
    assert find_previous_report(tmp_path / "nowhere", "x") is None


def test_the_prompts_identity_is_path_size_mtime_and_count():
    assert IDENTITY_KEYS == ("path", "bytes", "mtime_ns", "count")
    assert prompts_identity(SCAN) == {"path": "/data/prompts.jsonl", "bytes": 1000, "mtime_ns": 123, "count": 10}


def test_the_servers_measured_lengths_are_used_for_the_same_prompts_file(tmp_path):
    report = write_report(tmp_path, "night1", epoch=1, prompt_tokens={"mean": "310.5", "max": 1200.0},
                          identity=prompts_identity(SCAN))
    tokens = prompt_token_statistics(tmp_path, RunLayout(tmp_path / "night2"), SCAN)
    assert tokens == PromptTokens(310.5, 1200, f"measured by the servers in the previous run ({report})")
    assert isinstance(tokens.max, int) and isinstance(tokens.mean, float)


def test_other_prompts_or_no_measurement_fall_back_to_the_estimate(tmp_path):
    changed = {**prompts_identity(SCAN), "mtime_ns": 124}
    write_report(tmp_path, "night1", epoch=1, prompt_tokens={"mean": 310.5, "max": 1200}, identity=changed)
    estimate = prompt_token_statistics(tmp_path, RunLayout(tmp_path / "night2"), SCAN)
    assert estimate == PromptTokens(250.0, 900, "estimated from the prompts file; the previous run read other prompts")

    write_report(tmp_path, "night3", epoch=3, prompt_tokens={"mean": 0, "max": 0}, identity=prompts_identity(SCAN))
    assert prompt_token_statistics(tmp_path, RunLayout(tmp_path / "night4"), SCAN).source.startswith(
        "estimated from the prompts file; the previous")
    write_report(tmp_path, "night5", epoch=5, identity=prompts_identity(SCAN))  # prompt_tokens null
    assert prompt_token_statistics(tmp_path, RunLayout(tmp_path / "night6"), SCAN).mean == 250.0


def test_a_previous_run_without_its_prompts_identity_falls_back_to_the_estimate(tmp_path):
    write_report(tmp_path, "night1", epoch=1, prompt_tokens={"mean": 310.5, "max": 1200})
    tokens = prompt_token_statistics(tmp_path, RunLayout(tmp_path / "night2"), SCAN)
    assert (tokens.mean, tokens.max) == (250.0, 900) and "other prompts" in tokens.source


def test_no_previous_run_or_no_output_folder_uses_the_estimate(tmp_path):
    expected = PromptTokens(250.0, 900, "estimated from the prompts file at ~4 characters per token; no previous run")
    assert prompt_token_statistics(tmp_path / "missing", RunLayout(tmp_path / "missing" / "r"), SCAN) == expected
    write_report(tmp_path, "tonight", epoch=1, prompt_tokens={"mean": 1, "max": 2}, identity=prompts_identity(SCAN))
    assert prompt_token_statistics(tmp_path, RunLayout(tmp_path / "tonight"), SCAN) == expected


def test_of_two_reports_written_at_the_same_moment_the_first_found_is_kept(tmp_path):
    write_report(tmp_path, "a", epoch=7)
    write_report(tmp_path, "b", epoch=7)
    first_found = next(tmp_path.glob("*/report/report.json"))  # the order find_previous_report reads them in
    assert find_previous_report(tmp_path, "x") == first_found


def test_an_unreadable_report_is_named_in_the_log(tmp_path, caplog):
    torn = write_report(tmp_path, "torn", text="{")
    with caplog.at_level("WARNING", logger="fleetgen.report.previous"):
        assert find_previous_report(tmp_path, "x") is None
    [record] = caplog.records
    assert record.getMessage().startswith(f"ignoring unreadable report {torn}: Expecting property name")
