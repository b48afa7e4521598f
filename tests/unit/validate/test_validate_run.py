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
