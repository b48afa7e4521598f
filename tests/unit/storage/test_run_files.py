"""The run's shared small files on a local folder and on an object store behave the same: whole files, their times
and versions, listing by folder and suffix, and read-modify-writes that never lose another writer's change."""

import concurrent.futures
import json
import time

import pytest

from fleetgen.errors import StoreConflict
from fleetgen.storage import run_files as run_files_module
from fleetgen.storage.run_files import ObjectRunFiles


@pytest.fixture
def files(run_files):
    return run_files


def test_a_file_reads_back_whole_with_its_time_and_a_version_that_changes_with_it(files):
    assert files.read("shards/shard-00001.alive") is None and files.version("shards/shard-00001.alive") is None
    before = time.time()
    files.write("shards/shard-00001.alive", b'{"beat": 1}')
    first = files.read("shards/shard-00001.alive")
    assert first.data == b'{"beat": 1}' and before - 2 <= first.time <= time.time() + 2
    assert files.version("shards/shard-00001.alive") == first.version
    files.write("shards/shard-00001.alive", b'{"beat": 22}')
    second = files.read("shards/shard-00001.alive")
    assert second.data == b'{"beat": 22}' and second.version != first.version
    files.delete("shards/shard-00001.alive")
    files.delete("shards/shard-00001.alive")  # already gone: nothing to do
    assert files.read("shards/shard-00001.alive") is None
    assert "shards/shard-00001.alive" in files.where("shards/shard-00001.alive")


def test_names_are_the_files_of_one_folder_with_a_suffix_in_name_order(files):
    for name in ("shards/shard-00002.alive", "shards/shard-00001.alive", "shards/shard-00001.lost.jsonl",
                 "shards/deeper/shard-00003.alive", "other/shard-00004.alive"):
        files.write(name, b"{}")
    assert files.names("shards", ".alive") == ["shards/shard-00001.alive", "shards/shard-00002.alive"]
    assert files.names("shards", ".lost.jsonl") == ["shards/shard-00001.lost.jsonl"]
    assert files.names("empty", ".alive") == []


def test_updates_from_many_writers_at_once_lose_no_change(files):
    def add(writer: int) -> None:
        for step in range(4):
            files.update("servers-health.json", lambda old: json.dumps(
                {**json.loads(old or b"{}"), f"{writer}-{step}": True}).encode())

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(add, range(6)))
    assert len(json.loads(files.read("servers-health.json").data)) == 24


def test_an_update_that_keeps_losing_gives_up_naming_the_object(object_store, monkeypatch):
    files = ObjectRunFiles(object_store)
    files.write("servers-health.json", b"{}")
    monkeypatch.setattr(run_files_module, "UPDATE_ROUNDS", 3)
    rounds = []

    def change(old):  # another writer replaces the object after each read (an ETag is the content's MD5)
        rounds.append(old)
        object_store.put("servers-health.json", json.dumps({"round": len(rounds)}).encode())
        return b'{"x": 1}'

    with pytest.raises(StoreConflict, match=r"servers-health.json\] could not update the object: 3 other writers") as lost:
        files.update("servers-health.json", change)
    assert len(rounds) == 3
    assert lost.value.conn_id == object_store.conn_id
    assert lost.value.hint == "too many tasks of the run write this object at once"


def test_two_writers_creating_an_object_at_once_both_get_their_change_in(object_store):
    import threading

    files = ObjectRunFiles(object_store)  # on a folder the lock keeps the second from reading before the first wrote
    both_read = threading.Barrier(2)

    def add(key):
        first = [True]

        def change(old):
            if first[0]:  # both writers read "no file yet" before either writes
                first[0] = False
                both_read.wait(10)
            return json.dumps({**json.loads(old or b"{}"), key: True}).encode()

        files.update("shards/shard-00001.lost.jsonl", change)

    writers = [threading.Thread(target=add, args=(key,)) for key in ("a", "b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(30)
    assert json.loads(files.read("shards/shard-00001.lost.jsonl").data) == {"a": True, "b": True}
