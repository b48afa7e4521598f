"""The error a failed output write becomes, branch by branch: whether a retry can help, and the words, numbers
and hint the user reads (a full disk, space freed meanwhile, a read-only output root, anything else)."""

import errno
from pathlib import Path

import pytest

from fleetgen.errors import OutputError, OutputUnwritable
from fleetgen.generate import store as store_module
from fleetgen.generate.store import ShardStore, output_error

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
    monkeypatch.setattr(store_module, "_free_bytes", lambda path: free)
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
