"""What each expectation promises, stated and held at its edges: the bound every message prints, the
smallest passing values, the tolerated shares, and a Great Expectations run that stays quiet and offline."""

from __future__ import annotations

import logging
import os

import pytest
from validate_fixtures import MAX_TOKENS, good_row, write_run

from fleetgen.errors import ValidationFailed
from fleetgen.validation import suite
from fleetgen.validation.suite import ValidationThresholds, validate_run

ROWS = 200
THRESHOLDS = ValidationThresholds(max_tokens=MAX_TOKENS)
BOUNDS = {
    "completion_tokens_in_range": "0 rows outside [1, 1000]",
    "mean_completion_tokens": "mean in [1, inf]",
    "finish_reason_allowed": "0 rows outside ['stop', 'length']",
    "length_share": "share of finish_reason=length <= 0.2",
    "reasoning_share": "share with a reasoning trace >= 0.9",
    "empty_answer_share": "share of empty answers <= 0.1",
    "no_missing_ids": "0 prompts without a completion or an error record",
    "no_duplicate_ids": "0 prompts with more than one completion",
    "no_unknown_ids": "0 completions for ids absent from the prompts",
    "error_share": "share of prompts that failed <= 0.01",
}


def ids(count: int = ROWS) -> list[str]:
    return [f"p{index:05d}" for index in range(count)]


def rows(count: int = ROWS, **overrides) -> list[dict]:
    return [good_row(index, **overrides) for index in range(count)]


def entries(summary: dict) -> dict[str, dict]:
    return {item["name"]: item for item in summary["expectations"]}


def test_every_expectation_states_its_bound(tmp_path):
    summary = validate_run(write_run(tmp_path / "run", rows()), ids(), THRESHOLDS, build_docs=False)
    by_name = entries(summary)
    assert {name: by_name[name]["bound"] for name in BOUNDS} == BOUNDS
    assert {item["bound"] for name, item in by_name.items() if name.endswith("_not_null")} == {"0 rows"}


def test_a_mean_below_its_floor_fails_and_the_message_names_both_ends(tmp_path):
    thresholds = ValidationThresholds(max_tokens=MAX_TOKENS, min_mean_completion_tokens=900)
    with pytest.raises(ValidationFailed) as caught:
        validate_run(write_run(tmp_path / "run", rows()), ids(), thresholds, build_docs=False)
    assert caught.value.summary["failed_expectations"] == ["mean_completion_tokens"]
    assert "expected mean in [900, inf]" in str(caught.value)


def test_the_smallest_valid_values_pass(tmp_path):
    """One token, one reasoning character, one answer character: each is a real completion."""
    data = rows(reasoning_chars=1, content_chars=1)
    data[3]["completion_tokens"] = 1
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False)
    assert summary["success"], summary["failed_expectations"]
    assert entries(summary)["completion_tokens_in_range"]["observed"] == 0


def test_a_few_rows_inside_each_tolerated_share_pass(tmp_path):
    data = rows()
    data[10]["reasoning_chars"] = 0  # 199 / 200 with a trace >= 0.9
    data[11]["content_chars"] = 0  # 1 / 200 empty <= 0.1
    data[12].update(finish_reason="length", completion_tokens=MAX_TOKENS)  # 1 / 200 <= 0.2
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False)
    assert summary["success"], summary["failed_expectations"]
    assert entries(summary)["reasoning_share"]["observed"] == pytest.approx(0.995)
    assert entries(summary)["empty_answer_share"]["observed"] == pytest.approx(0.005)


def test_great_expectations_is_imported_quietly_and_without_analytics(monkeypatch):
    monkeypatch.delenv("GX_ANALYTICS_ENABLED", raising=False)
    logger = logging.getLogger("great_expectations._docs_decorators")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    suite._quiet_gx_import()
    assert logger.level == logging.WARNING
    assert os.environ["GX_ANALYTICS_ENABLED"] == "False"


def test_a_run_without_data_docs_writes_only_its_summary_and_prints_no_progress(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    out = write_run(tmp_path / "run", rows())
    before = {path for path in tmp_path.rglob("*")}
    validate_run(out, ids(), THRESHOLDS, build_docs=False)
    written = {path for path in tmp_path.rglob("*")} - before
    assert written == {out / "validation", out / "validation" / "summary.json"}
    captured = capfd.readouterr()
    assert "Calculating Metrics" not in captured.out + captured.err


def test_data_docs_carry_no_how_to_footer(tmp_path):
    summary = validate_run(write_run(tmp_path / "run", rows(20)), ids(20), THRESHOLDS)
    pages = [path.read_text(errors="replace") for path in (tmp_path / "run" / "validation" / "data_docs").rglob("*.html")]
    assert pages and summary["data_docs"]
    assert not any("show_how_to_buttons" in page or "To disable this footer" in page for page in pages)


def test_the_summary_names_its_run_folder_thresholds_and_torn_lines_and_is_written_as_printed(tmp_path):
    out = write_run(tmp_path / "run", rows(20))
    torn = out / "stats" / "shard-00001.jsonl"
    with torn.open("a") as handle:
        handle.write('{"id": "p00020", "prompt_tok')  # a write cut short by a crash
    summary = validate_run(out, ids(20), THRESHOLDS, build_docs=False)
    assert summary["out_dir"] == str(out)
    assert summary["thresholds"] == THRESHOLDS.to_dict()
    assert summary["torn_lines"] == [f"{torn}:11"] and summary["data_docs"] is None
    text = (out / "validation" / "summary.json").read_text()
    assert text == __import__("json").dumps(summary, indent=2) + "\n"


def test_the_log_says_what_was_validated(tmp_path, caplog):
    out = write_run(tmp_path / "run", rows(20))
    with caplog.at_level(logging.INFO, logger="fleetgen.validation.suite"):
        summary = validate_run(out, ids(21), THRESHOLDS, build_docs=False, raise_on_failure=False)
    failed, total = len(summary["failed_expectations"]), len(summary["expectations"])
    assert failed == 1  # the one missing id
    assert any(record.getMessage() == f"validated {out}: 20 rows, 21 expected ids, {failed} of {total} expectations "
                                      f"failed ({summary['seconds']:.1f} s)" for record in caplog.records)


def test_a_run_whose_folder_was_never_created_still_gets_its_summary(tmp_path):
    out = tmp_path / "runs" / "never-started"
    summary = validate_run(out, ids(3), THRESHOLDS, build_docs=False, raise_on_failure=False)
    assert summary["missing"]["count"] == 3
    assert (out / "validation" / "summary.json").is_file()


def test_a_retried_validation_of_a_named_run_lists_only_its_own_pages(tmp_path):
    out = write_run(tmp_path / "run", rows(20))
    for _ in range(2):
        summary = validate_run(out, ids(20), THRESHOLDS, run_name="scheduled__2026-11-30T02:00:00+00:00")
    pages = list((out / "validation" / "data_docs" / "validations").rglob("*.html"))
    assert summary["success"] and len(pages) == 2
    assert all("scheduled__2026-11-30T02:00:00+00:00" in str(page) for page in pages)


def test_an_expectation_great_expectations_could_not_compute_fails_with_its_error():
    """GX 1.x reports a metric it could not compute per metric in exception_info: the message must reach the
    task log, not just "observed None"."""
    import pandas as pd

    checks = [check for check in suite._checks(THRESHOLDS, ["id", "completion_tokens"])
              if check.name in ("mean_completion_tokens", "completion_tokens_in_range")]
    frame = pd.DataFrame({"id": ["p0", "p1"], "completion_tokens": ["many", "few"]})
    results, _ = suite._run_gx({"completions": frame}, checks, None)
    mean = next(item for item in results if item["name"] == "mean_completion_tokens")
    assert mean["success"] is False and mean["observed"] is None
    assert mean["error"] == "Cannot perform reduction 'mean' with string dtype"
    assert "; error: Cannot perform reduction 'mean' with string dtype" in suite._describe(mean)


def test_a_long_error_is_cut_to_500_characters():
    class Result:
        result = {"observed_value": None}
        success = False
        exception_info = {"metric-a": {"raised_exception": True, "exception_message": "x" * 700},
                          "metric-b": {"raised_exception": False, "exception_message": None}}

        class expectation_config:  # noqa: N801 - the attribute GX results carry
            type = "expect_column_mean_to_be_between"
            kwargs = {"column": "completion_tokens"}

    check = next(check for check in suite._checks(THRESHOLDS, ["id"]) if check.name == "mean_completion_tokens")
    entry = suite._read_result(check, Result())
    assert entry["error"] == "x" * 500 and entry["success"] is False
    Result.exception_info = {"raised_exception": True, "exception_message": "flat shape"}
    assert suite._read_result(check, Result())["error"] == "flat shape"


def test_shares_are_reported_to_six_decimals(tmp_path):
    data = rows(30)
    for index in range(11):
        data[index]["reasoning_chars"] = 0
        data[index + 11]["content_chars"] = 0
    with pytest.raises(ValidationFailed) as caught:
        validate_run(write_run(tmp_path / "run", data), ids(30), THRESHOLDS, build_docs=False)
    by_name = entries(caught.value.summary)
    assert by_name["reasoning_share"]["observed"] == 0.633333  # 19 / 30
    assert by_name["empty_answer_share"]["observed"] == 0.366667  # 11 / 30


def test_with_no_rows_at_all_no_share_is_observed_as_bad(tmp_path):
    summary = validate_run(tmp_path, ids(2), THRESHOLDS, build_docs=False, raise_on_failure=False)
    by_name = entries(summary)
    assert by_name["length_share"]["observed"] == 0.0 and by_name["empty_answer_share"]["observed"] == 0.0


def test_unknown_ids_are_listed_in_the_order_the_stats_hold_them(tmp_path):
    data = rows(5) + [good_row(900, id="stranger-a"), good_row(901, id="stranger-b"), good_row(902, id="stranger-b")]
    summary = validate_run(write_run(tmp_path / "run", data, shards=1), ids(5), THRESHOLDS, build_docs=False,
                           raise_on_failure=False)
    assert summary["unknown_ids"] == {"count": 2, "first_ids": ["stranger-a", "stranger-b"]}



def test_each_failed_expectation_is_logged_and_the_hint_says_where_to_look(tmp_path, caplog):
    out = write_run(tmp_path / "run", rows(20))
    with caplog.at_level(logging.WARNING, logger="fleetgen.validation.suite"):
        with pytest.raises(ValidationFailed) as caught:
            validate_run(out, ids(22), THRESHOLDS, build_docs=False)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == ["expectation failed no_missing_ids: observed 2, expected 0 prompts without a completion or "
                        "an error record; sample ids: p00020, p00021"]
    assert caught.value.hint == (f"open {out / 'validation' / 'summary.json'} for every expectation; missing ids "
                                 "usually mean a shard did not finish (clear its generate task: it resumes); errors "
                                 "are listed in errors/*.jsonl: clearing a shard's generate task, once the servers are "
                                 'fixed, sends its "fault": "server" prompts again (then clear validate); "fault": '
                                 '"prompt" ones (e.g. too long) need their lines fixed and a new run')


def test_with_data_docs_the_hint_points_at_them(tmp_path):
    out = write_run(tmp_path / "run", rows(20))
    with pytest.raises(ValidationFailed) as caught:
        validate_run(out, ids(21), THRESHOLDS)
    assert caught.value.hint.startswith(f"open {out / 'validation' / 'data_docs' / 'index.html'} for every expectation;")


def test_distinct_errors_of_one_expectation_are_all_named_once():
    info = {"metric-a": {"raised_exception": True, "exception_message": "column missing"},
            "metric-b": {"raised_exception": True, "exception_message": "column missing"},
            "metric-c": {"raised_exception": True, "exception_message": "bad dtype"},
            "metric-d": {"raised_exception": False, "exception_message": "ignored"}}
    assert suite._raised_error(info) == "column missing; bad dtype"
    assert suite._raised_error({}) is None


def test_a_prompts_own_max_tokens_bounds_its_completion_instead_of_the_runs(tmp_path):
    data = rows()
    data[3]["completion_tokens"] = 8 * MAX_TOKENS  # its prompt asked for up to 8x the run's budget
    data[7]["completion_tokens"] = 600  # its prompt asked for at most 500
    own = {"p00003": 8 * MAX_TOKENS, "p00007": 500}
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False,
                           raise_on_failure=False, own_max_tokens=own)
    check = entries(summary)["completion_tokens_in_range"]
    assert (check["observed"], check["sample_ids"]) == (1, ["p00007"])
    assert check["bound"] == ("0 rows outside [1, 1000] (2 prompt(s) bounded by their own sampling.max_tokens "
                              "instead)")


def test_ids_that_differ_only_by_a_trailing_nul_are_two_prompts(tmp_path):
    data = [good_row(0, id="z"), good_row(1, id="z\u0000"), *rows()[2:]]
    summary = validate_run(write_run(tmp_path / "run", data), ["z", "z\u0000", *ids()[2:]], THRESHOLDS,
                           build_docs=False, raise_on_failure=False)
    assert summary["missing"]["count"] == 0 and summary["duplicates"]["count"] == 0 and summary["success"]
