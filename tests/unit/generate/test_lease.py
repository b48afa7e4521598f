"""The shard output lease: one writing try at a time; a newer try takes over, a frozen one is named."""

import fcntl
import json
import logging
import os
import pathlib
import re
import socket
import threading
import time

import pytest

from fleetgen.errors import ShardLeaseBusy, ShardLeaseLost
from fleetgen.generate import jsonio
from fleetgen.generate import lease as lease_module
from fleetgen.generate.lease import CHECK_INTERVAL_S, LeaseHolder, ShardLease
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore

SHARD = {"shard_id": 7, "input_path": "/data/prompts.jsonl", "start": 0, "count": 100}


def record(store, prompt_id):
    line = {"id": prompt_id, "messages": [{"role": "user", "content": "q"}], "content": "a", "reasoning_content": "",
            "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "server": "h:1",
            "latency_s": 0.1, "model": "m", "sampling": {}, "finished_at": 1.0}
    store.record_completion(jsonio.dumps(line) + b"\n", jsonio.dumps(stats_record(line)) + b"\n", prompt_id)


def test_a_frozen_holder_makes_the_new_try_fail_clearly_and_is_fenced_off(tmp_path):
    old = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=1.0)
    with pytest.raises(ShardLeaseBusy) as busy:
        ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=0.3)
    text = str(busy.value)
    assert "shard 7" in text and "try 1 (pid" in text and "try 2 (pid" in text and "kill it" in text
    # The frozen try, should it ever run again, stops before its next write.
    with pytest.raises(ShardLeaseLost, match=r"try 2 .* took this shard's output over; try 1 .* stops here"):
        old.check()
    old.release()
    ShardLease.acquire(tmp_path, 7, try_number=3, wait_s=0.3).release()  # the lock is free again


def test_a_newer_try_takes_over_and_the_old_one_stops_at_its_next_write(tmp_path):
    old, _ = ShardStore.open(tmp_path, SHARD, try_number=1)
    record(old, "a")
    opened = {}
    newer = threading.Thread(target=lambda: opened.update(store=ShardStore.open(tmp_path, SHARD, try_number=2,
                                                                                lease_wait_s=10.0)[0]))
    newer.start()
    deadline = time.monotonic() + 60  # ends when try 2 has written its claim (a thread start on a busy machine)
    while (lease := json.loads((tmp_path / "shards" / "shard-00007.lease.json").read_text()))["try"] != 2:
        assert time.monotonic() < deadline, f"try 2 never claimed the lease: {lease}"
        time.sleep(0.01)
    time.sleep(2 * CHECK_INTERVAL_S)  # the lease file is looked at no more often than this
    with pytest.raises(ShardLeaseLost, match=r"\[shard 7, .*try 2 .*try 1 "):
        record(old, "b")
    with pytest.raises(ShardLeaseLost):
        old.save_mark(1, 10)
    assert "store" not in opened  # the new try waits for the old one to close
    old.close()
    newer.join(5)
    store = opened["store"]
    assert store.done_ids == {b"a"}
    record(store, "b")
    store.close()
    assert [json.loads(line)["id"] for line in store.stats_path.read_text().splitlines()] == ["a", "b"]


def test_a_crashed_holder_leaves_nothing_in_the_way(tmp_path):
    store, _ = ShardStore.open(tmp_path, SHARD, try_number=1)
    store._lease.release()  # what the kernel does when the process dies
    ShardStore.open(tmp_path, SHARD, try_number=2, lease_wait_s=0.1)[0].close()
    store.close()


# The lease on its own: holders, takeover, the check interval, three tries of one shard.

class FakeTime:
    """Stands in for the lease module's ``time``: ``sleep`` advances ``monotonic`` and runs ``on_sleep``."""

    def __init__(self, start: float = 1000.0, on_sleep=None) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


def lock_is_free(root, shard_id=7) -> bool:
    probe = ShardLease(pathlib.Path(root), shard_id, LeaseHolder(None, 0, "h", "s"))
    fd = os.open(probe.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_free_shard_is_leased_with_this_process_as_holder(tmp_path):
    lease = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    holder = LeaseHolder.from_file(lease.lease_path)
    assert (holder.try_number, holder.pid, holder.host) == (1, os.getpid(), socket.gethostname())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", holder.since)
    assert not lock_is_free(tmp_path)
    assert sorted(p.name for p in lease.lease_path.parent.iterdir()) == ["shard-00007.lease.json", "shard-00007.lock"]
    lease.check(now=True)
    lease.check()
    lease.release()
    assert lock_is_free(tmp_path)
    lease.release()  # a second release is harmless


def test_a_lease_in_a_run_folder_not_made_yet_makes_it_with_a_readable_lock(tmp_path):
    lease = ShardLease.acquire(tmp_path / "run" / "out", 7, try_number=1, wait_s=0.0)
    mask = os.umask(0)
    os.umask(mask)
    assert lease.lock_path.stat().st_mode & 0o777 == 0o644 & ~mask
    lease.release()


def test_the_try_number_zero_is_named_as_such_and_none_is_a_try():
    assert LeaseHolder(0, 12, "n1", "t").describe() == "try 0 (pid 12 on n1, since t)"
    assert LeaseHolder(None, 12, "n1", "t").describe() == "a try (pid 12 on n1, since t)"
    assert LeaseHolder(3, 12, "n1", "t").describe() == "try 3 (pid 12 on n1, since t)"


def test_a_holder_reads_back_what_it_wrote(tmp_path):
    path = tmp_path / "lease.json"
    holder = LeaseHolder(2, 345, "node-1", "2026-01-01T00:00:00Z")
    path.write_bytes(holder.to_json())
    assert json.loads(path.read_text()) == {"try": 2, "pid": 345, "host": "node-1", "since": "2026-01-01T00:00:00Z"}
    assert LeaseHolder.from_file(path) == holder


@pytest.mark.parametrize("content, expected", [
    ('{"pid": "12", "host": 5}', LeaseHolder(None, 12, "5", "?")),
    ('{"try": 0, "pid": 1, "host": "h", "since": "s"}', LeaseHolder(0, 1, "h", "s")),
    ('{"try": 1, "host": "h"}', None), ('{"try": 1, "pid": 1}', None), ('{"pid": "x", "host": "h"}', None),
    ('{"pid": null, "host": "h"}', None), ("[1]", None), ("{", None), ("", None)])
def test_a_lease_file_is_read_tolerantly(tmp_path, content, expected):
    path = tmp_path / "lease.json"
    path.write_text(content)
    assert LeaseHolder.from_file(path) == expected


def test_a_missing_lease_file_has_no_holder(tmp_path):
    assert LeaseHolder.from_file(tmp_path / "missing.json") is None


def test_a_takeover_gives_up_exactly_when_the_wait_runs_out(tmp_path, monkeypatch, caplog):
    old = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    clock = FakeTime()
    monkeypatch.setattr(lease_module, "time", clock)
    monkeypatch.setattr(lease_module, "LOCK_POLL_S", 0.25)
    fds = open_fds()
    with caplog.at_level(logging.WARNING), pytest.raises(ShardLeaseBusy) as busy:
        ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=0.5, log=logging.getLogger("lease"))
    assert clock.sleeps == [0.25, 0.25]  # tried at 0, 0.25 and 0.5 s, then gave up
    assert open_fds() == fds  # the failed try closed what it opened
    error = busy.value
    assert error.shard == 7 and error.path == str(old.lock_path)
    assert error.message.startswith(f"try 1 (pid {os.getpid()} on {socket.gethostname()}, since ")
    assert f"still holds the output lock {old.lock_path} after 0 s; try 2 (pid" in error.message
    assert error.message.endswith(" has claimed the lease, so the old try stops before its next write if it ever "
                                  "runs again")
    assert error.hint.startswith("the old try is frozen or stuck (no progress save for 0 s): if pid "
                                 f"{os.getpid()} on {socket.gethostname()} is a task that Airflow gave up on")
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("shard 7: try 1 (pid ") and "; try 2 (pid " in warning
    assert warning.endswith("takes it over and waits up to 0 s for it to stop")
    old.release()


def test_a_takeover_with_no_wait_gives_up_at_once(tmp_path, monkeypatch):
    old = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    clock = FakeTime()
    monkeypatch.setattr(lease_module, "time", clock)
    with pytest.raises(ShardLeaseBusy):
        ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=0.0)
    assert clock.sleeps == []
    old.release()


def test_a_holder_with_an_unreadable_lease_file_is_named_as_such(tmp_path, monkeypatch):
    old = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    old.lease_path.write_text("{")
    monkeypatch.setattr(lease_module, "time", FakeTime())
    with pytest.raises(ShardLeaseBusy) as busy:
        ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=0.0)
    assert busy.value.message.startswith("another try (its lease file is unreadable) still holds the output lock")
    assert "if pid ? on ? is a task" in busy.value.hint
    old.release()


def test_a_takeover_succeeds_when_the_old_try_lets_go_and_is_logged(tmp_path, monkeypatch, caplog):
    old = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    clock = FakeTime(on_sleep=lambda count: old.release() if count == 2 else None)
    monkeypatch.setattr(lease_module, "time", clock)
    with caplog.at_level(logging.WARNING):
        new = ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=10.0, log=logging.getLogger("lease"))
    assert clock.sleeps == [lease_module.LOCK_POLL_S] * 2
    assert LeaseHolder.from_file(new.lease_path).try_number == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and messages[1].startswith("shard 7: took the output over from try 1 (pid ")
    assert messages[0].endswith("waits up to 10 s for it to stop")
    new.check(now=True)
    new.release()


def test_three_tries_of_one_shard_the_newest_claim_wins(tmp_path, monkeypatch):
    first = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    third_claim = ShardLease(tmp_path, 7, LeaseHolder(3, 999, "node-3", "later"))

    def meanwhile(count):
        if count == 1:  # while the second try waits, a third claims the lease and the first lets go
            third_claim._claim()
            first.release()

    monkeypatch.setattr(lease_module, "time", FakeTime(on_sleep=meanwhile))
    with pytest.raises(ShardLeaseLost) as lost:
        ShardLease.acquire(tmp_path, 7, try_number=2, wait_s=10.0)
    assert lost.value.message.startswith("try 3 (pid 999 on node-3, since later) took this shard's output over; "
                                         "try 2 (pid ")
    assert lock_is_free(tmp_path)  # the second try let go of the lock it had just taken
    # the first try, were it still running, is fenced off too
    with pytest.raises(ShardLeaseLost, match=r"try 3 \(pid 999"):
        first.check(now=True)
    third_claim.release()


def test_the_lease_file_is_looked_at_no_more_often_than_the_check_interval(tmp_path, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(lease_module, "time", clock)
    monkeypatch.setattr(lease_module, "CHECK_INTERVAL_S", 0.25)  # exact in binary: no rounding at the boundary
    lease = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    lease.check()  # looked at now
    ShardLease(tmp_path, 7, LeaseHolder(2, 5, "h", "s"))._claim()  # a newer try claims it
    clock.now += 0.125
    lease.check()  # too soon to look again
    clock.now += 0.125  # exactly one interval since the last look
    with pytest.raises(ShardLeaseLost):
        lease.check()
    lease.release()


def test_the_check_interval_counts_from_the_last_look_not_the_first(tmp_path, monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(lease_module, "time", clock)
    monkeypatch.setattr(lease_module, "CHECK_INTERVAL_S", 0.25)
    lease = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    lease.check()
    clock.now += 0.25
    lease.check()  # a second look, one interval after the first
    ShardLease(tmp_path, 7, LeaseHolder(2, 5, "h", "s"))._claim()
    clock.now += 0.125  # 1.5 intervals after the first look, 0.5 after the last
    lease.check()
    clock.now += 0.125
    with pytest.raises(ShardLeaseLost):
        lease.check()
    lease.release()


def test_a_removed_lease_file_means_the_lease_is_lost(tmp_path):
    lease = ShardLease.acquire(tmp_path, 7, try_number=None, wait_s=0.0)
    lease.lease_path.unlink()
    with pytest.raises(ShardLeaseLost) as lost:
        lease.check(now=True)
    assert lost.value.message.startswith("another try took this shard's output over; a try (pid ")
    assert lost.value.shard == 7 and lost.value.path == str(lease.lease_path)
    assert lost.value.hint == ("two tries of this shard ran at once (Airflow started a retry while this one was "
                               "still alive); nothing to do: the newer try resumes from the output on disk")
    lease.release()


def test_a_released_lease_no_longer_counts_as_held(tmp_path):
    lease = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    lease.release()
    with pytest.raises(ShardLeaseLost):
        lease.check()


def test_reclaiming_replaces_the_descriptor_kept_on_the_lease_file(tmp_path):
    lease = ShardLease.acquire(tmp_path, 7, try_number=1, wait_s=0.0)
    fds = open_fds()
    lease._claim()
    assert open_fds() == fds  # the previous lease file's descriptor was closed
    lease.check(now=True)
    lease.release()
    assert open_fds() == fds - 2
