"""The shard output lease: one writing try at a time; a newer try takes over, a frozen one is named."""

import json
import threading
import time

import pytest

from fleetgen.errors import ShardLeaseBusy, ShardLeaseLost
from fleetgen.generate import jsonio
from fleetgen.generate.lease import CHECK_INTERVAL_S, ShardLease
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
    deadline = time.monotonic() + 5
    while json.loads((tmp_path / "shards" / "shard-00007.lease.json").read_text())["try"] != 2:
        assert time.monotonic() < deadline
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
