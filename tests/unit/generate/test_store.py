import json

import pytest

from fleetgen.errors import GenerationError
from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore, _lines_backwards

SHARD = {"shard_id": 3, "input_path": "/data/prompts.jsonl", "start": 0, "count": 100}


def completion(prompt_id, text="answer"):
    return {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "reasoning_content": "think",
            "content": text, "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 9},
            "server": "h:1", "latency_s": 1.5, "model": "m", "sampling": {}, "finished_at": 1.0}


def record(store, prompt_id, text="answer"):
    line = completion(prompt_id, text)
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


def ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_fresh_store_then_resume_sees_what_was_recorded(tmp_path):
    store, report = ShardStore.open(tmp_path, SHARD)
    assert (report.finished, report.failed) == (0, 0)
    record(store, "a")
    record(store, 'quote"d')  # an id that takes the slow path
    store.record_failure(jsonio.dumps({"id": "e", "status": "failed", "fault": "prompt"}) + b"\n", "e")
    store.close()
    store, report = ShardStore.open(tmp_path, SHARD)
    assert store.done_ids == {b"a", b'quote"d', b"e"}
    assert (report.finished, report.failed, report.torn_bytes, report.restored_stats) == (2, 1, {}, 0)
    store.close()
    assert (tmp_path / "shards" / "shard-00003.json").exists()


@pytest.mark.parametrize("cut_completions, cut_stats, expected_restored", [
    (0, 0, 0),
    (0, 40, 1),  # the last stats row torn: rebuilt from its completion line
    (30, None, 0),  # the last completion torn, its stats row never written
    (0, None, 1),  # completion written, killed before its stats row
])
def test_kill_points_between_the_two_writes(tmp_path, cut_completions, cut_stats, expected_restored):
    store, _ = ShardStore.open(tmp_path, SHARD)
    for prompt_id in ("a", "b"):
        record(store, prompt_id)
    store.close()
    completions, stats = store.completions_path, store.stats_path
    stats_lines = stats.read_bytes().splitlines(keepends=True)
    # Simulate the state a kill -9 left: trim bytes off the last writes.
    if cut_completions:
        completions.write_bytes(completions.read_bytes()[:-cut_completions])
    if cut_stats is None:
        stats.write_bytes(stats_lines[0])
    elif cut_stats:
        stats.write_bytes(stats.read_bytes()[:-cut_stats])
    store, report = ShardStore.open(tmp_path, SHARD)
    expected_ids = ["a"] if cut_completions else ["a", "b"]
    assert sorted(store.done_ids) == [i.encode() for i in expected_ids]
    assert report.restored_stats == expected_restored
    record(store, "c")
    store.close()
    assert ids(completions) == expected_ids + ["c"]
    assert ids(stats) == expected_ids + ["c"]
    if not cut_completions:
        assert json.loads(stats.read_text().splitlines()[1]) == stats_record(completion("b"))


def test_torn_error_line_is_cut(tmp_path):
    store, _ = ShardStore.open(tmp_path, SHARD)
    store.record_failure(b'{"id":"e1","status":"failed","fault":"prompt"}\n', "e1")
    store.close()
    with store.errors_path.open("ab") as handle:
        handle.write(b'{"id":"e2","sta')
    store, report = ShardStore.open(tmp_path, SHARD)
    assert store.done_ids == {b"e1"} and report.torn_bytes == {"errors": 15}
    store.close()


def test_resume_reads_only_the_tail_of_the_completions(tmp_path, monkeypatch):
    store, _ = ShardStore.open(tmp_path, SHARD)
    for number in range(300):
        record(store, f"p{number}", text="x" * 10_000)
    store.close()
    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", 64 * 1024)
    reads = []
    real_open = type(store.completions_path).open

    def counting_open(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if self == store.completions_path and "b" in mode:
            real_read = handle.read
            handle.read = lambda size=-1: reads.append(len(chunk := real_read(size))) or chunk
        return handle

    monkeypatch.setattr(type(store.completions_path), "open", counting_open)
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert report.finished == 300
    assert sum(reads) <= 2 * 64 * 1024 < store.completions_path.stat().st_size / 10


def test_mismatched_files_are_refused(tmp_path):
    store, _ = ShardStore.open(tmp_path, SHARD)
    record(store, "a")
    record(store, "b")
    store.close()
    store.completions_path.write_bytes(b"")
    with pytest.raises(GenerationError, match="not in the completions file") as caught:
        ShardStore.open(tmp_path, SHARD)
    assert caught.value.shard == 3 and "What to check next" in str(caught.value)


def test_a_different_plan_is_refused(tmp_path):
    ShardStore.open(tmp_path, SHARD)[0].close()
    with pytest.raises(GenerationError, match="different plan"):
        ShardStore.open(tmp_path, {**SHARD, "count": 50})


def test_lines_backwards_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", 7)
    path = tmp_path / "f"
    lines = [b"a" * n + b"\n" for n in (1, 12, 3, 7, 6, 20)]
    path.write_bytes(b"".join(lines))
    assert list(_lines_backwards(path)) == lines[::-1]


def test_the_mark_lets_resume_start_reading_prompts_past_the_finished_ones(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{n}", "prompt": f"say {n}"}) + "\n" for n in range(6)))
    shard = {"shard_id": 0, "input_path": str(prompts), "start": 0, "count": 6}
    store, _ = ShardStore.open(tmp_path / "out", shard)
    assert [p.id for _, _, _, p in store.pending_prompts(shard)] == [f"q{n}" for n in range(6)]
    positions = {p.id: (index, start) for index, start, _, p in store.pending_prompts(shard)}
    for prompt_id in ("q0", "q1", "q3"):
        record(store, prompt_id)
    store.save_mark(*positions["q2"])  # q0, q1 finished; q2 in flight; q3 finished out of order
    store.close()
    store, _ = ShardStore.open(tmp_path / "out", shard)
    assert store.mark == positions["q2"]
    assert [(index, p.id) for index, _, _, p in store.pending_prompts(shard)] == [(2, "q2"), (4, "q4"), (5, "q5")]
    store.close()
    store.mark_path.write_text("{not json")
    store, _ = ShardStore.open(tmp_path / "out", shard)
    assert store.mark is None  # an unreadable mark costs a full read, never a skipped prompt
    assert [p.id for _, _, _, p in store.pending_prompts(shard)] == ["q2", "q4", "q5"]
    store.save_mark(*positions["q2"])
    store.close()
    for kind in ("completions", "stats"):
        (tmp_path / "out" / kind / "shard-00000.jsonl").unlink()
    store, _ = ShardStore.open(tmp_path / "out", shard)
    assert store.mark is None  # a mark whose records are gone skips nothing
    assert len(list(store.pending_prompts(shard))) == 6
    store.close()
