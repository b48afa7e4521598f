"""One server as a shard sees it: up/down as a state machine with its history, the load it carries, its tally."""

import asyncio

import pytest

from fleetgen.generate.server_state import ServerHealth, ServerLoad, ServerState
from fleetgen.generate.settings import ServerEndpoint

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(5)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_a_new_server_is_up_with_no_history():
    health = ServerHealth()
    assert health.up.is_set() and not health.is_down and health.down is None
    assert (health.downs, health.marked_down, health.recovered, health.shared_at) == (0, [], [], 0.0)


def test_down_then_up_records_both_transitions_and_the_time_down():
    health = ServerHealth()
    health.mark_down("timeout: ReadTimeout", now=100.0, at="2026-12-03T01:00:00Z")
    assert health.is_down and not health.up.is_set()
    assert (health.down.since, health.down.reason) == (100.0, "timeout: ReadTimeout")
    assert health.marked_down == [{"at": "2026-12-03T01:00:00Z", "reason": "timeout: ReadTimeout"}]
    assert health.mark_up(now=112.34, at="2026-12-03T01:00:12Z") == pytest.approx(12.34)
    assert not health.is_down and health.up.is_set() and health.down is None
    assert health.recovered == [{"at": "2026-12-03T01:00:12Z", "down_s": 12.3}]


def test_each_down_period_counts_and_the_current_one_is_the_last():
    health = ServerHealth()
    for number, now in enumerate((1.0, 5.0, 9.0), start=1):
        health.mark_down(f"down {number}", now=now, at=f"t{number}")
        assert health.downs == number
        if number < 3:
            health.mark_up(now=now + 1, at="back")
    assert health.down.reason == "down 3" and health.down.since == 9.0
    assert [entry["reason"] for entry in health.marked_down] == ["down 1", "down 2", "down 3"]


def test_a_transition_from_the_wrong_state_is_refused_and_changes_nothing():
    health = ServerHealth()
    with pytest.raises(RuntimeError, match="^marked up while up$"):
        health.mark_up(now=1.0, at="t")
    health.mark_down("first", now=1.0, at="t1")
    with pytest.raises(RuntimeError, match=r"already down \(first\): second"):
        health.mark_down("second", now=2.0, at="t2")
    assert (health.down.reason, health.down.since, health.downs) == ("first", 1.0, 1)


async def test_the_first_request_in_flight_starts_the_silence_clock_and_later_ones_do_not():
    load = ServerLoad(cap=4)
    first, second = object(), object()
    load.begin(first, now=10.0)
    load.begin(second, now=15.0)
    assert (load.in_flight, load.last_answer, load.requesting) == (2, 10.0, {first, second})
    load.end(first)
    assert (load.in_flight, load.requesting) == (1, {second})
    load.end(second)
    load.begin(first, now=20.0)
    assert load.last_answer == 20.0


async def test_a_new_cap_wakes_the_workers_waiting_for_a_share_and_the_same_cap_does_not():
    load = ServerLoad(cap=4)
    waiting = load.cap_changed
    load.resize(4)
    assert not waiting.is_set() and load.cap_changed is waiting
    load.resize(2)
    assert waiting.is_set() and load.cap == 2
    assert not load.cap_changed.is_set()  # a fresh event for the next change


async def test_abandoning_a_hung_server_cancels_every_request_waiting_on_it_with_the_message():
    load = ServerLoad(cap=2)
    stuck = [asyncio.create_task(asyncio.sleep(60)) for _ in range(2)]
    for task in stuck:
        load.begin(task, now=0.0)
    await asyncio.sleep(0)
    load.abandon("server stalled")
    for task in stuck:
        with pytest.raises(asyncio.CancelledError) as cancelled:
            await task
        assert cancelled.value.args == ("server stalled",)


def test_a_server_state_starts_at_its_limit_with_parsed_urls_and_summarizes_its_tally_and_history():
    server = ServerState(ServerEndpoint(name="n0:30000", url="http://n0:30000/", max_in_flight=12))
    assert (server.name, server.load.cap) == ("n0:30000", 12)
    assert (str(server.chat_url), str(server.health_url)) == ("http://n0:30000/v1/chat/completions",
                                                              "http://n0:30000/health")
    server.tally.completed, server.tally.failed, server.tally.retried = 5, 1, 2
    server.health.mark_down("http_503: busy", now=0.0, at="t0")
    server.health.mark_up(now=3.0, at="t3")
    assert server.summary() == {"completed": 5, "failed": 1, "retried": 2,
                                "marked_down": [{"at": "t0", "reason": "http_503: busy"}],
                                "recovered": [{"at": "t3", "down_s": 3.0}]}
    server.summary()["marked_down"].clear()
    assert server.health.marked_down  # the summary is a copy
