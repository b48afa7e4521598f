"""A full or unwritable output: the error names the file and the shard, says whether a retry can help,
and the output stays what a resume expects."""

import errno
import json
import os
import subprocess
import uuid
import pytest
from fleetgen.errors import OutputError, OutputUnwritable
from fleetgen.generate import jsonio, store as store_module, write_errors
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore
from fleetgen.generate.write_errors import output_error
from pathlib import Path

SHARD = {"shard_id": 3, "input_path": "/data/prompts.jsonl", "start": 0, "count": 100000}


def record(store, prompt_id, text="answer"):
    line = {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "content": text,
            "reasoning_content": "", "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            "server": "h:1", "latency_s": 0.1, "model": "m", "sampling": {}, "finished_at": 1.0}
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (needs root and mount rights: skipped where the machine denies them)."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def lines_are_whole(path):
    data = path.read_bytes()
    return not data or data.endswith(b"\n")


def test_a_full_disk_names_file_and_shard_fails_for_good_and_resumes_consistently(small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"x" * 64 * 1024)
    store, _ = ShardStore.open(small_disk / "out", SHARD)
    written = []
    with pytest.raises(OutputUnwritable) as full:
        for number in range(10_000):
            record(store, f"p{number}", "t" * 3000)
            written.append(f"p{number}")
    error = full.value
    assert error.errno == errno.ENOSPC and error.shard == 3 and written
    text = str(error)
    assert "[shard 3, " in text and "/out/" in text and "No space left on device" in text and "MiB free" in text
    assert "output_root" in error.hint
    for path in (store.completions_path, store.stats_path):
        assert lines_are_whole(path)  # the torn line was cut at once
    with pytest.raises(OutputUnwritable):  # nothing more is written, even to a file with room
        store.record_failure(b'{"id":"e"}\n', "e")
    store.close()
    filler.unlink()  # the operator frees space; a resume sees exactly what was recorded
    store, report = ShardStore.open(small_disk / "out", SHARD)
    assert {i.decode() for i in store.done_ids} - {f"p{len(written)}"} == set(written)
    assert report.finished in (len(written), len(written) + 1)
    stats_ids = [json.loads(line)["id"] for line in store.stats_path.read_text().splitlines()]
    completion_ids = [json.loads(line)["id"] for line in store.completions_path.read_text().splitlines()]
    assert stats_ids == completion_ids
    store.close()


def test_a_write_that_fails_after_a_partial_line_cuts_it_and_blocks_later_writes(tmp_path, monkeypatch):
    store, _ = ShardStore.open(tmp_path, SHARD)
    record(store, "a")
    real_write = os.write

    def short_then_full(fd, data):
        if len(data) > 40:  # half of the line reaches the disk, then the disk is full
            real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module.os, "write", short_then_full)
    monkeypatch.setattr(write_errors, "_free_bytes", lambda path: 4096)
    with pytest.raises(OutputUnwritable, match=r"\[shard 3, .*completions/shard-00003.jsonl\] cannot write"):
        record(store, "b")
    monkeypatch.setattr(store_module.os, "write", real_write)
    assert lines_are_whole(store.completions_path)
    with pytest.raises(OutputUnwritable):
        record(store, "c")
    store.close()
    assert [json.loads(line)["id"] for line in store.completions_path.read_text().splitlines()] == ["a"]


def test_space_freed_meanwhile_or_other_errors_stay_retryable(tmp_path):
    freed = output_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "f", 3, 100)
    assert type(freed) is OutputError and "free again" in str(freed)
    read_only = output_error(OSError(errno.EROFS, "Read-only file system"), tmp_path / "f", 3, 100)
    assert isinstance(read_only, OutputUnwritable)
    io_error = output_error(OSError(errno.EIO, "Input/output error"), tmp_path / "f", 3, 100)
    assert type(io_error) is OutputError and "[shard 3, " in str(io_error)


def test_an_unwritable_output_folder_is_named_when_the_shard_opens(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "out" / "shards"))

    monkeypatch.setattr(store_module.ShardLease, "acquire", refuse)
    with pytest.raises(OutputUnwritable, match=r"\[shard 3, .*out/shards\] cannot write the shard's output: "
                                               r"Permission denied"):
        ShardStore.open(tmp_path / "out", SHARD)


MIB = 1 << 20


PATH = Path("/out/completions/shard-00004.jsonl")


FULL_HINT = ("free space on (or raise the quota of) the file system of output_root, or point output_root elsewhere; "
             "then clear the task: it resumes from what is on disk")


FREED_HINT = "space was freed meanwhile: a retry resumes from what is on disk"


def fields(error):
    return type(error), error.message, error.errno, error.shard, error.path, error.hint


@pytest.mark.parametrize("free, attempted, expected", [
    (None, 0, (OutputUnwritable, "cannot write the shard's output: No space left on device (unknown space free)",
               FULL_HINT)),
    (MIB, 0, (OutputUnwritable, "cannot write the shard's output: No space left on device (1.0 MiB free)", FULL_HINT)),
    # A retry needs room for the line it failed to write plus 1 MiB; with that much free again it may finish.
    (MIB + 1, 0, (OutputError, "cannot write the shard's output: No space left on device; 1.0 MiB are free again now",
                  FREED_HINT)),
    (MIB + 1, 2, (OutputUnwritable, "cannot write the shard's output: No space left on device (1.0 MiB free)",
                  FULL_HINT)),
    (3 * MIB, 2 * MIB - 1, (OutputError, "cannot write the shard's output: No space left on device; 3.0 MiB are "
                                         "free again now", FREED_HINT)),
])
def test_a_full_disk_is_final_unless_enough_space_came_back(monkeypatch, free, attempted, expected):
    monkeypatch.setattr(write_errors, "_free_bytes", lambda path: free)
    error = output_error(OSError(errno.ENOSPC, "No space left on device"), PATH, 4, attempted)
    kind, message, hint = expected
    assert fields(error) == (kind, message, errno.ENOSPC, 4, str(PATH), hint)


def test_a_read_only_output_root_is_final_and_says_what_to_fix():
    error = output_error(OSError(errno.EROFS, "Read-only file system"), PATH, 4, 10)
    assert fields(error) == (OutputUnwritable, "cannot write the shard's output: Read-only file system", errno.EROFS,
                             4, str(PATH), "output_root must be a writable folder for the worker's user on every "
                             "worker; fix its permissions or choose another")


def test_other_write_errors_are_retryable_and_point_at_the_file_system():
    error = output_error(OSError(errno.EIO, "Input/output error"), PATH, 4, 10)
    assert fields(error) == (OutputError, "cannot write the shard's output: Input/output error", errno.EIO, 4,
                             str(PATH), "check the file system of output_root (dmesg, mount state); a retry resumes "
                             "from what is on disk")


def test_an_error_without_a_number_is_described_by_its_own_words():
    error = output_error(OSError("the storage driver gave up"), PATH, 4, 10)
    assert type(error) is OutputError and error.errno is None
    assert error.message == "cannot write the shard's output: the storage driver gave up"


def test_a_torn_reuse_row_is_cut_and_reported_under_its_file(tmp_path):
    shard = {"shard_id": 4, "input_path": "/data/prompts.jsonl", "start": 0, "count": 10}
    store, _ = ShardStore.open(tmp_path, shard)
    store.close()
    store.reuse_path.write_bytes(b'{"h":"00ff","o":0,"n":1')  # killed in the middle of the row
    store, report = ShardStore.open(tmp_path, shard)
    store.close()
    assert report.torn_bytes == {"reuse": 23} and store.reuse_path.read_bytes() == b""


def _failing_plan_write(monkeypatch, plan_name, error):
    """Path.write_bytes raises ``error`` for the shard's plan (or any temporary file named after it)."""
    write_bytes = Path.write_bytes

    def failing(self, data):
        if self.name.startswith(plan_name):
            raise error(self)
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing)


def test_a_plan_that_cannot_be_created_names_its_temporary_file(tmp_path, monkeypatch):
    _failing_plan_write(monkeypatch, "shard-00003.json",
                        lambda path: PermissionError(errno.EACCES, "Permission denied", str(path)))
    with pytest.raises(OutputUnwritable) as caught:
        ShardStore.open(tmp_path, SHARD)
    monkeypatch.undo()
    assert caught.value.errno == errno.EACCES and caught.value.shard == 3
    assert caught.value.path == str(tmp_path / "shards" / "shard-00003.json.partial")
    assert not (tmp_path / "shards" / "shard-00003.json").exists()


def test_a_write_error_without_a_file_name_while_opening_names_the_completions_folder(tmp_path, monkeypatch):
    _failing_plan_write(monkeypatch, "shard-00003.json",
                        lambda path: OSError(errno.EIO, "Input/output error"))  # write() names no file
    with pytest.raises(OutputError) as caught:
        ShardStore.open(tmp_path, SHARD)
    monkeypatch.undo()
    assert (type(caught.value), caught.value.errno, caught.value.shard) == (OutputError, errno.EIO, 3)
    assert caught.value.path == str(tmp_path / "completions")
    ShardStore.open(tmp_path, SHARD, lease_wait_s=0.05)[0].close()  # the failed open let the shard go
