"""Shard store repair and resume at the edges: several orphan completions, chunk and block boundaries,
unreadable lines, marks that do not fit the output."""

import json
import logging

import pytest

from fleetgen.errors import GenerationError
from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore

SHARD = {"shard_id": 7, "input_path": "/data/prompts.jsonl", "start": 100, "count": 10}


def completion(prompt_id):
    return {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "reasoning_content": "r",
            "content": "an answer in words", "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 9},
            "server": "h:1", "latency_s": 1.5, "model": "m", "sampling": {}, "finished_at": 1.0}


def record(store, prompt_id):
    line = completion(prompt_id)
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


def ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def _written(tmp_path, prompt_ids):
    store, _ = ShardStore.open(tmp_path, SHARD)
    for prompt_id in prompt_ids:
        record(store, prompt_id)
    store.close()
    return store


def test_two_orphan_completions_get_their_stats_rows_in_order_and_the_store_reopens(tmp_path, caplog):
    store = _written(tmp_path, ["a", "b", "c"])
    store.stats_path.write_bytes(store.stats_path.read_bytes().splitlines(keepends=True)[0])  # b, c lost
    with caplog.at_level(logging.WARNING):
        store, report = ShardStore.open(tmp_path, SHARD, log=logging.getLogger("t"))
    assert (report.finished, report.restored_stats, report.torn_bytes) == (3, 2, {})
    assert "shard 7: repaired output after an interrupted run: cut torn last lines {}, rebuilt 2 stats rows" \
        in caplog.text
    record(store, "d")
    store.close()
    assert ids(store.stats_path) == ids(store.completions_path) == ["a", "b", "c", "d"]
    store, report = ShardStore.open(tmp_path, SHARD)  # a wrong order would be refused here
    assert (report.finished, report.restored_stats) == (4, 0)
    store.close()


def test_no_stats_at_all_rebuilds_every_row(tmp_path):
    store = _written(tmp_path, ["a", "b"])
    store.stats_path.write_bytes(b"")
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert report.restored_stats == 2 and ids(store.stats_path) == ["a", "b"]


def test_a_completion_after_the_last_stats_row_that_is_already_recorded_is_refused(tmp_path):
    store = _written(tmp_path, ["a", "b"])
    with store.completions_path.open("ab") as handle:
        handle.write(jsonio.dumps(completion("a")) + b"\n")
    with pytest.raises(GenerationError) as caught:
        ShardStore.open(tmp_path, SHARD)
    assert caught.value.message.startswith("completion 'a' is after the last stats row but already recorded")
    assert (caught.value.shard, caught.value.path) == (7, str(store.completions_path))


def test_missing_last_stats_completion_names_the_count_and_id(tmp_path):
    store = _written(tmp_path, ["a", "b"])
    store.completions_path.write_bytes(jsonio.dumps(completion("z")) + b"\n")  # replaced by another file
    with pytest.raises(GenerationError) as caught:
        ShardStore.open(tmp_path, SHARD)
    assert caught.value.message == ("the stats file lists 2 finished prompts but its last one ('b') is not in "
                                    "the completions file")


def test_torn_tails_longer_than_a_read_chunk_are_cut_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", 5)
    store = _written(tmp_path, ["a", "b"])
    whole = store.completions_path.read_bytes()
    store.completions_path.write_bytes(whole + b'{"id":"c","messages":[1,2,3')
    store.errors_path.write_bytes(b'{"id":"torn-without-any-newline"')
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert report.torn_bytes == {"completions": 27, "errors": 32}
    assert store.completions_path.read_bytes() == whole and store.errors_path.read_bytes() == b""


def test_stats_ids_are_read_across_block_boundaries_and_escaped_ids_take_the_slow_path(tmp_path, monkeypatch):
    monkeypatch.setattr("fleetgen.generate.store.BLOCK", 16)
    names = ["a", 'q"uote', "b" * 40, "c"]
    _written(tmp_path, names)
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert store.done_ids == {n.encode() for n in names} and report.finished == 4


@pytest.mark.parametrize("kind, line_number", [("errors", 2), ("stats", None)])
def test_an_unreadable_line_names_its_file_and_line(tmp_path, kind, line_number):
    store = _written(tmp_path, ["a"])
    with (tmp_path / kind / "shard-00007.jsonl").open("ab") as handle:
        if kind == "errors":
            handle.write(b'{"id":"e","status":"failed"}\n')
        handle.write(b"not json at all\n")
    with pytest.raises(GenerationError) as caught:
        ShardStore.open(tmp_path, SHARD)
    assert caught.value.message.startswith("unreadable line in the shard's output: b'not json at all")
    assert (caught.value.path, caught.value.line) == (str(tmp_path / kind / "shard-00007.jsonl"), line_number)
    assert "remove the shard's output files" in caught.value.hint


@pytest.mark.parametrize("mark, kept", [
    ({"valid_before": 2, "offset": 100}, (2, 100)),
    ({"valid_before": 0, "offset": 500}, (0, 500)),
    ({"valid_before": 3, "offset": 500}, None),    # more finished than the records on disk
    ({"valid_before": 2, "offset": 99}, None),     # before the shard's first byte
    ({"valid_before": -1, "offset": 500}, None),
    ({"valid_before": 2}, None),
    ({"valid_before": "x", "offset": 1}, None),
])
def test_a_mark_is_kept_only_when_it_fits_the_output(tmp_path, caplog, mark, kept):
    _written(tmp_path, ["a", "b"])
    (tmp_path / "shards" / "shard-00007.mark.json").write_text(json.dumps(mark))
    with caplog.at_level(logging.WARNING):
        store, _ = ShardStore.open(tmp_path, SHARD, log=logging.getLogger("t"))
    store.close()
    assert store.mark == kept
    assert store.resume_point(SHARD) == (kept or (0, 100))
    assert ("shard 7:" in caplog.text) == (kept is None)


def test_saving_the_same_mark_again_writes_nothing(tmp_path):
    store, _ = ShardStore.open(tmp_path, SHARD)
    store.save_mark(1, 150)
    assert json.loads(store.mark_path.read_text()) == {"valid_before": 1, "offset": 150}
    store.mark_path.unlink()
    store.save_mark(1, 150)
    assert not store.mark_path.exists()
    store.save_mark(2, 160)
    assert json.loads(store.mark_path.read_text()) == {"valid_before": 2, "offset": 160}
    store.close()
    plan = json.loads(store.plan_path.read_text())
    assert plan == {"shard_id": 7, "input_path": "/data/prompts.jsonl", "start": 100, "count": 10}


def test_a_different_plan_names_both(tmp_path):
    ShardStore.open(tmp_path, SHARD)[0].close()
    with pytest.raises(GenerationError) as caught:
        ShardStore.open(tmp_path, {**SHARD, "start": 0})
    assert caught.value.message.startswith("this shard's output was written for a different plan")
    assert "'start': 100" in caught.value.message and caught.value.path.endswith("shard-00007.json")


def test_fresh_files_are_created_private_to_the_user_and_nothing_is_reported_torn(tmp_path):
    store, report = ShardStore.open(tmp_path, SHARD)
    assert (report.finished, report.failed, report.torn_bytes, report.restored_stats) == (0, 0, {}, 0)
    for path in (store.completions_path, store.stats_path, store.errors_path):
        assert path.stat().st_mode & 0o777 == 0o644 & ~_umask()
    record(store, "a")
    store.record_failure(b'{"id":"e1","fault":"prompt"}\n', "e1")
    store.record_failure(b'{"id":"e2","fault":"prompt"}\n', "e2")
    assert store.done_ids == {b"a", b"e1", b"e2"}
    store.close()
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert (report.finished, report.failed) == (1, 2)


def _umask():
    import os
    current = os.umask(0)
    os.umask(current)
    return current


def test_a_one_byte_torn_stats_file_is_cut_and_logged(tmp_path, caplog):
    store = _written(tmp_path, [])
    store.stats_path.write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        store, report = ShardStore.open(tmp_path, SHARD, log=logging.getLogger("t"))
    store.close()
    assert report.torn_bytes == {"stats": 1} and store.stats_path.read_bytes() == b""
    assert "cut torn last lines {'stats': 1}, rebuilt 0 stats rows" in caplog.text


def test_errors_say_what_to_do(tmp_path):
    store = _written(tmp_path, ["a"])
    long_line = b"y" * 300 + b"\n"
    with store.errors_path.open("ab") as handle:
        handle.write(long_line)
    with pytest.raises(GenerationError) as unreadable:
        ShardStore.open(tmp_path, SHARD)
    assert unreadable.value.message == f"unreadable line in the shard's output: {long_line[:120]!r}"
    assert unreadable.value.hint == ("this file is written only by fleetgen; restore it or remove the shard's output "
                                     "files to regenerate the shard")
    store.errors_path.write_bytes(b"")
    with store.completions_path.open("ab") as handle:
        handle.write(b"garbage\n")
    with pytest.raises(GenerationError) as orphan:
        ShardStore.open(tmp_path, SHARD)
    assert (orphan.value.path, orphan.value.line) == (str(store.completions_path), None)
    with pytest.raises(GenerationError) as plan:
        ShardStore.open(tmp_path, {**SHARD, "count": 1})
    files = " ".join(str(tmp_path / kind / "shard-00007.jsonl") for kind in ("completions", "stats", "errors", "reuse"))
    assert (plan.value.shard, plan.value.hint) == (7, (
        "trigger a new run for the edited prompts file (a new run id gets a folder of its own); or, to redo only this "
        f"shard in this run, delete its output ({files} {tmp_path / 'shards' / 'shard-00007.json'} "
        f"{tmp_path / 'shards' / 'shard-00007.mark.json'}) and clear this task"))


def test_mismatch_errors_carry_the_completions_file_and_a_hint(tmp_path):
    store = _written(tmp_path, ["a", "b"])
    with store.completions_path.open("ab") as handle:
        handle.write(jsonio.dumps(completion("a")) + b"\n")
    with pytest.raises(GenerationError) as again:
        ShardStore.open(tmp_path, SHARD)
    assert again.value.hint == "restore both files from the same run, or remove the shard's output to regenerate it"
    store.completions_path.write_bytes(jsonio.dumps(completion("z")) + b"\n")
    with pytest.raises(GenerationError) as gone:
        ShardStore.open(tmp_path, SHARD)
    assert gone.value.path == str(store.completions_path)
    assert gone.value.hint == ("the completions file was truncated or replaced; restore it, or remove the shard's "
                               "output files to regenerate the shard")


def test_mark_warnings_name_the_mark_file(tmp_path, caplog):
    store = _written(tmp_path, ["a"])
    store.mark_path.write_text("{broken")
    with caplog.at_level(logging.WARNING):
        ShardStore.open(tmp_path, SHARD, log=logging.getLogger("t"))[0].close()
    assert caplog.records[-1].getMessage() == (f"shard 7: ignoring an unreadable {store.mark_path}; reading the whole "
                                               "shard instead")
    store.mark_path.write_text(json.dumps({"valid_before": 5, "offset": 100}))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ShardStore.open(tmp_path, SHARD, log=logging.getLogger("t"))[0].close()
    assert caplog.records[-1].getMessage() == (f"shard 7: {store.mark_path} does not match the output on disk; "
                                               "reading the whole shard")


def test_only_the_torn_bytes_are_cut_whatever_the_chunk_boundaries(tmp_path, monkeypatch):
    store = _written(tmp_path, ["a", "b", "c"])
    whole = store.completions_path.read_bytes()
    torn = b'{"id":"d","content":"half'
    store.completions_path.write_bytes(whole + torn)
    store, report = ShardStore.open(tmp_path, SHARD)  # one chunk holding several newlines
    store.close()
    assert report.torn_bytes == {"completions": len(torn)} and store.completions_path.read_bytes() == whole
    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", len(torn) + 1)  # the newline opens the last chunk
    store.completions_path.write_bytes(whole + torn)
    store, report = ShardStore.open(tmp_path, SHARD)
    store.close()
    assert report.torn_bytes == {"completions": len(torn)} and store.completions_path.read_bytes() == whole


@pytest.mark.parametrize("chunk", [7, 8, 14])
def test_lines_read_backwards_whatever_the_file_size_modulo_the_chunk(tmp_path, monkeypatch, chunk):
    from fleetgen.generate.store import _lines_backwards

    monkeypatch.setattr("fleetgen.generate.store.TAIL_CHUNK", chunk)
    lines = [b"a b\n", b"cd e\n", b"f\n", b"ghij k\n"]  # 15 bytes: 1 more than 2 x 7, 1 less than 2 x 8
    path = tmp_path / "f"
    path.write_bytes(b"".join(lines))
    assert list(_lines_backwards(path)) == lines[::-1]
