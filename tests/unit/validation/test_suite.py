"""validate_run end to end on small synthetic runs: pass, each expectation failing on purpose, coverage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
import pytest
from validate_fixtures import MAX_TOKENS, FileAccessWatch, error_row, good_row, write_run
from fleetgen.errors import ValidationFailed
from fleetgen.outputs import OPTIONAL_STATS_COLUMNS
from fleetgen.validation.suite import STATS_COLUMNS, ValidationThresholds, validate_run
import logging
from types import SimpleNamespace
import numpy as np
import pandas as pd
from validate_fixtures import MAX_TOKENS, error_row, good_row, write_run
from fleetgen.errors import ConfigError, ValidationFailed
from fleetgen.validation import stats_table, suite
from fleetgen.validation.suite import ValidationThresholds, json_safe, load_errors, load_stats, validate_run

ROWS = 200


THRESHOLDS = ValidationThresholds(max_tokens=MAX_TOKENS)


def ids(count: int = ROWS) -> list[str]:
    return [f"p{index:05d}" for index in range(count)]


def rows(count: int = ROWS) -> list[dict]:
    return [good_row(index) for index in range(count)]


def failing(out: Path, expected: list[str], thresholds: ValidationThresholds = THRESHOLDS) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        validate_run(out, expected, thresholds, build_docs=False)
    return caught.value


def entry(summary: dict, name: str) -> dict:
    return next(item for item in summary["expectations"] if item["name"] == name)


def test_a_good_run_passes_with_a_small_json_safe_summary_and_data_docs(tmp_path):
    out = write_run(tmp_path / "run", rows(), errors=[error_row("p00200")])
    summary = validate_run(out, ids(ROWS + 1), THRESHOLDS)
    assert summary["success"] is True and summary["failed_expectations"] == []
    assert (summary["rows"], summary["expected"], summary["completed"], summary["failed_prompts"]) == (200, 201, 200, 1)
    assert summary["missing"] == {"count": 0, "first_ids": []}
    assert summary["duplicates"]["count"] == 0 and summary["unknown_ids"]["count"] == 0
    assert {item["name"] for item in summary["expectations"]} >= {f"{column}_not_null" for column in STATS_COLUMNS
                                                                     if column not in OPTIONAL_STATS_COLUMNS}
    assert all(item["success"] for item in summary["expectations"])
    assert entry(summary, "error_share")["observed"] == pytest.approx(1 / 201, abs=1e-6)
    assert entry(summary, "mean_completion_tokens")["observed"] == pytest.approx(
        sum(row["completion_tokens"] for row in rows()) / ROWS)
    encoded = json.dumps(summary, allow_nan=False)  # XCom: strict JSON, small
    assert len(encoded) < 20_000
    assert summary["data_docs"] == str(out / "validation" / "data_docs" / "index.html")
    assert Path(summary["data_docs"]).is_file()
    assert "fleetgen_completions" in Path(summary["data_docs"]).read_text()
    assert json.loads((out / "validation" / "summary.json").read_text()) == summary


def _mutate(index_step: int, count: int, **changes) -> tuple[list[dict], list[str]]:
    """Rows where every ``index_step``-th row (``count`` of them, from row 5) gets ``changes``; their ids."""
    data = rows()
    touched = [5 + step * index_step for step in range(count)]
    for index in touched:
        data[index].update(changes)
    return data, [f"p{index:05d}" for index in touched]


def _tokens_out_of_range() -> tuple[list[dict], list[str]]:
    data = rows()
    data[5]["completion_tokens"] = 0
    data[9]["completion_tokens"] = MAX_TOKENS + 1
    return data, ["p00005", "p00009"]


MEAN = sum(row["completion_tokens"] for row in rows()) / ROWS


# name: () -> (rows, ids of the offending rows, thresholds, observed value)
CASES = {
    "completion_tokens_in_range": lambda: (*_tokens_out_of_range(), THRESHOLDS, 2),
    "mean_completion_tokens": lambda: (
        rows(), [], ValidationThresholds(max_tokens=MAX_TOKENS, max_mean_completion_tokens=100), MEAN),
    "finish_reason_allowed": lambda: (*_mutate(3, 2, finish_reason="abort"), THRESHOLDS, 2),
    "length_share": lambda: (
        *_mutate(4, 42, finish_reason="length", completion_tokens=MAX_TOKENS), THRESHOLDS, 42 / 200),
    "reasoning_share": lambda: (*_mutate(4, 21, reasoning_chars=0), THRESHOLDS, 1 - 21 / 200),
    "empty_answer_share": lambda: (*_mutate(4, 21, content_chars=0), THRESHOLDS, 21 / 200),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_row_expectation_fails_alone_with_observed_value_and_sample_ids(tmp_path, name):
    data, offending, thresholds, observed = CASES[name]()
    error = failing(write_run(tmp_path / "run", data), ids(), thresholds)
    assert error.summary["failed_expectations"] == [name]
    result = entry(error.summary, name)
    assert result["observed"] == pytest.approx(observed, abs=1e-6)
    assert result["sample_ids"] == offending[:10]
    line = next(text for text in str(error).splitlines() if text.startswith(f"- {name}:"))
    assert f"observed {result['observed']}" in line
    for sample in offending[:10]:
        assert sample in line
    assert error.path == str(tmp_path / "run") and "What to check next" in str(error)


@pytest.mark.parametrize("column", [column for column in STATS_COLUMNS if column not in ("id", *OPTIONAL_STATS_COLUMNS)])
def test_a_null_in_any_column_fails_its_not_null_expectation(tmp_path, column):
    data = rows()
    data[7][column] = None
    error = failing(write_run(tmp_path / "run", data), ids())
    assert error.summary["failed_expectations"] == [f"{column}_not_null"]
    assert entry(error.summary, f"{column}_not_null")["sample_ids"] == ["p00007"]
    assert f"- {column}_not_null: observed 1," in str(error)


def test_a_share_exactly_at_its_threshold_passes(tmp_path):
    data, _ = _mutate(4, 40, finish_reason="length", completion_tokens=MAX_TOKENS)  # 40 / 200 = 0.2
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False)
    assert summary["success"] and entry(summary, "length_share")["observed"] == pytest.approx(0.2)


def test_missing_duplicate_and_unknown_ids_are_counted_and_listed_in_prompt_order(tmp_path):
    data = rows()
    missing = [data.pop(index)["id"] for index in (150, 40, 12)][::-1]  # p00012, p00040, p00150
    data += [dict(data[30]), dict(data[30]), dict(data[3]), good_row(999, id="stranger")]
    error = failing(write_run(tmp_path / "run", data, shards=3), ids())
    summary = error.summary
    assert summary["missing"] == {"count": 3, "first_ids": missing}
    assert summary["duplicates"] == {"count": 2, "extra_rows": 3, "first_ids": ["p00003", "p00031"]}
    assert summary["unknown_ids"] == {"count": 1, "first_ids": ["stranger"]}
    assert set(summary["failed_expectations"]) == {"no_missing_ids", "no_duplicate_ids", "no_unknown_ids"}
    assert entry(summary, "no_missing_ids")["sample_ids"] == missing
    assert entry(summary, "no_duplicate_ids")["sample_ids"] == ["p00003", "p00031"]
    message = str(error)
    assert "- no_missing_ids: observed 3, expected 0 prompts" in message
    assert "p00012, p00040, p00150" in message and "stranger" in message


def test_only_the_first_ten_ids_are_listed(tmp_path):
    data = rows()
    del data[50:80]
    error = failing(write_run(tmp_path / "run", data), ids())
    assert error.summary["missing"] == {"count": 30, "first_ids": [f"p{index:05d}" for index in range(50, 60)]}
    assert entry(error.summary, "no_missing_ids")["sample_ids"] == error.summary["missing"]["first_ids"]


def test_errors_count_toward_the_error_share_not_as_missing(tmp_path):
    data = rows()
    failed_ids = [data.pop(index)["id"] for index in (20, 10, 0)]  # p00000, p00010, p00020 (3 of 200)
    errors = [error_row(prompt_id) for prompt_id in failed_ids] + [error_row("p00100")]  # p00100 retried, done
    out = write_run(tmp_path / "run", data, errors=errors)
    error = failing(out, ids())
    assert error.summary["failed_expectations"] == ["error_share"]
    assert error.summary["missing"]["count"] == 0
    assert (error.summary["failed_prompts"], error.summary["error_records"]) == (3, 4)
    assert entry(error.summary, "error_share")["observed"] == pytest.approx(3 / 200)
    assert entry(error.summary, "error_share")["sample_ids"] == sorted(failed_ids)
    relaxed = ValidationThresholds(max_tokens=MAX_TOKENS, max_error_share=0.02)
    assert validate_run(out, ids(), relaxed, build_docs=False)["success"]


def test_raise_on_failure_false_returns_the_failing_summary(tmp_path):
    data = rows()
    data[4]["finish_reason"] = "abort"
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False,
                           raise_on_failure=False)
    assert summary["success"] is False and summary["failed_expectations"] == ["finish_reason_allowed"]
    json.dumps(summary, allow_nan=False)


def test_no_output_at_all_fails_on_missing_ids(tmp_path):
    error = failing(tmp_path, ids(5))
    assert error.summary["rows"] == 0 and error.summary["stats_files"] == 0
    assert error.summary["missing"]["count"] == 5
    assert "no_missing_ids" in error.summary["failed_expectations"]


def test_validation_and_report_never_open_the_completion_texts(tmp_path):
    """Memory cannot follow text size if the texts are never read: completions/ is not even listed."""
    from fleetgen.report.build import build_report

    out = write_run(tmp_path / "run", rows())
    completions = out / "completions"
    for path in completions.iterdir():  # an open() of these would fail outright
        path.unlink()
        path.mkdir()
    with FileAccessWatch(completions) as watch:
        summary = validate_run(out, ids(), THRESHOLDS)
        build_report(out, run_id="run", plan=None, readiness=None, shard_results=None, validation=summary,
                     previous_report=None)
    assert summary["success"]
    assert watch.touched == []
    with FileAccessWatch(completions) as control:  # the watch itself does see such access
        shutil.disk_usage(completions)
        list(completions.iterdir())
    assert control.touched


def test_a_rerun_rebuilds_data_docs_without_the_earlier_attempt(tmp_path):
    out = write_run(tmp_path / "run", rows(20))
    for _ in range(2):
        summary = validate_run(out, ids(20), THRESHOLDS)
    pages = list((out / "validation" / "data_docs" / "validations").rglob("*.html"))
    assert summary["success"] and len(pages) == 2  # one page per table: completions, coverage


def _stats_file(tmp_path, raw: bytes, name="shard-00000.jsonl"):
    path = tmp_path / "stats" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


def _rows(*indexes):
    return b"".join(json.dumps(good_row(i)).encode() + b"\n" for i in indexes)


def test_a_malformed_complete_last_line_is_an_error_not_a_torn_write(tmp_path):
    path = _stats_file(tmp_path, _rows(0, 1) + b'{"id": "p2", "prompt_tok\n')
    with pytest.raises(ValidationFailed) as caught:
        load_stats(tmp_path)
    assert (caught.value.path, caught.value.line) == (str(path), 3)
    assert caught.value.message.startswith("malformed JSON line (")


def test_line_numbers_count_across_read_chunks(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(stats_table, "_CHUNK_LINES", 2)
    path = _stats_file(tmp_path, _rows(0, 1, 2, 3) + b"[1]\n" + _rows(5))
    with pytest.raises(ValidationFailed) as caught:
        load_stats(tmp_path)
    assert (caught.value.message, caught.value.line) == ("line is not a JSON object", 5)
    _stats_file(tmp_path, _rows(0, 1, 2) + b"\n" + _rows(4) + b'{"id": "torn')
    with caplog.at_level(logging.WARNING):
        stats, info = load_stats(tmp_path, with_info=True)
    assert list(stats["id"]) == ["p00000", "p00001", "p00002", "p00004"]
    assert info == {"files": 1, "torn_lines": [f"{path}:6"]} and f"skipping torn last line {path}:6" in caplog.text


def test_a_torn_line_inside_a_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(stats_table, "_CHUNK_LINES", 2)
    _stats_file(tmp_path, _rows(0) + b'{"id": "x"' + b"\n" + _rows(2, 3))
    with pytest.raises(ValidationFailed) as caught:
        load_stats(tmp_path)
    assert caught.value.line == 2


def test_stats_types_ids_and_shard_order(tmp_path):
    _stats_file(tmp_path, _rows(3) + json.dumps({"id": 17, "completion_tokens": "many"}).encode() + b"\n",
                "shard-00001.jsonl")
    _stats_file(tmp_path, json.dumps({"id": None, "server": "s"}).encode() + b"\n" + _rows(1))
    stats = load_stats(tmp_path)
    assert list(stats.columns) == list(suite.STATS_COLUMNS)
    assert list(stats["id"]) == [None, "p00001", "p00003", "17"]
    assert stats["completion_tokens"].isna().tolist() == [True, False, False, True]
    assert str(stats["server"].dtype) == "category" and str(stats["finish_reason"].dtype) == "category"
    assert stats["latency_s"].dtype == np.float64


def test_errors_table_flattens_code_and_message(tmp_path):
    write_run(tmp_path, [good_row(0)], errors=[error_row("p1"), {"id": "p2", "error": "text", "server": "s"}])
    errors = load_errors(tmp_path)
    assert list(errors.columns) == ["id", "code", "message", "server", "at"]
    assert errors.iloc[0].tolist()[:3] == ["p1", 500, "internal error"]
    assert errors["id"][1] == "p2" and errors["server"][1] == "s"
    assert pd.isna(errors["code"][1]) and pd.isna(errors["message"][1])
    empty = load_errors(tmp_path / "nothing")
    assert list(empty.columns) == ["id", "code", "message", "server", "at"] and len(empty) == 0


def test_coverage_table_outcomes_and_duplicate_expected_ids():
    stats_ids = pd.Series(["b", "a", "b", "zz", None], dtype=object)
    failed_ids = pd.Series(["c", "a", None], dtype=object)
    table, duplicates = suite._coverage(stats_ids, failed_ids, ["a", "b", "c", "d", "a", "c"])
    assert duplicates == 2
    assert table["id"].tolist() == ["a", "b", "c", "d", "zz"]
    assert table["completions"].tolist() == [1, 2, 0, 0, 1]
    assert table["outcome"].tolist() == ["completed", "completed", "failed", "missing", "completed"]
    assert table["expected"].tolist() == [True, True, True, True, False]


@pytest.mark.parametrize("changes, message", [
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ({"max_tokens": True}, "max_tokens must be an integer >= 1, got True"),
    ({"allowed_finish_reasons": []}, "allowed_finish_reasons must be non-empty strings, got ()"),
    ({"allowed_finish_reasons": ["stop", ""]}, "allowed_finish_reasons must be non-empty strings"),
    ({"min_mean_completion_tokens": -1}, "min_mean_completion_tokens must be a number >= 0, got -1"),
    ({"min_mean_completion_tokens": float("nan")}, "min_mean_completion_tokens must be a number >= 0"),
    ({"min_mean_completion_tokens": 5, "max_mean_completion_tokens": 4},
     "max_mean_completion_tokens must be None or >= min_mean_completion_tokens (5), got 4"),
    ({"max_mean_completion_tokens": float("inf")}, "max_mean_completion_tokens must be None or"),
    ({"max_length_share": 1.5}, "max_length_share must be a fraction in [0, 1], got 1.5"),
    ({"min_reasoning_share": -0.1}, "min_reasoning_share must be a fraction in [0, 1]"),
    ({"max_empty_answer_share": "0.1"}, "max_empty_answer_share must be a fraction in [0, 1]"),
    ({"max_error_share": 2}, "max_error_share must be a fraction in [0, 1], got 2"),
])
def test_each_threshold_is_checked(changes, message):
    with pytest.raises(ConfigError) as caught:
        ValidationThresholds(**{"max_tokens": 10, **changes})
    assert caught.value.message.startswith(message)


def test_threshold_edges_are_allowed_and_params_map_back():
    edge = ValidationThresholds(max_tokens=1, min_mean_completion_tokens=0, max_mean_completion_tokens=0,
                                max_length_share=0, min_reasoning_share=1, max_empty_answer_share=1,
                                max_error_share=0)
    assert edge.to_dict()["allowed_finish_reasons"] == ["stop", "length"]
    assert ValidationThresholds.from_mapping({"max_tokens": 5, "max_error_share": None}).max_error_share == 0.01
    with pytest.raises(ConfigError, match="unknown validation threshold\\(s\\): a, b"):
        ValidationThresholds.from_mapping({"max_tokens": 5, "b": 1, "a": 2})
    with pytest.raises(ConfigError, match="validation thresholds need max_tokens"):
        ValidationThresholds.from_mapping({"max_tokens": None})


def test_json_safe_and_mostly():
    value = {1: [np.int64(3), (np.float64("nan"), float("-inf"), 0.5)], "b": np.bool_(True)}
    assert json_safe(value) == {"1": [3, [None, None, 0.5]], "b": True}
    assert suite._mostly(0.9) == pytest.approx(0.9 - 1e-9, abs=0) and suite._mostly(0.0) == 0.0


def _gx_result(kind_body, success=False, exception=None, column="completion_tokens"):
    config = SimpleNamespace(type="expect_x", kwargs={"column": column})
    return SimpleNamespace(result=kind_body, expectation_config=config, success=success,
                           exception_info=exception or {})


def test_reading_a_result_back_per_kind():
    check = suite._Check("empty_answer_share", "completions", "bad_share", "share <= 0.1", None)
    body = {"unexpected_count": 3, "unexpected_percent": 30.0,
            "partial_unexpected_index_list": [{"id": f"p{i}"} for i in range(12)]}
    entry = suite._read_result(check, _gx_result(body))
    assert entry == {"name": "empty_answer_share", "table": "completions", "expectation": "expect_x",
                     "column": "completion_tokens", "success": False, "bound": "share <= 0.1",
                     "unexpected_count": 3, "observed": 0.3, "sample_ids": [f"p{i}" for i in range(10)]}
    assert suite._describe(entry) == ("- empty_answer_share: observed 0.3 (3 rows), expected share <= 0.1; "
                                      "sample ids: " + ", ".join(f"p{i}" for i in range(10)))
    good = suite._read_result(suite._Check("r", "completions", "good_share", "b", None), _gx_result(body))
    assert good["observed"] == 0.7
    count = suite._read_result(suite._Check("c", "coverage", "count", "0 rows", None), _gx_result({}, success=True))
    assert (count["observed"], count["unexpected_count"], count["sample_ids"], count["success"]) == (0, 0, [], True)
    assert suite._describe(count) == "- c: observed 0, expected 0 rows"
    mean = suite._read_result(suite._Check("m", "completions", "mean", "mean in [1, inf]", None),
                              _gx_result({"observed_value": 2.123456}, success=True,
                                         exception={"raised_exception": True, "exception_message": "boom"}))
    assert (mean["observed"], mean["success"], mean["error"], mean["sample_ids"]) == (2.1235, False, "boom", [])
    assert suite._describe(mean) == "- m: observed 2.1235, expected mean in [1, inf]; error: boom"
    assert suite._read_result(suite._Check("m", "completions", "mean", "b", None),
                              _gx_result(None))["observed"] is None


def test_summary_counts_missing_duplicate_unknown_and_repeated_expected_ids(tmp_path):
    rows = [good_row(i) for i in range(6)] + [good_row(2), good_row(9)]
    out = write_run(tmp_path / "run", rows, errors=[error_row("p00007")])
    expected = [f"p{i:05d}" for i in range(9)] + ["p00001"]
    with pytest.raises(ValidationFailed) as caught:
        validate_run(out, expected, ValidationThresholds(max_tokens=MAX_TOKENS, max_error_share=1),
                     build_docs=False)
    summary = caught.value.summary
    assert summary["expected_duplicate_ids"] == 1 and summary["expected"] == 9
    assert (summary["rows"], summary["completed"], summary["failed_prompts"], summary["error_records"]) == (8, 7, 1, 1)
    assert summary["missing"] == {"count": 2, "first_ids": ["p00006", "p00008"]}
    assert summary["duplicates"] == {"count": 1, "extra_rows": 1, "first_ids": ["p00002"]}
    assert summary["unknown_ids"] == {"count": 1, "first_ids": ["p00009"]}
    assert summary["failed_expectations"] == ["no_missing_ids", "no_duplicate_ids", "no_unknown_ids"]
    assert caught.value.message.startswith("validation failed: 3 of ")
    assert "(8 completion rows, 9 prompts)\n- no_missing_ids: observed 2, expected 0 prompts" in caught.value.message
    assert json.loads((out / "validation" / "summary.json").read_text()) == summary


def test_errors_tables_from_several_files_with_a_torn_last_line(tmp_path):
    folder = tmp_path / "errors"
    folder.mkdir()
    (folder / "shard-00000.jsonl").write_text(json.dumps(error_row("p1")) + "\n")
    (folder / "shard-00001.jsonl").write_text(json.dumps(error_row("p2")) + "\n" + '{"id": "p3", "err')
    errors = load_errors(tmp_path)
    assert errors["id"].tolist() == ["p1", "p2"] and errors.index.tolist() == [0, 1]


def test_empty_stats_keep_their_column_types_and_warn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        stats = load_stats(tmp_path)
    assert {c: str(t) for c, t in stats.dtypes.items()} == {
        "id": "object", "prompt_tokens": "float64", "completion_tokens": "float64", "finish_reason": "object",
        "reasoning_chars": "float64", "content_chars": "float64", "server": "object", "latency_s": "float64",
        "finished_at": "float64", "reused_from": "object"}
    assert f"no stats files under {tmp_path / 'stats'}" in caplog.text
    caplog.clear()
    _stats_file(tmp_path, _rows(0))
    with caplog.at_level(logging.WARNING):
        load_stats(tmp_path)
    assert "no stats files" not in caplog.text


def test_the_line_by_line_path_keeps_lines_after_a_blank_one_and_names_everything(tmp_path, caplog):
    path = _stats_file(tmp_path, _rows(0, 1) + b"\n" + _rows(2) + b'{"id": "torn')
    with caplog.at_level(logging.WARNING):
        stats, info = load_stats(tmp_path, with_info=True)
    assert list(stats["id"]) == ["p00000", "p00001", "p00002"] and info["torn_lines"] == [f"{path}:5"]
    assert [r.getMessage() for r in caplog.records] == [f"skipping torn last line {path}:5"]
    _stats_file(tmp_path, _rows(0) + b'{"id": "bad\n' + _rows(2))
    with pytest.raises(ValidationFailed) as malformed:
        load_stats(tmp_path)
    assert malformed.value.hint == "the file was edited or corrupted; regenerate this shard"
    _stats_file(tmp_path, _rows(0) + b"[1]\n")
    with pytest.raises(ValidationFailed) as not_object:
        load_stats(tmp_path)
    assert (not_object.value.path, not_object.value.line) == (str(path), 2)


def test_each_expectation_names_the_column_it_checks(tmp_path):
    summary = validate_run(write_run(tmp_path / "run", rows(20)), ids(20), THRESHOLDS, build_docs=False)
    assert summary["success"] and all(item["success"] for item in summary["expectations"])
    columns = {item["name"]: item["column"] for item in summary["expectations"]}
    assert columns == {
        **{f"{column}_not_null": column for column in STATS_COLUMNS if column not in OPTIONAL_STATS_COLUMNS},
        "completion_tokens_in_range": suite.TOKEN_SHARE_COLUMN,
        "mean_completion_tokens": "completion_tokens",
        "finish_reason_allowed": "finish_reason",
        "length_share": "finish_reason",
        "reasoning_share": "reasoning_chars",
        "empty_answer_share": "content_chars",
        "no_missing_ids": "outcome",
        "no_duplicate_ids": "completions",
        "no_unknown_ids": "expected",
        "error_share": "outcome",
    }


def test_the_summary_gives_the_validation_time_to_the_millisecond(tmp_path, monkeypatch):
    clock = iter([1000.0, 1012.3456789])
    monkeypatch.setattr(suite, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    out = write_run(tmp_path / "run", rows(20))
    summary = validate_run(out, ids(20), THRESHOLDS, build_docs=False)
    assert summary["seconds"] == 12.346
    assert json.loads((out / "validation" / "summary.json").read_text())["seconds"] == 12.346


def test_a_row_without_its_own_max_tokens_stays_bounded_by_the_runs(tmp_path):
    data = rows()
    data[3]["completion_tokens"] = 2 * MAX_TOKENS  # its prompt asked for up to 2x the run's budget
    data[8]["completion_tokens"] = MAX_TOKENS + 1  # its prompt has no max_tokens of its own
    summary = validate_run(write_run(tmp_path / "run", data), ids(), THRESHOLDS, build_docs=False,
                           raise_on_failure=False, own_max_tokens={"p00003": 2 * MAX_TOKENS})
    assert summary["failed_expectations"] == ["completion_tokens_in_range"]
    assert (entry(summary, "completion_tokens_in_range")["observed"],
            entry(summary, "completion_tokens_in_range")["sample_ids"]) == (1, ["p00008"])


def test_without_prompts_of_their_own_max_tokens_the_bound_names_only_the_runs():
    check = next(check for check in suite._checks(THRESHOLDS, ["id"]) if check.name == "completion_tokens_in_range")
    assert check.bound == f"0 rows outside [1, {MAX_TOKENS}]"


def test_a_working_copy_of_a_run_is_named_by_where_people_find_the_run(tmp_path):
    data = rows()
    data[4]["finish_reason"] = "abort"
    out = write_run(tmp_path / "copy", data)
    with pytest.raises(ValidationFailed) as caught:
        validate_run(out, ids(), THRESHOLDS, location="s3://runs/night1")
    summary = caught.value.summary
    assert summary["out_dir"] == "s3://runs/night1" and caught.value.path == "s3://runs/night1"
    assert summary["data_docs"] == "s3://runs/night1/validation/data_docs/index.html"
    assert caught.value.hint.startswith("open s3://runs/night1/validation/data_docs/index.html for every expectation")
    without_docs = validate_run(out, ids(), THRESHOLDS, location="s3://runs/night1", build_docs=False,
                                raise_on_failure=False)
    assert without_docs["data_docs"] is None
    with pytest.raises(ValidationFailed) as plain:
        validate_run(out, ids(), THRESHOLDS, build_docs=False)
    assert plain.value.path == str(out)
    assert plain.value.hint.startswith(f"open {out / 'validation' / 'summary.json'} for every expectation")
