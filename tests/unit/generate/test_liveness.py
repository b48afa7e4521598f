"""Running shards counted by their own heartbeat: a dead try stops counting, leaves a failure record,
and its dead time comes out of the report's throughput."""

import json
import os
import time

import pytest
from generate_fakes import FakeFleet, fast_settings, write_prompts

from fleetgen.generate import run_shard_async
from fleetgen.generate.liveness import (STALE_AFTER_S, FleetShare, ShardHeartbeat, dead_seconds, fleet_share,
                                       lost_tries)
from fleetgen.outputs import RunLayout


def _die(heartbeat: ShardHeartbeat, seconds_ago: float) -> None:
    """A try killed ``seconds_ago``: its heartbeat file stays, its mtime stops."""
    stamp = time.time() - seconds_ago
    os.utime(heartbeat.path, (stamp, stamp))


def test_a_live_try_counts_until_it_stops(tmp_path):
    layout = RunLayout(tmp_path)
    observer, heartbeat = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 3)
    observer.start()
    assert heartbeat.start() is None
    assert fleet_share(layout, observer).active == 2
    heartbeat.beat()
    assert fleet_share(layout, observer).active == 2
    heartbeat.stop()
    assert fleet_share(layout, observer).active == 1 and not heartbeat.path.exists()


def test_a_dead_try_stops_counting_and_no_longer_halves_the_live_shard(tmp_path):
    layout = RunLayout(tmp_path)
    dead, live = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    dead.start()
    live.start()
    # both beating: each takes half of every server
    assert fleet_share(layout, live, running_in_airflow=2).active == 2
    _die(dead, seconds_ago=STALE_AFTER_S + 5)
    # Airflow still says 2 running (until its heartbeat timeout); the dead try's heartbeat says otherwise.
    assert fleet_share(layout, live, running_in_airflow=2).active == 1


def test_a_new_shard_takes_only_the_room_the_others_leave_and_a_draining_one_hands_its_part_over(tmp_path):
    layout = RunLayout(tmp_path)
    first, second = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    first.start()
    second.start()
    # the first has not said what it holds yet: it may hold the whole fleet, the second waits for its word
    assert fleet_share(layout, second).cap("s0:1", 111) == 0
    first.beat({"s0:1": 100, "s1:1": 30}, draining=False)  # it had the whole fleet until now
    share = fleet_share(layout, second)
    assert share == FleetShare(active=2, others_in_flight={"s0:1": 100, "s1:1": 30})
    # fleet limit 111 per server: half is 56, but on s0 the first shard leaves only 11 for now
    assert (share.cap("s0:1", 111), share.cap("s1:1", 111)) == (11, 56)
    first.beat({"s0:1": 20, "s1:1": 5}, draining=True)  # no fresh prompts left: it no longer takes a share
    share = fleet_share(layout, second)
    assert share.active == 1 and (share.cap("s0:1", 111), share.cap("s1:1", 111)) == (91, 106)


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
    assert not layout.heartbeat_files() and not killed.path.exists()
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
