"""Running shards counted by their own heartbeat: a dead try stops counting, leaves a failure record,
and its dead time comes out of the report's throughput."""

import asyncio
import json
import logging
import os
import socket
import time
from types import SimpleNamespace

import pytest
from generate_fakes import FakeFleet, fast_settings, write_prompts

from fleetgen.generate import run_shard_async
from fleetgen.generate import liveness
from fleetgen.generate.liveness import (FIRST_BEAT_S, HEARTBEAT_INTERVAL_S, STALE_AFTER_S, FleetShare,
                                       ShardHeartbeat, dead_seconds, fleet_share, lost_tries)
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
    summary = await run_shard_async(shard, fleet.endpoints(), layout.root, fast_settings(), options=fleet.options())
    assert summary["done"] == 20
    assert summary["lost_try"]["try"] == 1 and summary["lost_try"]["dead_s"] >= 29
    assert not layout.heartbeat_files() and not killed.path.exists()
    again = await run_shard_async(shard, fleet.endpoints(), layout.root, fast_settings(), options=fleet.options())
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


# The heartbeat, the share and the dead time on their own, with the clock passed in.

def _beat_at(heartbeat: ShardHeartbeat, epoch_s: float) -> None:
    os.utime(heartbeat.path, (epoch_s, epoch_s))


def test_three_tries_of_one_shard_leave_one_record_per_dead_try(tmp_path, caplog):
    layout = RunLayout(tmp_path)
    first = ShardHeartbeat(layout, 4, try_number=1)
    assert first.start(now=1000.0) is None
    _beat_at(first, 1010.0)
    second = ShardHeartbeat(layout, 4, try_number=2)
    with caplog.at_level(logging.WARNING):
        lost_first = second.start(now=1100.5, log=logging.getLogger("liveness"))
    _beat_at(second, 1200.0)
    lost_second = ShardHeartbeat(layout, 4, try_number=3).start(now=1230.25)
    assert lost_first == {"shard_id": 4, "host": socket.gethostname(), "pid": os.getpid(), "try": 1,
                          "started_at": "1970-01-01T00:16:40+00:00", "last_beat": "1970-01-01T00:16:50+00:00",
                          "resumed_at": "1970-01-01T00:18:20+00:00", "dead_since_s": 1010.0, "resumed_s": 1100.5,
                          "dead_s": 90.5}
    assert (lost_second["try"], lost_second["dead_s"], lost_second["started_at"]) == (
        2, 30.25, "1970-01-01T00:18:20+00:00")
    assert lost_tries(layout) == [lost_first, lost_second]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == (f"shard 4: the previous try ({socket.gethostname()} pid {os.getpid()}, try 1) stopped "
                       "heartbeating at 1970-01-01T00:16:50+00:00 and never finished; 90 s of this shard's slot "
                       "were lost before this try resumed it")


def test_a_try_number_of_zero_is_recorded_as_zero(tmp_path):
    layout = RunLayout(tmp_path)
    ShardHeartbeat(layout, 0, try_number=0).start(now=50.0)
    assert ShardHeartbeat(layout, 0, try_number=1).start(now=60.0)["try"] == 0


def test_dead_time_is_never_negative_and_kept_to_the_millisecond(tmp_path):
    layout = RunLayout(tmp_path)
    first = ShardHeartbeat(layout, 1)
    first.start(now=100.0)
    _beat_at(first, 200.0)  # a clock a little ahead on the dead try's worker
    assert ShardHeartbeat(layout, 1).start(now=150.0)["dead_s"] == 0.0
    second = ShardHeartbeat(layout, 1)
    _beat_at(second, 150.0)
    assert ShardHeartbeat(layout, 1).start(now=151.23456)["dead_s"] == 1.235


def test_a_heartbeat_without_a_start_time_counts_from_its_last_beat(tmp_path):
    layout = RunLayout(tmp_path)
    path = layout.shard(2).heartbeat
    path.parent.mkdir(parents=True)
    path.write_text('{"host": "n1", "pid": 5}')
    os.utime(path, (3600.0, 3600.0))
    lost = ShardHeartbeat(layout, 2).start(now=3700.0)
    assert lost["started_at"] == lost["last_beat"] == "1970-01-01T01:00:00+00:00" and lost["try"] is None


def test_an_unreadable_heartbeat_is_no_lost_try(tmp_path):
    layout = RunLayout(tmp_path)
    path = layout.shard(2).heartbeat
    path.parent.mkdir(parents=True)
    path.write_text('{"host": "n1", "pi')
    assert ShardHeartbeat(layout, 2).start(now=10.0) is None
    assert not layout.shard(2).lost_tries.exists() and lost_tries(layout) == []


def test_start_writes_the_owner_with_its_start_time_and_no_partial_file(tmp_path):
    layout = RunLayout(tmp_path)
    heartbeat = ShardHeartbeat(layout, 3, try_number=2)
    heartbeat.start(now=1234.5)
    written = json.loads(heartbeat.path.read_text())
    assert written == {"host": socket.gethostname(), "pid": os.getpid(), "try": 2,
                       "token": heartbeat.owner["token"], "started_at": 1234.5}
    assert [p.name for p in heartbeat.path.parent.iterdir()] == ["shard-00003.alive"]


def test_start_without_a_clock_uses_wall_clock_seconds(tmp_path):
    heartbeat = ShardHeartbeat(RunLayout(tmp_path), 3)
    before = time.time()
    heartbeat.start()
    assert before <= json.loads(heartbeat.path.read_text())["started_at"] <= time.time()


def test_each_try_has_its_own_token(tmp_path):
    layout = RunLayout(tmp_path)
    assert ShardHeartbeat(layout, 1).owner["token"] != ShardHeartbeat(layout, 1).owner["token"]


def test_a_beat_publishes_the_requests_in_flight_and_whether_the_try_drains(tmp_path):
    heartbeat = ShardHeartbeat(RunLayout(tmp_path), 3)
    heartbeat.start(now=1.0)
    heartbeat.beat({"s0:1": 3}, draining=True)
    written = json.loads(heartbeat.path.read_text())
    assert written["in_flight"] == {"s0:1": 3} and written["draining"] is True
    assert written["token"] == heartbeat.owner["token"] and written["started_at"] == 1.0
    heartbeat.beat()
    written = json.loads(heartbeat.path.read_text())
    assert written["in_flight"] == {} and written["draining"] is False
    assert [p.name for p in heartbeat.path.parent.iterdir()] == ["shard-00003.alive"]


def test_the_heartbeat_beats_first_soon_then_every_interval_with_the_shards_state(tmp_path, monkeypatch):
    heartbeat = ShardHeartbeat(RunLayout(tmp_path), 0)
    heartbeat.start()
    timeline = []
    heartbeat.beat = lambda in_flight, draining: timeline.append(("beat", in_flight, draining))

    async def sleep(seconds):
        timeline.append(("sleep", seconds))
        if len(timeline) >= 6:
            raise asyncio.CancelledError

    monkeypatch.setattr(liveness, "asyncio", SimpleNamespace(sleep=sleep))
    states = iter([({"a:1": 1}, False), ({"a:1": 0}, True), ({}, True)])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(heartbeat.run(lambda: next(states), interval_s=2.5, first_s=0.25))
    assert timeline == [("sleep", 0.25), ("beat", {"a:1": 1}, False), ("sleep", 2.5), ("beat", {"a:1": 0}, True),
                        ("sleep", 2.5), ("beat", {}, True), ("sleep", 2.5)]
    timeline.clear()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(heartbeat.run())
    assert timeline == [("sleep", FIRST_BEAT_S), ("beat", {}, False), ("sleep", HEARTBEAT_INTERVAL_S),
                        ("beat", {}, False), ("sleep", HEARTBEAT_INTERVAL_S), ("beat", {}, False),
                        ("sleep", HEARTBEAT_INTERVAL_S)]


def test_stop_leaves_a_newer_trys_heartbeat_in_place(tmp_path):
    layout = RunLayout(tmp_path)
    old, new = ShardHeartbeat(layout, 6, try_number=1), ShardHeartbeat(layout, 6, try_number=2)
    old.start(now=1.0)
    new.start(now=2.0)
    old.stop()
    assert json.loads(new.path.read_text())["try"] == 2
    new.stop()
    assert not new.path.exists()
    new.stop()  # already gone: nothing to do


def test_a_heartbeat_exactly_stale_after_s_old_still_counts_and_one_a_moment_older_does_not(tmp_path):
    layout = RunLayout(tmp_path)
    observer, other = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    observer.start(now=1000.0)
    other.start(now=1000.0)
    _beat_at(other, 1000.0)
    assert fleet_share(layout, observer, now=1015.0, stale_after_s=15.0).active == 2
    assert fleet_share(layout, observer, now=1015.5, stale_after_s=15.0).active == 1
    assert fleet_share(layout, observer, now=1000.0 + STALE_AFTER_S).active == 2
    assert fleet_share(layout, observer, now=1000.5 + STALE_AFTER_S).active == 1


def test_the_shard_itself_is_counted_once_whatever_its_heartbeat_says(tmp_path):
    layout = RunLayout(tmp_path)
    alone = ShardHeartbeat(layout, 0)
    alone.start()
    alone.beat({"a:1": 9}, draining=True)
    assert fleet_share(layout, alone) == FleetShare(active=1, others_in_flight={}, others_unpublished=0)


def test_several_other_shards_in_flight_add_up_per_server(tmp_path):
    layout = RunLayout(tmp_path)
    me, a, b, c = (ShardHeartbeat(layout, n) for n in range(4))
    for heartbeat in (me, a, b, c):
        heartbeat.start()
    a.beat({"s0:1": 3, "s1:1": 1})
    b.beat({"s0:1": 2}, draining=True)
    share = fleet_share(layout, me)
    assert share == FleetShare(active=3, others_in_flight={"s0:1": 5, "s1:1": 1}, others_unpublished=1)
    assert share.cap("s0:1", 12) == 0  # c has not published what it holds yet
    c.beat({"s1:1": "2"})  # a count written as text still counts
    share = fleet_share(layout, me)
    assert share == FleetShare(active=3, others_in_flight={"s0:1": 5, "s1:1": 3}, others_unpublished=0)
    assert (share.cap("s0:1", 12), share.cap("s1:1", 12), share.cap("s2:1", 12)) == (4, 4, 4)
    assert share.cap("s0:1", 8) == 3  # a third of 8 rounds up to 3, and 3 are left beside the others' 5


def test_an_unreadable_heartbeat_does_not_hide_the_ones_after_it(tmp_path):
    layout = RunLayout(tmp_path)
    me, later = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 2)
    me.start()
    later.start()
    layout.shard(1).heartbeat.write_text('{"host": "n1", "pi')  # being rewritten as we look
    assert fleet_share(layout, me).active == 2


def test_a_server_the_others_hold_nothing_on_leaves_the_whole_fair_part():
    share = FleetShare(active=1, others_in_flight={"a:1": 4})
    assert (share.cap("b:1", 10), share.cap("a:1", 10)) == (10, 6)


@pytest.mark.parametrize("running, active", [(None, 3), (5, 3), (3, 3), (2, 2), (1, 1), (0, 1), (-1, 1)])
def test_airflows_count_of_running_tasks_bounds_the_active_shards(tmp_path, running, active):
    layout = RunLayout(tmp_path)
    me, a, b = (ShardHeartbeat(layout, n) for n in range(3))
    for heartbeat in (me, a, b):
        heartbeat.start()
    assert fleet_share(layout, me, running_in_airflow=running).active == active


@pytest.mark.parametrize("active, others, limit, cap", [
    (1, 0, 10, 10), (2, 0, 10, 5), (3, 0, 10, 4), (3, 0, 9, 3), (4, 0, 1, 1), (2, 7, 10, 3), (2, 10, 10, 0),
    (2, 12, 10, 0), (1, 10, 10, 0)])
def test_a_shards_cap_is_its_fair_part_rounded_up_within_the_room_left(active, others, limit, cap):
    assert FleetShare(active=active, others_in_flight={"s:1": others}).cap("s:1", limit) == cap


def test_lost_tries_skip_blank_lines_and_read_every_shards_file(tmp_path):
    layout = RunLayout(tmp_path)
    for shard_id, text in [(0, '{"a": 1}\n\n{"a": 2}\n'), (3, '  \n{"a": 3}')]:
        path = layout.shard(shard_id).lost_tries
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert lost_tries(layout) == [{"a": 1}, {"a": 2}, {"a": 3}]


def span(since, resumed):
    return {"dead_since_s": since, "resumed_s": resumed}


@pytest.mark.parametrize("lost, start, end, dead", [
    ([span(10.0, 30.0)], None, 100.0, 0.0), ([span(10.0, 30.0)], 0.0, None, 0.0),
    ([span(0.0, 50.0)], 20.0, 40.0, 20.0),  # clipped to the span at both ends
    ([span(40.0, 60.0), span(10.0, 30.0)], 0.0, 100.0, 40.0),  # any order
    ([span(10.0, 50.0), span(20.0, 30.0)], 0.0, 100.0, 40.0),  # one inside another counts once
    ([span(10.0, 20.0), span(20.0, 30.0)], 0.0, 100.0, 20.0),  # back to back
    ([span(150.0, 200.0), span(-50.0, -10.0)], 0.0, 100.0, 0.0),  # outside the span
    ([span(0.0, 0.0)], 0.0, 100.0, 0.0), ([], 0.0, 100.0, 0.0)])
def test_dead_seconds_count_each_second_of_the_span_once(lost, start, end, dead):
    assert dead_seconds(lost, start, end) == pytest.approx(dead)


def test_a_shard_running_alone_may_use_every_servers_whole_limit():
    share = liveness.alone()
    assert share == FleetShare(active=1, others_in_flight={}, others_unpublished=0)
    assert share.cap("a:1", 40) == 40 and share.cap("b:1", 7) == 7


# --- clocks that disagree: a heartbeat is judged by its beats on the reader's own clock -----------------------

def _beat_behind(heartbeat: ShardHeartbeat, in_flight: dict[str, int], skew_s: float) -> None:
    """A beat from a worker whose clock (which stamps the file) is ``skew_s`` behind the reader's."""
    heartbeat.beat(in_flight)
    stamp = time.time() - skew_s
    os.utime(heartbeat.path, (stamp, stamp))


def test_a_worker_whose_clock_is_16_s_behind_keeps_its_room_and_the_skew_is_named(tmp_path, caplog):
    layout = RunLayout(tmp_path)
    reader, skewed = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1, try_number=1)
    reader.start()
    skewed.start()
    log = logging.getLogger("liveness")
    _beat_behind(skewed, {"s0:1": 40}, skew_s=16.0)
    # the limit is 64 and the skewed shard holds 40: 24 are left, not 32 (its file looks 16 s old)
    assert fleet_share(layout, reader, seen_at=100.0, log=log).cap("s0:1", 64) == 24
    _beat_behind(skewed, {"s0:1": 40}, skew_s=16.0)
    with caplog.at_level(logging.WARNING):
        share = fleet_share(layout, reader, seen_at=102.0, log=log)
    assert share.active == 2 and share.cap("s0:1", 64) == 24
    [warning] = [r.getMessage() for r in caplog.records if "off the clock" in r.getMessage()]
    assert "shards/shard-00001.alive" in warning and f"pid {os.getpid()}, try 1" in warning
    assert "time is -16 s off" in warning and f"(host {socket.gethostname()}, pid {os.getpid()})" in warning
    caplog.clear()
    _beat_behind(skewed, {"s0:1": 40}, skew_s=16.0)
    with caplog.at_level(logging.WARNING):
        fleet_share(layout, reader, seen_at=104.0, log=log)
    assert not caplog.records  # said once per try, not at every recount
    # when it stops beating it stops counting after stale_after_s of the reader's own clock
    assert fleet_share(layout, reader, seen_at=104.0 + STALE_AFTER_S).active == 2
    assert fleet_share(layout, reader, seen_at=104.5 + STALE_AFTER_S).active == 1


def test_a_worker_whose_clock_is_ahead_stops_counting_when_its_beats_stop(tmp_path):
    layout = RunLayout(tmp_path)
    reader, ahead = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    reader.start()
    ahead.start()
    _beat_behind(ahead, {"s0:1": 10}, skew_s=-60.0)
    fleet_share(layout, reader, seen_at=10.0)
    _beat_behind(ahead, {"s0:1": 10}, skew_s=-60.0)
    assert fleet_share(layout, reader, seen_at=11.0).active == 2
    # its file's time stays "in the future" for a minute; its beats say it died
    assert fleet_share(layout, reader, seen_at=11.5 + STALE_AFTER_S).active == 1


def test_a_heartbeat_first_seen_long_stale_counts_only_for_the_first_sight_grace(tmp_path):
    layout = RunLayout(tmp_path)
    reader, dead = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    reader.start()
    dead.start()
    dead.beat({"s0:1": 8})
    _die(dead, seconds_ago=STALE_AFTER_S + 60)
    assert fleet_share(layout, reader, seen_at=50.0).others_in_flight == {"s0:1": 8}
    assert fleet_share(layout, reader, seen_at=50.0 + liveness.FIRST_SIGHT_GRACE_S).active == 2
    assert fleet_share(layout, reader, seen_at=50.5 + liveness.FIRST_SIGHT_GRACE_S).active == 1


def test_a_dead_try_stamped_ahead_by_its_clock_stays_dead_when_its_time_comes_into_range(tmp_path):
    """Its clock 20 s ahead: once dead, its file's time drifts from 20 s ahead to 15 s behind the reader's clock
    (in range by time for 30 s). Its beat number stopped, so it stays dead all along."""
    layout = RunLayout(tmp_path)
    reader, ahead = ShardHeartbeat(layout, 0), ShardHeartbeat(layout, 1)
    reader.start(now=1000.0)
    ahead.start(now=1000.0)
    skew_s, wall_at_zero = 20.0, 1000.0  # the reader's wall clock at its monotonic time 0

    def share_at(seen_at: float) -> FleetShare:
        return fleet_share(layout, reader, now=wall_at_zero + seen_at, seen_at=seen_at)

    for seen_at in (0.0, HEARTBEAT_INTERVAL_S):  # two beats, then it dies
        ahead.beat({"s0:1": 10})
        _beat_at(ahead, wall_at_zero + seen_at + skew_s)
        assert share_at(seen_at).others_in_flight == {"s0:1": 10}
    last_beat_seen = HEARTBEAT_INTERVAL_S
    assert share_at(last_beat_seen + STALE_AFTER_S).active == 2
    for silent_s in (STALE_AFTER_S + 0.5, skew_s, skew_s + 10.0, skew_s + STALE_AFTER_S, skew_s + STALE_AFTER_S + 5):
        share = share_at(last_beat_seen + silent_s)
        assert (share.active, share.others_in_flight) == (1, {}), f"{silent_s} s after its last beat: {share}"


def test_the_watch_judges_each_try_by_its_own_beats():
    """Two tries of one shard (the same file name), told apart by their tokens: one beating, one silent."""
    watch = liveness.HeartbeatWatch(0, host="n0", pid=1)

    def live(token: str, number: int, seen_at: float) -> bool:
        return watch.is_live("shard-00001.alive", {"token": token, "beat": number}, 1000.0 + seen_at,
                             now=1000.0 + seen_at, seen_at=seen_at, stale_after_s=STALE_AFTER_S)

    assert live("beating", 1, 0.0) and live("silent", 1, 0.0)
    assert live("beating", 2, 10.0)
    assert live("beating", 3, 15.5) and not live("silent", 1, 15.5)
