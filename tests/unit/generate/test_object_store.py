"""A shard's output on a real object store (SeaweedFS): committed in parts under a numbered log, resumed from what
is committed, and exactly once whatever tries die, freeze or overlap (docs/shards.md §8)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from fleetgen.errors import GenerationError, ShardLeaseLost, ShardPlanChanged, StoreError
from fleetgen.generate import jsonio
from fleetgen.generate.commit_log import CommitLog, commit_name, committed_lines, log_prefix, plan_name
from fleetgen.generate.object_store import CommitBounds, ObjectShardStore
from fleetgen.generate.records import PROMPT_FAULT, SERVER_FAULT, error_record, stats_record
from fleetgen.prompts.scan import plan_shards, scan_prompts
from store_fault_proxy import INTERNAL, FaultProxy

# Commits only when asked (close) or when a bound is reached: the tests decide when a commit happens.
MANUAL = CommitBounds(lines=1_000_000, bytes=1 << 30, interval_s=3600.0)


def completion(prompt_id):
    return {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "content": "a", "reasoning_content": "",
            "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "server": "h:1",
            "latency_s": 0.1, "model": "m", "sampling": {}, "finished_at": 1.0}


def record(store, prompt_id):
    line = completion(prompt_id)
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


def fail(store, prompt_id, fault):
    line = error_record(prompt_id, code="c", message="m", server="h:1", fault=fault)
    store.record_failure(jsonio.dumps(line) + b"\n", prompt_id)


def ids(store, shard_id, kind):
    return [json.loads(line)["id"] for line in committed_lines(store, shard_id, kind)]


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{n}", "prompt": "q"}) + "\n" for n in range(20)))
    [planned] = plan_shards(path, shard_size=20, scan=scan_prompts(path))
    return planned


def test_what_a_try_recorded_is_committed_on_close_and_a_retry_resumes_after_it(object_store, shard):
    first, report = ObjectShardStore.open(object_store, shard, try_number=1, bounds=MANUAL)
    assert (report.finished, report.failed, report.sent_again) == (0, 0, 0)
    for prompt_id in ("p0", "p1", "p2"):
        record(first, prompt_id)
    fail(first, "p3", PROMPT_FAULT)
    first.save_mark(4, 0)
    first.close()
    assert ids(object_store, 0, "completions") == ids(object_store, 0, "stats") == ["p0", "p1", "p2"]
    assert ids(object_store, 0, "errors") == ["p3"]
    second, report = ObjectShardStore.open(object_store, shard, try_number=2, bounds=MANUAL)
    assert (report.finished, report.failed) == (3, 1)
    assert second.done_ids == {b"p0", b"p1", b"p2", b"p3"}
    assert [prompt.id for *_, prompt in second.pending_prompts(shard)][:2] == ["p4", "p5"]
    second.close()
    commits = [json.loads(object_store.get(info.name)) for info in object_store.list(log_prefix(0))]
    assert [(c["seq"], c["kind"], c["by"]["try"], c.get("final")) for c in commits] == [
        (1, "open", 1, None), (2, "parts", 1, True), (3, "open", 2, None), (4, "parts", 2, True)]


def test_the_mark_rides_on_the_commit_that_holds_the_records_it_covers(object_store, tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"p{n}", "prompt": "q"}) + "\n" for n in range(6)]
    path.write_text("".join(lines))
    [shard] = plan_shards(path, shard_size=6, scan=scan_prompts(path))
    offset = len(lines[0]) + len(lines[1])
    store, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(store, "p0")
    record(store, "p1")
    store.save_mark(2, offset)
    store.close()
    again, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert again.mark == (2, offset) and again.resume_point(shard) == (2, offset)
    assert [prompt.id for *_, prompt in again.pending_prompts(shard)] == ["p2", "p3", "p4", "p5"]
    again.close()


def test_a_commit_happens_once_the_buffer_reaches_its_line_bound(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=CommitBounds(lines=3, interval_s=3600.0))
    for prompt_id in ("p0", "p1", "p2", "p3"):
        record(store, prompt_id)
    deadline = time.monotonic() + 30
    while len(object_store.list(log_prefix(0))) < 2:  # the open commit, then the committer's first
        assert time.monotonic() < deadline, "the committer never committed a full buffer"
        time.sleep(0.05)
    first_parts = json.loads(object_store.get(commit_name(0, 2)))["parts"]
    assert first_parts["stats"]["lines"] >= 3
    store.close()
    assert ids(object_store, 0, "stats") == ["p0", "p1", "p2", "p3"]


def test_a_commit_happens_every_interval_with_a_few_records(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=CommitBounds(interval_s=0.2))
    record(store, "p0")
    deadline = time.monotonic() + 30
    while len(object_store.list(log_prefix(0))) < 2:
        assert time.monotonic() < deadline, "the committer never committed on its interval"
        time.sleep(0.05)
    assert ids(object_store, 0, "stats") == ["p0"]  # committed while the try is still open
    store.close()


def test_a_frozen_try_that_wakes_up_is_fenced_and_its_late_lines_never_count(object_store, shard, caplog):
    zombie, _ = ObjectShardStore.open(object_store, shard, try_number=1, bounds=MANUAL)
    record(zombie, "p0")
    zombie._commit(*zombie._take())  # commit 2: p0 is committed by try 1
    record(zombie, "p1")  # buffered when it froze (Airflow gave up on it)
    with caplog.at_level(logging.WARNING):
        newer, report = ObjectShardStore.open(object_store, shard, try_number=2, bounds=MANUAL,
                                              log=logging.getLogger("t"))
    assert report.finished == 1 and newer.done_ids == {b"p0"}  # no wait for the frozen try: fenced at once
    assert "try 1 (pid" in caplog.text and "did not close it; try 2 (pid" in caplog.text
    record(newer, "p1")
    record(newer, "p2")
    newer._commit(*newer._take())
    # The frozen try wakes and tries to commit what it held: the commit number it needs is taken.
    record(zombie, "p9")
    assert not zombie._commit(*zombie._take())
    with pytest.raises(ShardLeaseLost, match=r"\[shard 0, s3://.*/log/000000000003.json\] try 2 \(pid .*\) took this "
                                             r"shard's output over \(it created commit 3 first\); this try stops"):
        record(zombie, "p10")
    with pytest.raises(ShardLeaseLost):
        zombie.close()
    assert object_store.list(f"shards/shard-00000/parts/000000000003-{zombie.token}") == []  # its parts removed
    newer.close()
    assert ids(object_store, 0, "completions") == ids(object_store, 0, "stats") == ["p0", "p1", "p2"]


def test_two_live_tries_overlap_and_every_prompt_ends_committed_exactly_once(object_store, shard):
    old, _ = ObjectShardStore.open(object_store, shard, try_number=1, bounds=CommitBounds(lines=2, interval_s=0.05))
    for n in range(4):
        record(old, f"p{n}")
    newer, _ = ObjectShardStore.open(object_store, shard, try_number=2,
                                     bounds=CommitBounds(lines=2, interval_s=0.05))
    lost = None
    for n in range(4, 12):  # the old try goes on until its committer finds the fence
        try:
            record(old, f"p{n}")
        except ShardLeaseLost as exc:
            lost = exc
            break
        time.sleep(0.05)
    assert lost is not None, "the old try never noticed the newer one"
    for n in range(20):
        if f"p{n}".encode() not in newer.done_ids:
            record(newer, f"p{n}")
    newer.close()
    committed = ids(object_store, 0, "completions")
    assert sorted(committed, key=lambda i: int(i[1:])) == [f"p{n}" for n in range(20)]
    assert ids(object_store, 0, "stats") == committed


CHILD = r"""
import json, sys, time
sys.path.insert(0, {tests!r})
from fleetgen.storage.location import parse_location
from fleetgen.storage.objects import ObjectStore
from fleetgen.generate.object_store import CommitBounds, ObjectShardStore
from test_object_store import record
store = ObjectStore.connect(parse_location({url!r}, parameter="output_root"), conn_id={conn!r}, parameter="output_root")
shard = json.loads({shard!r})
writer, _ = ObjectShardStore.open(store, shard, try_number=1, bounds=CommitBounds(lines=5, interval_s=0.05))
for n in range(shard["count"]):
    if f"p{{n}}".encode() not in writer.done_ids:
        record(writer, f"p{{n}}")
        print("recorded", n, flush=True)
        time.sleep(0.02)
time.sleep(3600)
"""


def test_a_try_killed_mid_shard_loses_only_its_buffer_and_the_retry_completes_it_exactly_once(
        object_store, shard, store_prefix, tmp_path):
    script = CHILD.format(tests=os.path.dirname(__file__), url=store_prefix, conn=object_store.conn_id,
                          shard=json.dumps(shard))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        for line in child.stdout:  # Airflow's own log lines come here too
            if line.startswith(b"recorded ") and int(line.split()[1]) >= 12:
                break
        deadline = time.monotonic() + 30
        while len(object_store.list(log_prefix(0))) < 3:  # at least two commits of parts
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    before = ids(object_store, 0, "completions")
    assert 5 <= len(before) <= 13
    retry, report = ObjectShardStore.open(object_store, shard, try_number=2, bounds=MANUAL)
    assert report.finished == len(before)
    for *_, prompt in retry.pending_prompts(shard):
        record(retry, prompt.id)
    retry.close()
    assert ids(object_store, 0, "completions") == [f"p{n}" for n in range(20)]


def test_errors_not_the_prompts_fault_are_sent_again_and_the_mark_is_dropped(object_store, shard):
    first, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(first, "p0")
    fail(first, "p1", PROMPT_FAULT)
    fail(first, "p2", SERVER_FAULT)
    first.save_mark(3, 0)
    first.close()
    second, report = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert (report.finished, report.failed, report.sent_again) == (1, 1, 1)
    assert second.done_ids == {b"p0", b"p1"} and second.mark is None
    fail(second, "p5", PROMPT_FAULT)
    record(second, "p2")
    second.close()
    assert ids(object_store, 0, "errors") == ["p1", "p5"]
    third, report = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert (report.finished, report.failed, report.sent_again) == (2, 2, 0)
    third.close()


def test_a_retry_over_a_different_plan_is_refused_naming_what_changed(object_store, shard):
    ObjectShardStore.open(object_store, shard, bounds=MANUAL)[0].close()
    with pytest.raises(ShardPlanChanged) as changed:
        ObjectShardStore.open(object_store, {**shard, "count": 19}, bounds=MANUAL)
    text = str(changed.value)
    assert "count changed" in text and object_store.url(plan_name(0)) in text


def test_a_committed_part_that_was_cut_or_removed_is_named(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(store, "p0")
    store.close()
    part = json.loads(object_store.get(commit_name(0, 2)))["parts"]["stats"]["name"]
    object_store.put(part, object_store.get(part)[:-5])
    with pytest.raises(GenerationError, match=r"part of the shard's output is torn: .* its commit recorded"):
        ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    object_store.delete(part)
    with pytest.raises(GenerationError, match=r"\[shard 0, s3://.*stats.jsonl\] a committed part .* is missing"):
        list(committed_lines(object_store, 0, "stats"))


def test_a_gap_in_the_log_is_named(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(store, "p0")
    store.close()
    object_store.delete(commit_name(0, 1))
    with pytest.raises(GenerationError, match=r"commit log has a gap: .*000000000001.json is missing"):
        CommitLog(object_store, 0).read()


def test_a_commit_whose_answer_was_lost_and_sent_again_counts_as_made(object_store):
    log = CommitLog(object_store, 4)
    assert log.commit(1, {"kind": "open"}, token="abc") is None
    assert log.commit(1, {"kind": "open"}, token="abc") is None  # botocore's retry finds its own commit
    assert log.commit(1, {"kind": "open"}, token="other")["token"] == "abc"


def test_a_try_that_races_a_commit_while_opening_reads_the_log_again(object_store, shard, monkeypatch):
    old, _ = ObjectShardStore.open(object_store, shard, try_number=1, bounds=MANUAL)
    record(old, "p0")
    read = CommitLog.read
    raced = []

    def read_then_race(self):
        state = read(self)
        if not raced:  # the old try commits between the new try's read and its fence
            raced.append(old._commit(*old._take()))
        return state

    monkeypatch.setattr(CommitLog, "read", read_then_race)
    newer, report = ObjectShardStore.open(object_store, shard, try_number=2, bounds=MANUAL)
    assert raced == [True] and report.finished == 1 and newer.done_ids == {b"p0"}
    newer.close()
    with pytest.raises(ShardLeaseLost):
        old.close()


def test_a_store_that_fails_a_commit_stops_the_try_and_keeps_what_was_committed(seaweedfs, store_prefix, shard,
                                                                                monkeypatch):
    from fleetgen.storage.location import parse_location
    from fleetgen.storage.objects import ObjectStore

    proxy = FaultProxy(seaweedfs.endpoint_url)
    connection = seaweedfs.connection()
    connection["extra"]["endpoint_url"] = proxy.url
    monkeypatch.setenv("AIRFLOW_CONN_FLEETGEN_FLAKY", json.dumps(connection))
    monkeypatch.setattr("fleetgen.storage.objects.RETRY_ATTEMPTS", 2)
    store = ObjectStore.connect(parse_location(store_prefix, parameter="output_root"), conn_id="fleetgen_flaky",
                                parameter="output_root")
    try:
        writer, _ = ObjectShardStore.open(store, shard, bounds=MANUAL)
        record(writer, "p0")
        assert writer._commit(*writer._take())
        record(writer, "p1")
        proxy.fail(INTERNAL, 10, {"PUT"})
        assert not writer._commit(*writer._take())
        with pytest.raises(StoreError, match=r"InternalError \(HTTP 500\) after 2 tries"):
            record(writer, "p2")
        with pytest.raises(StoreError):
            writer.close()
        assert ids(store, 0, "stats") == ["p0"]
    finally:
        proxy.close()


# --- a whole shard with its output on the store ------------------------------------------------------------------

def test_a_shard_run_commits_its_records_and_journals_to_the_store_and_its_retry_skips_them(object_store, tmp_path):
    import asyncio

    import httpx

    from generate_fakes import FakeFleet, fast_settings, write_prompts

    from fleetgen.generate import run_shard_async

    shard = {**write_prompts(tmp_path / "p.jsonl", 30), "shard_id": 6}
    fleet = FakeFleet(2, delay_s=0.005)
    fleet.behaviour["s1:1"] = lambda prompt_id, n: httpx.Response(500, json={"error": {"message": "engine died"}})
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = asyncio.run(run_shard_async(shard, fleet.endpoints(limit=2), tmp_path / "scratch",
                                          fast_settings(sample_interval_s=0.01),
                                          options=fleet.options(output=object_store)))
    assert summary["done"] == 30
    generated = ids(object_store, 6, "completions")
    assert sorted(generated) == [f"p{n:04d}" for n in range(30)] and ids(object_store, 6, "stats") == generated
    assert "down" in {json.loads(line)["event"] for line in committed_lines(object_store, 6, "events")}
    assert {json.loads(line)["server"] for line in committed_lines(object_store, 6, "metrics")} <= set(fleet.names)
    assert not (tmp_path / "scratch").exists()  # nothing of the run on this worker's disk
    assert json.loads(object_store.get("servers-health.json"))["servers"]["s1:1"]["state"] == "down"
    assert object_store.list("shards/shard-00006.alive") == []  # its heartbeat was removed as it ended
    again = asyncio.run(run_shard_async(shard, fleet.endpoints(limit=2), tmp_path / "scratch", fast_settings(),
                                        options=fleet.options(output=object_store)))
    assert (again["done"], again["skipped_already_done"]) == (0, 30)
    assert ids(object_store, 6, "completions") == generated


def test_shards_on_the_store_share_the_fleet_by_their_heartbeats_there(object_store, tmp_path):
    import asyncio

    from generate_fakes import FakeFleet, fast_settings, write_prompts

    from fleetgen.generate import run_shard_async
    from fleetgen.generate.liveness import ShardHeartbeat
    from fleetgen.storage.run_files import ObjectRunFiles

    other = ShardHeartbeat(ObjectRunFiles(object_store), 9, try_number=1)  # a shard on another worker
    other.start()
    other.beat({}, False)
    fleet = FakeFleet(2, limit=6)
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    asyncio.run(run_shard_async(shard, fleet.endpoints(), tmp_path / "scratch", fast_settings(),
                                options=fleet.options(sharing=lambda: 2, output=object_store)))
    assert all(fleet.max_in_flight[name] == 3 for name in fleet.names), fleet.max_in_flight
    other.stop()
    assert object_store.list("shards/shard-00009.alive") == []


def test_recording_waits_for_the_committer_once_it_is_too_far_behind(object_store, shard, monkeypatch):
    import threading

    from fleetgen.storage.objects import ObjectStore

    release = threading.Event()
    put = ObjectStore.put

    def slow_put(self, name, data, **kwargs):
        if "/parts/" in name:
            release.wait(30)  # the store is slow to take the parts
        return put(self, name, data, **kwargs)

    store, _ = ObjectShardStore.open(object_store, shard,
                                     bounds=CommitBounds(lines=1, interval_s=0.01, max_behind=600))
    monkeypatch.setattr(ObjectStore, "put", slow_put)
    record(store, "p0")  # taken by the committer, which now waits on the store
    recorded = threading.Event()

    def more():
        for n in range(1, 4):
            record(store, f"p{n}")
        recorded.set()

    threading.Thread(target=more, daemon=True).start()
    assert not recorded.wait(0.5)  # about 600 bytes are waiting to be committed: recording waits
    release.set()
    assert recorded.wait(30)
    store.close()
    assert ids(object_store, 0, "stats") == ["p0", "p1", "p2", "p3"]


def test_an_unreadable_line_in_a_committed_part_is_named(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(store, "p0")
    store.close()
    part = json.loads(object_store.get(commit_name(0, 2)))["parts"]["stats"]
    object_store.put(part["name"], b"[1, 2]" + b" " * (part["bytes"] - 7) + b"\n")  # the same size, no id
    with pytest.raises(GenerationError) as unreadable:
        ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert unreadable.value.path == object_store.url(part["name"]) and unreadable.value.shard == 0
    assert unreadable.value.message.startswith("unreadable line in the shard's committed output: b'[1, 2]")


def test_a_try_that_opened_and_never_closed_is_named_by_the_next(object_store, shard, caplog):
    ObjectShardStore.open(object_store, shard, try_number=1, bounds=MANUAL)  # opened, then died
    with caplog.at_level(logging.WARNING):
        newer, _ = ObjectShardStore.open(object_store, shard, try_number=2, bounds=MANUAL, log=logging.getLogger("t"))
    newer.close()
    assert "shard 0: try 1 (pid" in caplog.text and "fenced it at commit 2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ObjectShardStore.open(object_store, shard, try_number=3, bounds=MANUAL, log=logging.getLogger("t"))[0].close()
    assert "did not close it" not in caplog.text  # try 2 closed its output


# --- what each commit records, and when the committer commits ----------------------------------------------------

def line_bytes(prompt_id):
    line = completion(prompt_id)
    return len(jsonio.dumps(line) + b"\n") + len(jsonio.dumps(stats_record(line)) + b"\n")


def commits(object_store, shard_id=0):
    return [json.loads(object_store.get(info.name)) for info in object_store.list(log_prefix(shard_id))]


def wait_for_commits(object_store, count, shard_id=0):
    deadline = time.monotonic() + 30
    while len(object_store.list(log_prefix(shard_id))) < count:
        assert time.monotonic() < deadline, f"fewer than {count} commits after 30 s"
        time.sleep(0.02)


def test_each_commit_records_its_kind_writer_token_and_mark(object_store, shard):
    store, report = ObjectShardStore.open(object_store, shard, try_number=4, bounds=MANUAL)
    assert (report.torn_bytes, report.restored_stats) == ({}, 0) and len(store.token) == 12
    record(store, "p0")
    fail(store, "p5", PROMPT_FAULT)
    assert store.done_ids == {b"p0", b"p5"}  # neither is sent again by this try
    store.save_mark(1, 40)
    assert store.mark == (1, 40)
    assert store._commit(*store._take())
    [opened, parts] = commits(object_store)
    assert opened == {"kind": "open", "by": opened["by"], "mark": None, "seq": 1, "token": store.token}
    assert opened["by"]["try"] == 4 and parts["token"] == store.token and parts["mark"] == [1, 40]
    assert set(parts["parts"]) == {"completions", "stats", "errors"}
    assert store._commit(*store._take())  # nothing new: no commit, and the committer goes on
    assert len(commits(object_store)) == 2
    store.save_mark(1, 44)  # only the mark moved: committed on its own
    assert store._commit(*store._take())
    assert commits(object_store)[-1]["mark"] == [1, 44] and commits(object_store)[-1]["parts"] == {}
    store.close()
    again, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert commits(object_store)[-1]["mark"] == [1, 44]  # a new try's open commit restates the mark it resumes from
    again.close()


def test_the_errors_a_new_try_restates_void_the_mark_even_one_the_records_back(object_store, tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"p{n}", "prompt": "q"}) + "\n" for n in range(4)]
    path.write_text("".join(lines))
    [shard] = plan_shards(path, shard_size=4, scan=scan_prompts(path))
    first, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    record(first, "p0")
    fail(first, "p1", PROMPT_FAULT)
    fail(first, "p2", SERVER_FAULT)
    first.save_mark(2, len(lines[0]) + len(lines[1]))  # two records back it: a mark the output supports
    first.close()
    second, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    assert second.mark is None
    opened = commits(object_store)[-1]
    assert opened["mark"] is None and opened["errors_base"]["name"].endswith(".errors.jsonl")
    second.close()


def test_the_committer_commits_at_its_line_bound_counting_failures_too(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=CommitBounds(lines=2, interval_s=3600.0))
    record(store, "p0")
    fail(store, "p1", PROMPT_FAULT)
    wait_for_commits(object_store, 2)
    store.close()


def test_the_committer_commits_at_its_byte_bound(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard,
                                     bounds=CommitBounds(lines=1000, bytes=line_bytes("p0"), interval_s=3600.0))
    record(store, "p0")
    wait_for_commits(object_store, 2)
    store.close()


def test_the_committer_carries_the_mark_without_waiting_for_close(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=CommitBounds(interval_s=0.05))
    record(store, "p0")
    store.save_mark(1, 40)
    deadline = time.monotonic() + 30
    while not any(commit.get("mark") == [1, 40] for commit in commits(object_store)):
        assert time.monotonic() < deadline, "the mark was never committed"
        time.sleep(0.05)
    store.close()


def test_recording_waits_exactly_once_max_behind_bytes_are_not_committed(object_store, shard, monkeypatch):
    import threading

    from fleetgen.storage.objects import ObjectStore

    release = threading.Event()
    put = ObjectStore.put

    def slow_put(self, name, data, **kwargs):
        if "/parts/" in name:
            release.wait(30)
        return put(self, name, data, **kwargs)

    size = line_bytes("p0")
    store, _ = ObjectShardStore.open(object_store, shard,
                                     bounds=CommitBounds(lines=1, interval_s=0.01, max_behind=2 * size))
    monkeypatch.setattr(ObjectStore, "put", slow_put)
    record(store, "p0")
    while store._committing == 0:  # the committer took p0 and waits on the store
        time.sleep(0.01)
    done = []

    def more():
        for n in (1, 2):
            record(store, f"p{n}")
            done.append(n)

    threading.Thread(target=more, daemon=True).start()
    deadline = time.monotonic() + 30
    while not done:  # p1 fits beside p0 in flight
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert done == [1]  # with p2, p0 in flight and p1 buffered make exactly max_behind: it waits
    release.set()
    deadline = time.monotonic() + 30
    while done != [1, 2]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    store.close()


def test_a_changed_plan_names_every_key_that_changed_and_what_to_delete(object_store, shard):
    ObjectShardStore.open(object_store, shard, bounds=MANUAL)[0].close()
    with pytest.raises(ShardPlanChanged) as changed:
        ObjectShardStore.open(object_store, {**shard, "count": 19, "start": 1}, bounds=MANUAL)
    error = changed.value
    assert (error.shard, error.path) == (0, object_store.url(plan_name(0)))
    assert "count, start changed (the prompts file or shard_size changed since this run planned its shards); a " \
           "retry finds the same output" in error.message
    assert error.hint == ("trigger a new run for the edited prompts file (a new run id gets a prefix of its own); or, "
                          f"to redo only this shard in this run, delete {object_store.url(plan_name(0))} and every "
                          f"object under {object_store.url('shards/shard-00000/')}, then clear this task")


def test_a_log_that_keeps_moving_while_a_try_opens_is_named(object_store, shard, monkeypatch):
    from fleetgen.generate import object_store as object_store_module

    monkeypatch.setattr(object_store_module, "OPEN_RACES", 2)
    commit = CommitLog.commit
    monkeypatch.setattr(CommitLog, "commit", lambda self, seq, record, *, token: {"token": "another"})
    with pytest.raises(StoreError) as racing:
        ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    monkeypatch.setattr(CommitLog, "commit", commit)
    error = racing.value
    assert (error.shard, error.path, error.conn_id) == (0, object_store.url(), object_store.conn_id)
    assert error.message == ("could not open the shard's log: 2 other commits were created while this try read it")
    assert error.hint == "another try of this shard commits faster than this one can read: let it finish"


def test_an_unreadable_error_line_names_the_shards_parts(object_store, shard):
    store, _ = ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    fail(store, "p0", PROMPT_FAULT)
    store.close()
    part = json.loads(object_store.get(commit_name(0, 2)))["parts"]["errors"]
    object_store.put(part["name"], b"[3]" + b" " * (part["bytes"] - 4) + b"\n")
    with pytest.raises(GenerationError) as unreadable:
        ObjectShardStore.open(object_store, shard, bounds=MANUAL)
    error = unreadable.value
    assert error.path == object_store.url("shards/shard-00000/parts/")
    assert error.message.startswith("unreadable line in the shard's committed output: b'[3]  ")
    assert error.hint == ("parts are written only by fleetgen: restore the object, or delete the shard's objects to "
                          "regenerate the shard")
