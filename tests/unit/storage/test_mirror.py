"""A run on an object store mirrored into a task's scratch folder (storage/mirror.py), against SeaweedFS: what is
downloaded, what goes back, and how a file two tasks wrote side by side is merged."""

from __future__ import annotations

import json

import pytest

from fleetgen.errors import StoreConflict
from fleetgen.storage.mirror import RunMirror, merge

RUN = "run-1"


def _open(store, tmp_path, name="a", **kwargs) -> RunMirror:
    return RunMirror.open(store, RUN, tmp_path / name, **kwargs)


def test_open_downloads_the_runs_small_files_and_the_roots_own_but_not_the_shards_or_what_only_people_read(
        object_store, tmp_path):
    (tmp_path / "a" / RUN).mkdir(parents=True)  # the scratch folder may exist, empty
    for name in (f"{RUN}/plan.json", f"{RUN}/servers-stopped/deep/n1.json", f"{RUN}/server-times/n_1.jsonl", "calibration.json", "tuning-trials.jsonl",
                 f"{RUN}/shards/shard-00000/log/000000000001.json", f"{RUN}/dataset/shard-00000.parquet",
                 f"{RUN}/batch/output.jsonl", f"{RUN}/validation/data_docs/index.html", f"{RUN}/validation/summary.json",
                 f"{RUN}/gpu/shard-00000.jsonl", "other-run/plan.json", f"{RUN}/shards/shard-00000.lost.jsonl",
                 f"{RUN}/shards/shard-00000.alive", f"{RUN}/shards/shard-00000/parts/x.lost.jsonl"):
        object_store.put(name, b"{}")
    mirror = _open(object_store, tmp_path)
    files = sorted(path.relative_to(mirror.scratch).as_posix() for path in mirror.scratch.rglob("*") if path.is_file())
    assert files == ["calibration.json", f"{RUN}/plan.json", f"{RUN}/server-times/n_1.jsonl",
                     f"{RUN}/servers-stopped/deep/n1.json",
                     f"{RUN}/shards/shard-00000.lost.jsonl",  # the report reads the tries each shard found dead
                     f"{RUN}/validation/summary.json", "tuning-trials.jsonl"]
    assert mirror.run_root == tmp_path / "a" / RUN
    asked = _open(object_store, tmp_path, "b", folders=["gpu"])
    assert (asked.run_root / "gpu" / "shard-00000.jsonl").read_bytes() == b"{}"
    assert mirror.changes() == [] and mirror.sync() == []


def test_sync_creates_replaces_and_deletes_what_the_task_changed_and_nothing_else(object_store, tmp_path):
    object_store.put(f"{RUN}/kept.json", b'{"a": 1}')
    object_store.put(f"{RUN}/changed.json", b'{"a": 1}')
    object_store.put(f"{RUN}/deleted.json", b'{"a": 1}')
    mirror = _open(object_store, tmp_path)
    (mirror.run_root / "changed.json").write_bytes(b'{"a": 2}')
    (mirror.run_root / "deleted.json").unlink()
    (mirror.run_root / "report").mkdir()
    (mirror.run_root / "report" / "report.md").write_bytes(b"# run\n")
    (mirror.run_root / ".calibration.json.lock").write_bytes(b"")  # scratch-only: locks, temporaries
    (mirror.run_root / "report" / "a").mkdir()
    for name in ("rows.partial", "report/x.lock", "report/y.tmp", "report/a/.hidden.json", "report/a/z.partial"):
        (mirror.run_root / name).write_bytes(b"x")
    mirror.write_derived("stats/shard-00000.jsonl", [b'{"id": "p1"}\n'])  # read from the commit log: never sent
    mirror.write_derived("stats/shard-00001.jsonl", [b'{"id": "p2"}\n'])
    mirror.write_derived("deep/er/rows.jsonl", [b"{}\n"])
    kept_etag = object_store.head(f"{RUN}/kept.json").etag

    assert mirror.sync() == [f"{RUN}/changed.json", f"{RUN}/deleted.json", f"{RUN}/report/report.md"]
    assert object_store.get(f"{RUN}/changed.json") == b'{"a": 2}'
    assert object_store.head(f"{RUN}/deleted.json") is None
    assert object_store.get(f"{RUN}/report/report.md") == b"# run\n"
    assert object_store.head(f"{RUN}/kept.json").etag == kept_etag
    names = {info.name for info in object_store.list(f"{RUN}/")}
    assert names == {f"{RUN}/kept.json", f"{RUN}/changed.json", f"{RUN}/report/report.md"}
    assert mirror.sync() == []  # the next sync starts from what the store now holds


def test_lines_two_tasks_append_side_by_side_are_all_kept(object_store, tmp_path):
    object_store.put(f"{RUN}/failures.jsonl", b'{"task": "a"}\n')
    first, second = _open(object_store, tmp_path, "a"), _open(object_store, tmp_path, "b")
    with (first.run_root / "failures.jsonl").open("ab") as handle:
        handle.write(b'{"task": "b"}\n')
    with (second.run_root / "failures.jsonl").open("ab") as handle:
        handle.write(b'{"task": "c"}\n')
    (second.run_root / "server-times").mkdir()
    (second.run_root / "server-times" / "n_1.jsonl").write_bytes(b'{"event": "ready"}\n')
    third = _open(object_store, tmp_path, "c")  # created by another task meanwhile: its line is added after
    (third.run_root / "server-times").mkdir()
    (third.run_root / "server-times" / "n_1.jsonl").write_bytes(b'{"event": "stopped"}\n')
    first.sync(), second.sync(), third.sync()
    assert object_store.get(f"{RUN}/failures.jsonl") == b'{"task": "a"}\n{"task": "b"}\n{"task": "c"}\n'
    assert object_store.get(f"{RUN}/server-times/n_1.jsonl") == b'{"event": "ready"}\n{"event": "stopped"}\n'
    # the merged version is what the task's copy holds now
    assert (second.run_root / "failures.jsonl").read_bytes() == object_store.get(f"{RUN}/failures.jsonl")


def test_keys_two_tasks_record_side_by_side_are_all_kept_and_the_first_writer_of_one_key_stands(object_store,
                                                                                                 tmp_path):
    object_store.put("calibration.json", b'{"old": 1, "gone": 2}')
    first, second = _open(object_store, tmp_path, "a"), _open(object_store, tmp_path, "b")
    (first.scratch / "calibration.json").write_text(json.dumps({"old": 1, "gone": 2, "server-a": 10, "both": "a"}))
    (second.scratch / "calibration.json").write_text(json.dumps({"old": 5, "server-b": 20, "both": "b"}))
    first.sync(), second.sync()
    assert json.loads(object_store.get("calibration.json")) == {"old": 5, "server-a": 10, "server-b": 20,
                                                                 "both": "a"}


def test_a_file_synced_twice_merges_with_what_another_task_wrote_in_between(object_store, tmp_path):
    mirror, other = _open(object_store, tmp_path, "a"), _open(object_store, tmp_path, "b")
    (mirror.run_root / "failures.jsonl").write_bytes(b"1\n")
    mirror.sync()
    (other.run_root / "failures.jsonl").write_bytes(b"2\n")  # created by the other meanwhile: merged after ours
    other.sync()
    with (mirror.run_root / "failures.jsonl").open("ab") as handle:
        handle.write(b"3\n")
    mirror.sync()
    assert object_store.get(f"{RUN}/failures.jsonl") == b"1\n2\n3\n"


def test_a_file_deleted_by_another_task_meanwhile_is_created_again(object_store, tmp_path):
    object_store.put(f"{RUN}/plan-notes.json", b'{"a": 1}')
    mirror = _open(object_store, tmp_path)
    object_store.delete(f"{RUN}/plan-notes.json")
    (mirror.run_root / "plan-notes.json").write_bytes(b'{"a": 2}')
    mirror.sync()
    assert object_store.get(f"{RUN}/plan-notes.json") == b'{"a": 2}'


def test_a_file_other_writers_keep_changing_gives_up_naming_the_object(object_store, tmp_path, monkeypatch):
    from fleetgen.storage import mirror as mirror_module

    object_store.put(f"{RUN}/failures.jsonl", b"1\n")
    mirror = _open(object_store, tmp_path)
    (mirror.run_root / "failures.jsonl").write_bytes(b"1\n2\n")
    rounds = []

    def always_lost(name, data, **conditions):
        rounds.append(conditions)
        raise StoreConflict("lost", path=name)

    monkeypatch.setattr(object_store, "put", always_lost)
    monkeypatch.setattr(mirror_module, "UPDATE_ROUNDS", 3)
    with pytest.raises(StoreConflict, match="could not write the object back: 3 other writers changed it first") \
            as caught:
        mirror.sync()
    assert len(rounds) == 3 and caught.value.path == object_store.url(f"{RUN}/failures.jsonl")
    assert caught.value.conn_id == object_store.conn_id
    assert caught.value.hint == "too many tasks of the run write this object at once; clear the task to run it again"


def test_a_file_both_tasks_rewrote_that_cannot_be_merged_is_a_conflict_naming_the_object(object_store, tmp_path):
    object_store.put(f"{RUN}/notes.md", b"one\n")
    first, second = _open(object_store, tmp_path, "a"), _open(object_store, tmp_path, "b")
    (first.run_root / "notes.md").write_bytes(b"two\n")
    (second.run_root / "notes.md").write_bytes(b"three\n")
    first.sync()
    with pytest.raises(StoreConflict, match="another task wrote this object while this task changed it") as caught:
        second.sync()
    assert caught.value.path == object_store.url(f"{RUN}/notes.md") and caught.value.conn_id == object_store.conn_id
    assert caught.value.hint == "clear the task to run it again on the object as it is now"
    assert object_store.get(f"{RUN}/notes.md") == b"two\n"


def test_what_only_the_report_writes_is_written_over_by_its_retry_not_appended_to(object_store, tmp_path):
    object_store.put(f"{RUN}/batch/output.jsonl", b'{"custom_id": "p1"}\n')  # an earlier try's
    object_store.put(f"{RUN}/reuse/index.json", b'{"completions": 1}')
    mirror = _open(object_store, tmp_path)
    (mirror.run_root / "batch").mkdir()
    (mirror.run_root / "batch" / "output.jsonl").write_bytes(b'{"custom_id": "p1"}\n')
    (mirror.run_root / "reuse").mkdir()
    (mirror.run_root / "reuse" / "index.json").write_bytes(b'{"completions": 2}')
    assert mirror.sync() == [f"{RUN}/batch/output.jsonl", f"{RUN}/reuse/index.json"]
    assert object_store.get(f"{RUN}/batch/output.jsonl") == b'{"custom_id": "p1"}\n'
    assert object_store.get(f"{RUN}/reuse/index.json") == b'{"completions": 2}'
    assert mirror.sync() == []  # sent once: not again unless written again


def test_another_runs_files_are_copied_to_be_read_and_never_sent_back(object_store, tmp_path):
    object_store.put("night1/report/report.json", b'{"old": 1}')
    mirror = _open(object_store, tmp_path)
    assert mirror.copy_read_only(["night1/report/report.json", "night9/report/report.json"]) == [
        "night1/report/report.json"]  # a run without a report is left out
    mirror.write_read_only("night1/stats/shard-00000.jsonl", [b'{"id": 1}\n'])
    (mirror.scratch / "night1" / "report" / "report.json").write_text("changed here")
    assert mirror.changes() == [] and mirror.sync() == []
    assert object_store.get("night1/report/report.json") == b'{"old": 1}'
    assert object_store.head("night1/stats/shard-00000.jsonl") is None
    for own in (f"{RUN}/report/report.json", "calibration.json"):  # the run's own files and the root's go back: refused
        with pytest.raises(ValueError, match="not a read-only copy"):
            mirror.copy_read_only([own])
        with pytest.raises(ValueError, match="not a read-only copy"):
            mirror.write_read_only(own, [b"x"])
    for climbing in ("../report/report.json", "./x/y", "night1//y", "/etc/x", ""):  # no file of the copy
        with pytest.raises(ValueError, match="not a plain relative name"):
            mirror.copy_read_only([climbing])
        with pytest.raises(ValueError, match="not a plain relative name"):
            mirror.write_read_only(climbing, [b"x"])


def test_close_removes_the_scratch_copy(object_store, tmp_path):
    object_store.put(f"{RUN}/plan.json", b"{}")
    mirror = _open(object_store, tmp_path)
    mirror.close()
    assert not mirror.scratch.exists()
    mirror.close()  # twice: harmless


@pytest.mark.parametrize(("name", "base", "ours", "theirs", "merged"), [
    ("a.jsonl", b"1\n", b"1\n2\n", b"1\n3\n", b"1\n3\n2\n"),
    ("a.jsonl", None, b"2\n", b"1", b"1\n2\n"),  # theirs without a last newline: ours starts on a line of its own
    ("a.json", b'{"k": 1}', b"{}", b'{"k": 1, "j": 2}', b'{\n "j": 2\n}\n'),  # a key ours removed
    ("a.json", b'{"k": 1}', b'{"k": 1}', b'{"k": 3}', b'{\n "k": 3\n}\n'),  # nothing of ours changed
    ("a.json", None, b'{"k": 1}', b'{"j": 2}', b'{\n "j": 2,\n "k": 1\n}\n'),  # both created it
    ("a.json", None, b'{"a": 1}', b'{"z": 2}', b'{\n "a": 1,\n "z": 2\n}\n'),  # written in key order
    ("a.json", b'{"k": null}', b"{}", b'{"k": null, "j": 1}', b'{\n "j": 1\n}\n'),  # a null removed is removed
    ("a.json", b'{"a": 1, "b": 1}', b'{"a": 1, "b": 2}', b'{"a": 1, "b": 1, "c": 3}',
     b'{\n "a": 1,\n "b": 2,\n "c": 3\n}\n'),  # a key left alone before the one changed
    ("a.json", b'{"a": 1, "b": 1}', b'{"a": 2, "b": 2}', b'{"a": 3, "b": 1}',
     b'{\n "a": 3,\n "b": 2\n}\n'),  # theirs stands on a, ours applies on b
])
def test_merge_applies_the_tasks_change_to_what_the_other_task_wrote(name, base, ours, theirs, merged):
    assert merge(name, base, ours, theirs, where="s3://b/k", conn_id="c") == merged


@pytest.mark.parametrize(("name", "base", "ours", "theirs"), [
    ("a.jsonl", b"1\n2\n", b"1\n", b"1\n2\n3\n"),  # ours cut a line: not an append
    ("a.json", b"[1]", b"[2]", b"[3]"),  # not an object
    ("a.json", b"{}", b"{torn", b"{}"),
    ("a.txt", b"1", b"2", b"3"),
])
def test_merge_refuses_what_is_not_an_append_or_a_change_of_keys(name, base, ours, theirs):
    with pytest.raises(StoreConflict) as caught:
        merge(name, base, ours, theirs, where="s3://b/k", conn_id="c")
    assert caught.value.message == ("another task wrote this object while this task changed it, and the two cannot "
                                    "be merged")
    assert caught.value.path == "s3://b/k" and caught.value.conn_id == "c"
