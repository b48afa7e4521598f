"""What a resumed or competing try of a shard meets in its store: prompts the scan rejected stay out, a second
try says in its log that it found the first one alive, and a mark that cannot be saved reports why."""

import errno
import json
import logging
import os
import pathlib

import pytest

from fleetgen.errors import OutputError, ShardLeaseBusy
from fleetgen.generate.store import ShardStore
from fleetgen.prompts.length import LengthLimit
from fleetgen.prompts.scan import plan_shards, scan_prompts


def test_a_resumed_shard_leaves_out_the_prompts_its_scan_rejected_as_too_long(tmp_path):
    path = tmp_path / "p.jsonl"
    texts = ["short", "x" * 4000, "also short"]  # the second needs ~1000 tokens of a 200-token context
    path.write_text("".join(json.dumps({"id": f"p{n}", "prompt": text}) + "\n" for n, text in enumerate(texts)))
    limit = LengthLimit(context_tokens=200, max_tokens=50, source="the test's servers")
    [shard] = plan_shards(path, shard_size=10, scan=scan_prompts(path, length_limit=limit))
    assert shard["count"] == 2 and shard["length_limit"] == limit.to_dict()
    store, _ = ShardStore.open(tmp_path / "out", shard)
    try:
        pending = [(index, prompt.id) for index, _, _, prompt in store.pending_prompts(shard)]
    finally:
        store.close()
    assert pending == [(0, "p0"), (1, "p2")]


def test_a_second_try_finding_the_first_alive_says_so_in_its_log(tmp_path, caplog):
    shard = {"shard_id": 2, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}
    first, _ = ShardStore.open(tmp_path, shard, try_number=1)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(ShardLeaseBusy):
            ShardStore.open(tmp_path, shard, try_number=2, lease_wait_s=0.05, log=logging.getLogger("t"))
    finally:
        first.close()
    assert "shard 2: try 1 (pid" in caplog.text and "still holds the shard's output; try 2 (pid" in caplog.text


def test_a_mark_that_cannot_be_written_reports_the_write_error_and_keeps_the_old_mark(tmp_path, monkeypatch):
    shard = {"shard_id": 5, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}
    store, _ = ShardStore.open(tmp_path, shard)
    try:
        store.save_mark(2, 200)
        write_bytes = pathlib.Path.write_bytes

        def failing(self, data):
            if self.name.endswith(".partial"):  # fails before the temporary file exists
                raise OSError(errno.EIO, "Input/output error")
            return write_bytes(self, data)

        monkeypatch.setattr(pathlib.Path, "write_bytes", failing)
        with pytest.raises(OutputError) as caught:
            store.save_mark(3, 300)
    finally:
        monkeypatch.undo()
        store.close()
    assert caught.value.errno == errno.EIO and "Input/output error" in str(caught.value)
    assert caught.value.path == str(store.mark_path.with_name(store.mark_path.name + ".partial"))
    assert json.loads(store.mark_path.read_text()) == {"valid_before": 2, "offset": 200}


def test_a_file_system_without_locks_is_named_when_the_shard_opens(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")  # e.g. an NFS mount without a lock daemon

    monkeypatch.setattr("fleetgen.generate.lease.fcntl.flock", no_locks)
    with pytest.raises(OutputError) as caught:
        ShardStore.open(tmp_path / "out", {"shard_id": 1, "input_path": "/data/prompts.jsonl", "start": 0, "count": 5})
    assert caught.value.errno == errno.ENOLCK and caught.value.path == str(tmp_path / "out" / "shards")
    assert "No locks available" in str(caught.value)


def test_a_sync_that_fails_at_close_is_reported_against_the_first_file_and_the_lease_is_freed(tmp_path, monkeypatch):
    shard = {"shard_id": 6, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}
    store, _ = ShardStore.open(tmp_path, shard)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("fleetgen.generate.store.os.fsync", full)
    with pytest.raises(OutputError) as caught:
        store.close()
    monkeypatch.undo()
    assert (caught.value.errno, caught.value.shard, caught.value.path) == (errno.ENOSPC, 6, str(store.completions_path))
    assert caught.value.message.startswith("cannot write the shard's output: No space left on device")
    ShardStore.open(tmp_path, shard, lease_wait_s=0.05)[0].close()  # nothing holds the shard any more


def test_a_mark_on_a_full_disk_reports_how_much_room_there_is(tmp_path, monkeypatch):
    shard = {"shard_id": 5, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}
    store, _ = ShardStore.open(tmp_path, shard)
    write_bytes = pathlib.Path.write_bytes

    def full(self, data):
        if self.name.endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", full)
    try:
        with pytest.raises(OutputError) as caught:
            store.save_mark(3, 300)
    finally:
        monkeypatch.undo()
        store.close()
    assert caught.value.errno == errno.ENOSPC and " free" in caught.value.message


def test_a_lock_file_that_cannot_be_opened_is_named(tmp_path, monkeypatch):
    real_open = os.open

    def refused(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(OutputError) as caught:
        ShardStore.open(tmp_path, {"shard_id": 8, "input_path": "/data/prompts.jsonl", "start": 0, "count": 5})
    monkeypatch.undo()
    assert caught.value.errno == errno.EACCES and caught.value.path.endswith(".lock")
    assert caught.value.path.startswith(str(tmp_path / "shards"))
