"""Running shards counted by their own heartbeat: a dead try stops counting, leaves a failure record,
and its dead time comes out of the report's throughput."""

import json
import os
import time

import pytest
from generate_fakes import FakeFleet, fast_settings, write_prompts

from fleetgen.airflow.sharing import running_shards_counter
from fleetgen.generate import run_shard_async
from fleetgen.generate.liveness import STALE_AFTER_S, ShardHeartbeat, dead_seconds, live_shards, lost_tries
from fleetgen.outputs import RunLayout


class FakeTaskInstance:
    """What the sharing counter asks of Airflow: it still counts a try whose worker died as running."""

    dag_id, task_id, run_id = "sglang_generation", "generate.generate_shard", "run-1"

    def __init__(self, running: int) -> None:
        self.running = running

    def get_ti_count(self, **_filters) -> int:
        return self.running


def _die(heartbeat: ShardHeartbeat, seconds_ago: float) -> None:
    """A try killed ``seconds_ago``: its heartbeat file stays, its mtime stops."""
    stamp = time.time() - seconds_ago
    os.utime(heartbeat.path, (stamp, stamp))


def test_a_live_try_counts_until_it_stops(tmp_path):
    layout = RunLayout(tmp_path)
    heartbeat = ShardHeartbeat(layout, 3)
    assert heartbeat.start() is None
    assert live_shards(layout) == 1
    heartbeat.beat()
    assert live_shards(layout) == 1
    heartbeat.stop()
    assert live_shards(layout) == 0 and not heartbeat.path.exists()


def test_a_dead_try_stops_counting_and_no_longer_halves_the_live_shard(tmp_path):
    layout = RunLayout(tmp_path)
    dead, live = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    dead.start()
    live.start()
    count = running_shards_counter(FakeTaskInstance(running=2), layout)
    assert count() == 2  # both beating: each takes half of every server
    _die(dead, seconds_ago=STALE_AFTER_S + 5)
    # Airflow still says 2 running (until its heartbeat timeout); the dead try's heartbeat says otherwise.
    assert count() == 1


def test_the_next_try_records_the_dead_one_and_its_dead_time(tmp_path):
    layout = RunLayout(tmp_path)
    first = ShardHeartbeat(layout, 5, try_number=1)
    first.start(now=time.time() - 100)
    _die(first, seconds_ago=40)
    retry = ShardHeartbeat(layout, 5, try_number=2)
    lost = retry.start()
    assert lost["try"] == 1 and lost["pid"] == os.getpid() and lost["shard_id"] == 5
    assert 39 <= lost["dead_s"] <= 42
    assert lost_tries(layout) == [lost]
    retry.stop()
    # a try that ended cleanly leaves nothing for the next one to report
    assert ShardHeartbeat(layout, 5, try_number=3).start() is None


def test_dead_seconds_count_overlapping_dead_tries_once_and_only_within_the_span():
    lost = [{"dead_since_s": 10.0, "resumed_s": 30.0}, {"dead_since_s": 20.0, "resumed_s": 40.0},
            {"dead_since_s": 90.0, "resumed_s": 200.0}]
    assert dead_seconds(lost, 0.0, 100.0) == pytest.approx(30.0 + 10.0)
    assert dead_seconds([], 0.0, 100.0) == 0.0


@pytest.mark.anyio
async def test_a_shard_resumed_after_a_killed_try_reports_it_and_removes_its_heartbeat(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    layout = RunLayout(tmp_path / "out")
    killed = ShardHeartbeat(layout, 0, try_number=1)
    killed.start()
    _die(killed, seconds_ago=30)
    fleet = FakeFleet(2)
    summary = await run_shard_async(shard, fleet.endpoints(), layout.root, fast_settings(), transport=fleet.transport())
    assert summary["done"] == 20
    assert summary["lost_try"]["try"] == 1 and summary["lost_try"]["dead_s"] >= 29
    assert live_shards(layout) == 0 and not killed.path.exists()
    again = await run_shard_async(shard, fleet.endpoints(), layout.root, fast_settings(), transport=fleet.transport())
    assert again["lost_try"] is None


def test_the_report_gives_throughput_net_of_dead_time(tmp_path):
    from fleetgen.report.build import _net_of_dead_tries

    report = {"timing": {"first_start": 1000.0, "last_finish": 1100.0, "generation_seconds": 100.0},
              "totals": {"completion_tokens": 6000}, "throughput": {}}
    _net_of_dead_tries(report, [{"dead_since_s": 1050.0, "resumed_s": 1090.0}])
    assert report["timing"]["dead_seconds"] == 40.0 and report["timing"]["lost_tries"] == 1
    assert report["throughput"]["tokens_per_s_net_of_dead_time"] == 100.0


def test_a_lost_try_leaves_a_failure_record(tmp_path):
    from fleetgen.airflow.failures import record_lost_try

    layout = RunLayout(tmp_path)
    first = ShardHeartbeat(layout, 2, try_number=1)
    first.start()
    _die(first, seconds_ago=25)
    record_lost_try(layout, "generate.generate_shard", ShardHeartbeat(layout, 2, try_number=2).start())
    record = json.loads(layout.failures.read_text())
    assert record["task"] == "generate.generate_shard[2]" and record["try"] == 1 and record["error"] == "TryLost"
    assert "task_instance_heartbeat_timeout" in record["hint"]
