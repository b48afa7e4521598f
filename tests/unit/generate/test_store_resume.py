"""What a resumed or competing try of a shard meets in its store: prompts the scan rejected stay out, a second
try says in its log that it found the first one alive, and a mark that cannot be saved reports why."""

import errno
import json
import logging
import os
import pathlib

import pytest

from fleetgen.errors import OutputError, PromptsError, ShardLeaseBusy
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


def _prompt_line(prompt_id):
    return json.dumps({"id": prompt_id, "prompt": f"say {prompt_id}"}) + "\n"


def _half_done_second_shard(tmp_path, *, last_newline=True):
    """Six prompts in shards of three; the second shard finished q3 and saved its mark past it, then failed."""
    path = tmp_path / "p.jsonl"
    text = "".join(_prompt_line(f"q{n}") for n in range(6))
    path.write_text(text if last_newline else text.rstrip("\n"))
    shards = plan_shards(path, shard_size=3, scan=scan_prompts(path))
    store, _ = ShardStore.open(tmp_path / "out", shards[1])
    positions = [position for position in store.pending_prompts(shards[1])]
    _record(store, "q3")
    store.save_mark(positions[1][0], positions[1][1])  # q3 done; q4 is where a retry starts reading
    store.close()
    return path, shards


def _record(store, prompt_id):
    line = {"id": prompt_id, "content": "answer", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    store.record_completion(json.dumps(line).encode() + b"\n",
                            json.dumps({"id": prompt_id, "completion_tokens": 2}).encode() + b"\n", prompt_id)


def _pending_ids(out, shard):
    store, _ = ShardStore.open(out, shard)
    try:
        return [prompt.id for _, _, _, prompt in store.pending_prompts(shard)]
    finally:
        store.close()


@pytest.mark.parametrize("edit", ["insert at the top", "replace a line"])
def test_a_retry_refuses_a_prompts_file_edited_since_the_plan_and_says_what_to_do(tmp_path, edit):
    path, shards = _half_done_second_shard(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    if edit == "insert at the top":  # every byte offset of the plan now points elsewhere
        lines[:0] = [_prompt_line("new1"), _prompt_line("new2")]
    else:
        lines[4] = _prompt_line("qX")
    path.write_text("".join(lines))
    with pytest.raises(PromptsError) as caught:
        _pending_ids(tmp_path / "out", shards[1])
    error = caught.value
    assert error.shard == 1 and error.message.startswith("the prompts file changed after the run was planned: bytes ")
    assert "put the prompts_path file back as it was then" in error.hint and "start a new run" in error.hint


def test_a_retry_reads_the_planned_prompts_when_lines_were_appended(tmp_path):
    path, shards = _half_done_second_shard(tmp_path, last_newline=False)
    with path.open("a") as handle:  # `cat more.jsonl >> p.jsonl`: the last line had no newline, it goes on
        handle.write(_prompt_line("late"))
    assert _pending_ids(tmp_path / "out", shards[1]) == ["q4", "q5"]


def test_rerunning_a_finished_last_shard_of_a_file_without_a_final_newline_reads_nothing(tmp_path):
    path, shards = _half_done_second_shard(tmp_path, last_newline=False)
    store, _ = ShardStore.open(tmp_path / "out", shards[1])
    for prompt_id in ("q4", "q5"):
        _record(store, prompt_id)
    store.save_mark(3, path.stat().st_size)  # every prompt finished: the mark is the end of the file
    store.close()
    assert shards[1]["end"] == path.stat().st_size
    assert _pending_ids(tmp_path / "out", shards[1]) == []


@pytest.mark.parametrize("offset", ["mid-line", "past the end"])
def test_a_hand_edited_mark_is_ignored_with_a_warning_and_the_shard_read_whole(tmp_path, caplog, offset):
    path, shards = _half_done_second_shard(tmp_path)
    store, _ = ShardStore.open(tmp_path / "out", shards[1])
    store.save_mark(1, shards[1]["start"] + 5 if offset == "mid-line" else shards[1]["end"] + 10)
    store.close()
    with caplog.at_level(logging.WARNING):
        store, _ = ShardStore.open(tmp_path / "out", shards[1], log=logging.getLogger("t"))
        try:
            pending = [prompt.id for _, _, _, prompt in store.pending_prompts(shards[1])]
            again = [prompt.id for _, _, _, prompt in store.pending_prompts(shards[1])]
        finally:
            store.close()
    assert pending == again == ["q4", "q5"]  # q3 is finished and skipped by id
    assert store.mark is None and store.resume_point(shards[1]) == (0, shards[1]["start"])
    if offset == "mid-line":  # fits the output on disk, so it is checked against the prompts file when read
        expected = (f"shard 1: ignoring {store.mark_path}: byte {shards[1]['start'] + 5} is not the start of a line "
                    "of the prompts file; reading the whole shard (finished prompts are skipped by id)")
    else:  # beyond the planned range: dropped as soon as the shard opens
        expected = f"shard 1: {store.mark_path} does not match the output on disk; reading the whole shard"
    assert [record.getMessage() for record in caplog.records] == [expected]  # once, not again on the second read


def test_a_mark_at_the_very_end_of_the_shard_is_kept(tmp_path, caplog):
    path, shards = _half_done_second_shard(tmp_path)
    store, _ = ShardStore.open(tmp_path / "out", shards[1])
    for prompt_id in ("q4", "q5"):
        _record(store, prompt_id)
    store.save_mark(3, shards[1]["end"])  # every prompt finished: the mark is the end of the planned range
    store.close()
    with caplog.at_level(logging.WARNING):
        store, _ = ShardStore.open(tmp_path / "out", shards[1], log=logging.getLogger("t"))
        try:
            pending = list(store.pending_prompts(shards[1]))
        finally:
            store.close()
    assert pending == [] and store.resume_point(shards[1]) == (3, shards[1]["end"]) and caplog.records == []


def test_a_store_made_without_opening_holds_no_lease_and_reads_the_shard_from_its_start(tmp_path):
    """How a tool lays out a shard's files without running it (bench/resume.py): no lease, no log."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(_prompt_line(f"q{n}") for n in range(3)))
    [shard] = plan_shards(path, shard_size=3, scan=scan_prompts(path))
    (tmp_path / "out" / "shards").mkdir(parents=True)
    store = ShardStore(tmp_path / "out", shard)
    assert store.resume_point(shard) == (0, 0)
    assert [prompt.id for _, _, _, prompt in store.pending_prompts(shard)] == ["q0", "q1", "q2"]
    store.save_mark(1, 3)  # not a line start: dropped when the prompts are read, with no log to say so
    assert [prompt.id for _, _, _, prompt in store.pending_prompts(shard)] == ["q0", "q1", "q2"]
    store.save_mark(1, len(_prompt_line("q0")))
    store.close()
    assert json.loads(store.mark_path.read_text()) == {"valid_before": 1, "offset": len(_prompt_line("q0"))}
    ShardStore.open(tmp_path / "out", shard, lease_wait_s=0.05)[0].close()  # nothing holds the shard


# --- which earlier errors a new try keeps: only the prompt's own fault ----------------------------------------------

def test_a_new_try_keeps_only_the_errors_that_were_the_prompts_own_fault(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(_prompt_line(f"q{n}") for n in range(4)))
    [shard] = plan_shards(path, shard_size=10, scan=scan_prompts(path))
    store, _ = ShardStore.open(tmp_path / "out", shard)
    _record(store, "q0")
    kept = {"id": "q1", "status": "failed", "error": {"code": "http_400", "message": "too long"}, "fault": "prompt"}
    server = {"id": "q2", "status": "failed", "error": {"code": "attempts_exhausted", "message": "busy"},
              "fault": "server"}
    unknown = {"id": "q3", "status": "failed", "error": {"code": "http_400", "message": "chat template"}}  # older try
    for record in (kept, server, unknown):
        store.record_failure(json.dumps(record).encode() + b"\n", record["id"])
    store.save_mark(4, path.stat().st_size)  # every prompt finished, as that try saw it
    store.close()
    again, report = ShardStore.open(tmp_path / "out", shard)
    try:
        pending = [prompt.id for _, _, _, prompt in again.pending_prompts(shard)]
    finally:
        again.close()
    assert pending == ["q2", "q3"]
    assert (report.finished, report.failed, report.sent_again) == (1, 1, 2)
    assert [json.loads(line)["id"] for line in (tmp_path / "out/errors/shard-00000.jsonl").read_text().splitlines()] \
        == ["q1"]


@pytest.mark.anyio
async def test_clearing_a_shard_after_the_server_is_fixed_regenerates_its_server_fault_errors_only(tmp_path, caplog):
    from generate_fakes import FakeFleet, fast_settings, shard_output, write_prompts
    import httpx
    from fleetgen.generate import run_shard_async

    shard = write_prompts(tmp_path / "p.jsonl", 6)
    night = FakeFleet(1, limit=1)
    night.behaviour["s0:1"] = lambda pid, n: (httpx.Response(400, text="longer than the context") if pid == "p0001"
                                              else httpx.Response(429, text="busy") if pid in ("p0003", "p0004")
                                              else None)
    first = await run_shard_async(shard, night.endpoints(), tmp_path / "out", fast_settings(max_attempts=2),
                                  options=night.options())
    assert first["failed"] == 3
    fixed = FakeFleet(1, limit=1)
    with caplog.at_level(logging.INFO):
        summary = await run_shard_async(shard, fixed.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fixed.options())
    assert sorted(fixed.by_prompt) == ["p0003", "p0004"]  # the too-long prompt is not sent again
    assert (summary["done"], summary["failed"], summary["skipped_already_done"]) == (2, 0, 4)
    out = shard_output(tmp_path / "out")
    assert [(r["id"], r["fault"]) for r in out["errors"]] == [("p0001", "prompt")]
    assert sorted(r["id"] for r in out["completions"]) == ["p0000", "p0002", "p0003", "p0004", "p0005"]
    assert "6 prompts, 4 already done (3 completed, 1 failed earlier)" in caplog.text
    assert "2 prompt(s) that failed in earlier tries through no fault of their own are sent again" in caplog.text
