"""The commit log of a shard on an object store, read and written directly: who a commit names, what a damaged log
or part reads as, a conflict whose winner cannot be read, and reads held to READ_PARALLELISM at a time."""

import json
import threading

import pytest

from fleetgen.errors import GenerationError, ShardLeaseLost
from fleetgen.generate import commit_log
from fleetgen.generate.commit_log import (CommitLog, Part, ShardLog, commit_name, committed_lines, describe_writer,
                                          read_in_order)

BY = {"try": 2, "pid": 4243, "host": "worker-b", "since": "2026-12-06T02:00:00Z"}


def test_a_commit_names_its_writer_by_try_pid_host_and_time():
    assert describe_writer({"by": BY}) == "try 2 (pid 4243 on worker-b, since 2026-12-06T02:00:00Z)"
    assert describe_writer({"by": {"try": None}}) == "a try (pid ? on ?, since ?)"
    assert describe_writer({"by": {"try": 0, "pid": 1, "host": "h", "since": "s"}}) == "try 0 (pid 1 on h, since s)"
    assert describe_writer(None) == describe_writer({}) == "another try"


def test_a_gap_in_the_log_names_the_missing_commit_and_what_to_delete(object_store):
    log = CommitLog(object_store, 3)
    assert log.commit(1, {"kind": "open", "by": BY}, token="t") is None
    assert log.commit(3, {"kind": "parts", "by": BY}, token="t") is None
    with pytest.raises(GenerationError) as gap:
        log.read()
    error = gap.value
    assert (error.shard, error.path) == (3, object_store.url(commit_name(3, 3)))
    assert error.message == (f"the shard's commit log has a gap: {object_store.url(commit_name(3, 2))} is missing but "
                             f"{object_store.url(commit_name(3, 3))} exists")
    assert error.hint == ("the log is written only by fleetgen and never deleted from: restore the missing commit, or "
                          f"delete every object under {object_store.url('shards/shard-00003/')} and the plan to "
                          "regenerate the shard")


@pytest.mark.parametrize("content", [b"[]", b'{"kind": "merge"}', b"{not json"])
def test_an_unreadable_commit_is_named_by_its_url(object_store, content):
    object_store.put(commit_name(5, 1), content)
    with pytest.raises(GenerationError) as unreadable:
        CommitLog(object_store, 5).read()
    error = unreadable.value
    assert (error.shard, error.path) == (5, object_store.url(commit_name(5, 1)))
    assert error.message.startswith("unreadable commit record: ")
    if content == b"[]":
        assert error.message == "unreadable commit record: not a commit record"
    assert error.hint == ("the log is written only by fleetgen: restore the object, or delete the shard's objects to "
                          "regenerate it")


def test_a_read_log_is_the_shards_and_holds_its_commits_in_order(object_store):
    log = CommitLog(object_store, 8)
    log.commit(1, {"kind": "open", "by": BY, "mark": None}, token="t")
    log.commit(2, {"kind": "parts", "by": BY, "mark": [3, 120]}, token="t")
    state = log.read()
    assert state.shard_id == 8 and [c["seq"] for c in state.commits] == [1, 2] and state.next_seq == 3
    assert state.mark == (3, 120) and state.last["token"] == "t"


def test_a_conflict_whose_winner_cannot_be_read_is_still_a_lost_commit(object_store):
    object_store.put(commit_name(6, 1), b"{torn")
    log = CommitLog(object_store, 6)
    winner = log.commit(1, {"kind": "open"}, token="mine")
    assert winner == {}
    lost = log.lease_lost(1, winner)
    assert isinstance(lost, ShardLeaseLost) and (lost.shard, lost.path) == (6, object_store.url(commit_name(6, 1)))
    assert lost.message == ("another try took this shard's output over (it created commit 1 first); this try stops "
                            "here, and what it had not committed is generated again by the newer try")
    assert lost.hint == ("two tries of this shard ran at once (Airflow started a retry while this one was still "
                         "alive): nothing to do, the newer try resumes from the committed output")


def test_an_open_commit_that_kept_no_error_clears_the_errors_before_it():
    state = ShardLog(1)
    state.add({"kind": "parts", "parts": {"errors": {"name": "e1", "lines": 1, "bytes": 10}}, "mark": [1, 10]})
    state.add({"kind": "open", "errors_base": None, "mark": None})
    assert state.parts["errors"] == [] and state.mark is None
    state.add({"kind": "open", "errors_base": {"name": "e2", "lines": 2, "bytes": 20}})
    assert state.parts["errors"] == [Part("e2", 2, 20)]


@pytest.mark.parametrize("data, part, problem", [
    (b"a\nb\n", Part("p", 2, 5), "torn: 4 bytes and 2 lines, its commit recorded 5 bytes and 2 lines"),
    (b"a\nbc", Part("p", 2, 4), "torn: 4 bytes and 1 lines, its commit recorded 4 bytes and 2 lines"),
    (b"a\nbc", Part("p", 1, 4), "torn: 4 bytes and 1 lines, its commit recorded 4 bytes and 1 lines"),
])
def test_a_part_that_is_not_what_its_commit_recorded_is_torn(object_store, data, part, problem):
    object_store.put("p", data)
    with pytest.raises(GenerationError) as torn:
        CommitLog(object_store, 2).read_part(part)
    error = torn.value
    assert (error.shard, error.path) == (2, object_store.url("p"))
    assert error.message == f"a committed part of the shard's output is {problem}"
    assert error.hint == ("the part was changed after it was committed: restore it, or delete the shard's objects to "
                          "regenerate the shard")


def test_a_missing_part_is_named_with_what_its_commit_recorded(object_store):
    with pytest.raises(GenerationError) as missing:
        CommitLog(object_store, 2).read_part(Part("gone.jsonl", 3, 30))
    error = missing.value
    assert (error.shard, error.path) == (2, object_store.url("gone.jsonl"))
    assert error.message == "a committed part of the shard's output is missing (3 lines, 30 bytes)"
    assert error.hint == ("parts are written only by fleetgen and never deleted: restore the object, or delete the "
                          "shard's objects to regenerate the shard")


def test_committed_lines_keep_their_newlines(object_store):
    log = CommitLog(object_store, 0)
    object_store.put("part", b'{"id":"a"}\n{"id":"b"}\n')
    log.commit(1, {"kind": "parts", "parts": {"stats": {"name": "part", "lines": 2, "bytes": 22}}}, token="t")
    assert list(committed_lines(object_store, 0, "stats")) == [b'{"id":"a"}\n', b'{"id":"b"}\n']


def test_reads_run_side_by_side_but_never_more_than_the_bound_ahead_of_the_reader(monkeypatch):
    monkeypatch.setattr(commit_log, "READ_PARALLELISM", 3)
    submitted, lock = [], threading.Lock()

    def read(item):
        with lock:
            submitted.append(item)
        return item

    ahead = []
    for consumed, item in enumerate(read_in_order(read, list(range(10))), 1):
        with lock:
            ahead.append(len(submitted) - consumed)
        assert item == consumed - 1
    assert max(ahead) <= 3 - 1 and len(submitted) == 10
    assert list(read_in_order(read, [])) == [] and list(read_in_order(read, ["only"])) == ["only"]
