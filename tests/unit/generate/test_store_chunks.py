"""Reading the shard's output backwards at every chunk edge: a resume after a crash restores the stats rows
of the completions written after the last one, whatever the file size modulo the read chunk."""

import json

import pytest

from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore, _lines_backwards

SHARD = {"shard_id": 4, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}


def record(store, prompt_id):
    line = {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "reasoning_content": "r",
            "content": f"the answer to {prompt_id}", "finish_reason": "stop",
            "usage": {"prompt_tokens": 3, "completion_tokens": 9}, "server": "h:1", "latency_s": 1.5,
            "model": "m", "sampling": {}, "finished_at": 1.0}
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


def test_lines_read_backwards_at_every_chunk_size(tmp_path, monkeypatch):
    lines = [b"a b\n", b"cd e\n", b"f\n", b"ghij k\n"]
    path = tmp_path / "f"
    path.write_bytes(b"".join(lines))
    for chunk in range(1, len(path.read_bytes()) + 2):  # every remainder, the one-byte first read included
        monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", chunk)
        assert list(_lines_backwards(path)) == lines[::-1], chunk


@pytest.mark.parametrize("short_of_the_file", [1, 2, 3])
def test_a_crash_before_any_stats_row_is_repaired_whatever_the_chunk_edges(tmp_path, monkeypatch, short_of_the_file):
    store, _ = ShardStore.open(tmp_path, SHARD)
    for prompt_id in ("a", "b", "c"):
        record(store, prompt_id)
    store.close()
    store.stats_path.write_bytes(b"")  # killed before any stats row reached the disk
    # The chunk leaves the completions file's first bytes to a last, short read.
    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK",
                        store.completions_path.stat().st_size - short_of_the_file)
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert (report.finished, report.restored_stats) == (3, 3)
    assert [json.loads(line)["id"] for line in store.stats_path.read_text().splitlines()] == ["a", "b", "c"]
