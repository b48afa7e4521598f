"""ValidationThresholds self-checks and the stats/errors readers."""

from __future__ import annotations

import json
import math
import pytest
from validate_fixtures import error_row, good_row, write_jsonl, write_run
from fleetgen.errors import ConfigError, ValidationFailed
from fleetgen.validation.suite import STATS_COLUMNS, ValidationThresholds, load_errors, load_stats
import logging
from fleetgen.validation.stats_table import STATS_COLUMNS, load_stats

@pytest.mark.parametrize("changes", [
    {"max_tokens": 0}, {"max_tokens": 1.5}, {"max_tokens": True},
    {"max_length_share": 1.2}, {"min_reasoning_share": -0.1}, {"max_error_share": math.nan},
    {"max_empty_answer_share": "0.1"}, {"min_mean_completion_tokens": -1},
    {"min_mean_completion_tokens": 10, "max_mean_completion_tokens": 5}, {"allowed_finish_reasons": ()},
    {"allowed_finish_reasons": ("stop", "")},
])
def test_thresholds_reject_bad_values(changes):
    with pytest.raises(ConfigError):
        ValidationThresholds(**{"max_tokens": 100, **changes})


def test_thresholds_from_dag_params():
    thresholds = ValidationThresholds.from_mapping(
        {"max_tokens": 4096, "allowed_finish_reasons": ["stop"], "max_mean_completion_tokens": None})
    assert thresholds.allowed_finish_reasons == ("stop",)
    assert thresholds.max_mean_completion_tokens is None
    assert thresholds.to_dict()["allowed_finish_reasons"] == ["stop"]
    json.dumps(thresholds.to_dict())
    with pytest.raises(ConfigError, match="max_tkens"):
        ValidationThresholds.from_mapping({"max_tokens": 10, "max_tkens": 5})
    with pytest.raises(ConfigError, match="need max_tokens"):
        ValidationThresholds.from_mapping({"max_tokens": None})


def test_load_stats_concatenates_shards_in_order_with_compact_dtypes(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(10)], shards=3)
    stats = load_stats(out)
    assert list(stats.columns) == list(STATS_COLUMNS)
    assert list(stats["id"]) == [f"p{index:05d}" for index in range(10)]
    assert stats["completion_tokens"].dtype.kind == "i"
    assert str(stats["finish_reason"].dtype) == "category"
    assert str(stats["server"].dtype) == "category"
    assert stats["completion_tokens"].sum() == sum(good_row(index)["completion_tokens"] for index in range(10))


def test_load_stats_nulls_missing_keys_and_non_numbers_become_nan(tmp_path):
    rows = [good_row(0), good_row(1, completion_tokens=None, id=None), good_row(2, latency_s="slow"),
            {key: value for key, value in good_row(3).items() if key != "server"}, good_row(4, id=17)]
    stats = load_stats(write_run(tmp_path / "run", rows, shards=1))
    assert stats["completion_tokens"].isna().tolist() == [False, True, False, False, False]
    assert stats["latency_s"].isna().tolist() == [False, False, True, False, False]
    assert stats["server"].isna().tolist() == [False, False, False, True, False]
    assert stats["id"].tolist() == ["p00000", None, "p00002", "p00003", "17"]


def test_load_stats_skips_a_torn_last_line_and_reports_it(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(4)], shards=1)
    path = out / "stats" / "shard-00000.jsonl"
    path.write_text(path.read_text() + json.dumps(good_row(4))[:25])  # crash mid-write: no newline
    stats, info = load_stats(out, with_info=True)
    assert len(stats) == 4
    assert info == {"files": 1, "torn_lines": [f"{path}:5"]}


def test_load_stats_names_file_and_line_of_a_malformed_line(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(4)], shards=1)
    path = out / "stats" / "shard-00000.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(2, "{not json}\n")
    path.write_text("".join(lines))
    with pytest.raises(ValidationFailed) as caught:
        load_stats(out)
    assert caught.value.path == str(path) and caught.value.line == 3
    assert f"{path}:3" in str(caught.value)


def test_load_stats_on_an_empty_output_folder(tmp_path):
    stats = load_stats(tmp_path)
    assert list(stats.columns) == list(STATS_COLUMNS) and len(stats) == 0


def test_load_errors_flattens_the_error_object(tmp_path):
    write_jsonl(tmp_path / "errors" / "shard-00003.jsonl", [error_row("p1"), error_row("p2", server="node-b:30000")])
    errors = load_errors(tmp_path)
    assert errors["id"].tolist() == ["p1", "p2"]
    assert errors["code"].tolist() == [500, 500]
    assert errors["message"].tolist() == ["internal error"] * 2
    assert errors["server"].tolist() == ["node-a:30000", "node-b:30000"]
    assert len(load_errors(tmp_path / "nothing-here")) == 0


def test_no_stats_files_is_an_empty_table_and_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fleetgen.validation.stats_table"):
        stats = load_stats(tmp_path)
    assert stats.empty and list(stats.columns) == list(STATS_COLUMNS)
    assert [record.getMessage() for record in caplog.records] == [f"no stats files under {tmp_path / 'stats'}"]


def test_ids_that_differ_only_by_a_trailing_nul_stay_distinct(tmp_path):
    rows = [good_row(0, id="z"), good_row(1, id="z\u0000"), good_row(2, id="\u0000")]
    stats = load_stats(write_run(tmp_path / "run", rows, shards=1))
    assert stats["id"].tolist() == ["z", "z\u0000", "\u0000"]


def test_a_stats_shard_of_blank_lines_adds_no_rows(tmp_path):
    out = write_run(tmp_path / "run", [good_row(index) for index in range(3)], shards=1)
    (out / "stats" / "shard-00001.jsonl").write_text("\n\n")
    stats = load_stats(out)
    assert stats["id"].tolist() == ["p00000", "p00001", "p00002"]
    assert stats["completion_tokens"].tolist() == [good_row(index)["completion_tokens"] for index in range(3)]
