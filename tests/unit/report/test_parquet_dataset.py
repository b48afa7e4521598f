"""A validated run's completions as a Parquet dataset: one file per shard, the record's columns, loadable by
pyarrow.dataset and pandas, written whole, and a line that cannot go in named by file and line."""

import json

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from fleetgen.errors import OutputError, ValidationFailed
from fleetgen.outputs import RunLayout
from fleetgen.report import parquet_dataset
from fleetgen.report.parquet_dataset import SCHEMA, write_parquet_dataset


def completion(prompt_id, **extra):
    record = {"id": prompt_id, "messages": [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": f"question {prompt_id}"}],
              "reasoning_content": "Let me think.", "content": f"answer {prompt_id}", "finish_reason": "stop",
              "usage": {"prompt_tokens": 12, "completion_tokens": 34}, "server": "n0:30000", "latency_s": 1.5,
              "model": "qwen3.6-27b", "sampling": {"max_tokens": 64, "temperature": 0.6}, "finished_at": 1764400000.5}
    record.update(extra)
    return record


def write_shard(layout, shard_id, records):
    path = layout.shard_file("completions", shard_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_every_completion_becomes_one_row_of_its_shards_file(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_dataset, "ROW_GROUP_ROWS", 2)
    layout = RunLayout(tmp_path / "run")
    write_shard(layout, 0, [completion(f"a{n}") for n in range(5)])
    multimodal = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}]}]
    write_shard(layout, 3, [completion("plain", messages=None, prompt="Say hi.", sampling=None),
                            completion("parts", messages=multimodal, reused_from="night-1")])
    with layout.shard_file("completions", 3).open("r+") as handle:  # a blank line between two completions
        lines = handle.read().splitlines(keepends=True)
        handle.seek(0)
        handle.write(lines[0] + "\n" + lines[1])
    written = write_parquet_dataset(layout)
    assert (written.files, written.rows, written.folder) == (2, 7, str(layout.dataset_dir))
    assert written.to_dict() == {"folder": str(layout.dataset_dir), "files": 2, "rows": 7}
    assert sorted(path.name for path in layout.dataset_dir.iterdir()) == ["shard-00000.parquet", "shard-00003.parquet"]
    assert pq.ParquetFile(layout.dataset_dir / "shard-00000.parquet").metadata.num_row_groups == 3
    table = ds.dataset(layout.dataset_dir, format="parquet").to_table()
    assert table.schema == SCHEMA and table.num_rows == 7
    rows = {row["id"]: row for row in table.to_pylist()}
    assert rows["a0"] == {"id": "a0", "messages": [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": "question a0"}],
                          "prompt": None, "reasoning_content": "Let me think.", "content": "answer a0",
                          "finish_reason": "stop", "prompt_tokens": 12, "completion_tokens": 34, "model": "qwen3.6-27b",
                          "server": "n0:30000", "latency_s": 1.5, "finished_at": 1764400000.5,
                          "sampling": '{"max_tokens":64,"temperature":0.6}', "reused_from": None}
    assert rows["plain"]["messages"] is None and rows["plain"]["prompt"] == "Say hi."
    assert rows["plain"]["sampling"] is None
    metadata = pq.ParquetFile(layout.dataset_dir / "shard-00003.parquet").metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert json.loads(rows["parts"]["messages"][0]["content"]) == [{"type": "text", "text": "what is this?"}]
    assert rows["parts"]["reused_from"] == "night-1"
    frame = pd.read_parquet(layout.dataset_dir)
    assert sorted(frame["id"]) == sorted(rows) and frame["completion_tokens"].sum() == 7 * 34


def test_a_second_write_gives_the_same_rows_and_leaves_no_temporary_file(tmp_path):
    layout = RunLayout(tmp_path / "run")
    write_shard(layout, 1, [completion(f"a{n}") for n in range(3)])
    write_parquet_dataset(layout)
    first = ds.dataset(layout.dataset_dir).to_table()
    write_parquet_dataset(layout)
    assert ds.dataset(layout.dataset_dir).to_table().equals(first)
    assert [path.name for path in layout.dataset_dir.iterdir()] == ["shard-00001.parquet"]


def test_a_line_that_cannot_go_in_is_named_and_nothing_half_written_is_left(tmp_path):
    layout = RunLayout(tmp_path / "run")
    write_shard(layout, 2, [completion("a0")])
    with layout.shard_file("completions", 2).open("a") as handle:
        handle.write('{"no id": true}\n')
    with pytest.raises(ValidationFailed) as failed:
        write_parquet_dataset(layout)
    assert failed.value.path == str(layout.shard_file("completions", 2)) and failed.value.line == 2
    assert "cannot go into the dataset" in failed.value.message
    assert failed.value.hint == "the file was edited or corrupted after validation; regenerate this shard"
    assert list(layout.dataset_dir.iterdir()) == []


def test_a_dataset_folder_that_cannot_be_written_is_named(tmp_path):
    layout = RunLayout(tmp_path / "run")
    write_shard(layout, 0, [completion("a0")])
    (layout.dataset_dir / "shard-00000.parquet").mkdir(parents=True)  # a folder where the file goes
    with pytest.raises(OutputError) as failed:
        write_parquet_dataset(layout)
    assert failed.value.path == str(layout.dataset_dir / "shard-00000.parquet")
    assert failed.value.message == f"cannot write {failed.value.path}: Is a directory" and failed.value.errno == 21
    assert failed.value.hint == ("free space where the DAG parameter output_root points (or FLEETGEN_OUTPUT_ROOT), "
                                 "then clear this task")
    assert [path.name for path in layout.dataset_dir.iterdir()] == ["shard-00000.parquet"]  # no partial left
