"""One shard's run as its task sees it: what it refuses before sending, what it counts from earlier tries,
what it leaves behind (heartbeat, lease, health file, events), and the summary it returns."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import time

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output, validated, write_prompts

from fleetgen.errors import AllServersDown, ConfigError, GenerationError, ShardLeaseBusy
from fleetgen.generate import ShardRunOptions, run_shard, run_shard_async, shard as shard_module
from fleetgen.generate.health import SharedHealth
from fleetgen.generate.liveness import ShardHeartbeat
from fleetgen.generate.watch import EventJournal
from fleetgen.outputs import RunLayout

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


def _error(status: int, message: str = "no") -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message}})


# --- what is refused before anything is sent ----------------------------------------------------------------

@pytest.mark.parametrize("missing", [("start",), ("end", "blocks"), ("shard_id", "input_path", "count")])
async def test_a_shard_record_lacking_keys_names_each_in_order(tmp_path, missing):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    incomplete = {key: value for key, value in shard.items() if key not in missing}
    fleet = FakeFleet(1)
    with pytest.raises(ConfigError) as caught:
        await run_shard_async(incomplete, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert caught.value.message == f"shard record lacks {', '.join(missing)}: {incomplete!r}"
    assert caught.value.hint == "pass one element of plan_shards()'s list"
    assert not (tmp_path / "out").exists() and sum(fleet.requests.values()) == 0


@pytest.mark.parametrize("shard_id", [0, 4])
async def test_a_prompts_file_missing_on_this_worker_names_the_file_and_the_shard_even_the_first(tmp_path, shard_id):
    shard = {**write_prompts(tmp_path / "p.jsonl", 3), "shard_id": shard_id}
    (tmp_path / "p.jsonl").unlink()
    with pytest.raises(ConfigError) as caught:
        await run_shard_async(shard, FakeFleet(1).endpoints(), tmp_path / "out", fast_settings())
    assert caught.value.message == "the shard's prompts file does not exist on this worker"
    assert caught.value.shard == shard_id and caught.value.path == str(tmp_path / "p.jsonl")
    assert caught.value.hint == "put the prompts on storage every worker can read"


async def test_a_folder_in_place_of_the_prompts_file_is_refused(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    (tmp_path / "p.jsonl").unlink()
    (tmp_path / "p.jsonl").mkdir()
    with pytest.raises(ConfigError, match="prompts file does not exist"):
        await run_shard_async(shard, FakeFleet(1).endpoints(), tmp_path / "out", fast_settings())


@pytest.mark.parametrize("shard_id", [0, 2])
async def test_no_servers_is_refused_naming_the_shard(tmp_path, shard_id):
    shard = {**write_prompts(tmp_path / "p.jsonl", 3), "shard_id": shard_id}
    with pytest.raises(ConfigError) as caught:
        await run_shard_async(shard, [], tmp_path / "out", fast_settings())
    assert caught.value.message == "no servers to generate with" and caught.value.shard == shard_id
    assert caught.value.hint == "check that wait_ready returned at least one server"


async def test_two_servers_with_one_name_are_refused(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(2)
    first, second = fleet.endpoints()
    twin = type(second)(name=first.name, url=second.url, max_in_flight=2)
    with pytest.raises(ConfigError) as caught:
        await run_shard_async(shard, [first, twin], tmp_path / "out", fast_settings(), options=fleet.options())
    assert caught.value.message == "server names repeat: ['s0:1', 's0:1']"
    assert caught.value.hint == 'name each server "host:port"'
    # two servers sharing a port number on different hosts are two servers
    other_host = type(second)(name="t0:1", url="http://t0:1", max_in_flight=2)
    fleet.names.append("t0:1")
    fleet.delay_s["t0:1"] = fleet.delay_s["s0:1"]
    summary = await run_shard_async(shard, [first, other_host], tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 3 and set(summary["servers"]) == {"s0:1", "t0:1"}


@pytest.mark.parametrize("interval", [0, -1.0])
def test_a_progress_interval_that_is_not_positive_is_refused(interval):
    with pytest.raises(ConfigError) as caught:
        ShardRunOptions(progress_interval_s=interval)
    assert caught.value.message == f"progress_interval_s must be > 0, got {interval}"


def test_the_options_never_show_the_api_key():
    options = ShardRunOptions(api_key="k-secret-7", try_number=2)
    assert "k-secret-7" not in repr(options) and "try_number=2" in repr(options)
    assert options.api_key == "k-secret-7"


async def test_a_tiny_progress_interval_is_taken(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(1)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(progress_interval_s=0.001))
    assert summary["done"] == 3


# --- the summary -------------------------------------------------------------------------------------------

async def test_the_summary_of_the_first_shard_counts_every_server_and_token(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    assert shard["shard_id"] == 0
    fleet = FakeFleet(3)
    started = time.monotonic()
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    wall_s = time.monotonic() - started
    assert set(summary) == {"shard_id", "lost_try", "done", "failed", "skipped_already_done", "reused", "left",
                            "prompt_tokens", "completion_tokens", "seconds", "servers"}
    assert summary["shard_id"] == 0 and type(summary["shard_id"]) is int
    assert (summary["lost_try"], summary["done"], summary["failed"]) == (None, 12, 0)
    assert (summary["skipped_already_done"], summary["reused"], summary["left"]) == (0, 0, 0)
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (12 * 7, 12 * 10)
    assert set(summary["servers"]) == set(fleet.names)
    assert sum(server["completed"] for server in summary["servers"].values()) == 12
    assert 0 < summary["seconds"] <= wall_s + 0.001 and summary["seconds"] == round(summary["seconds"], 3)
    json.dumps(summary)


async def test_a_shard_id_given_as_text_is_reported_as_a_number(tmp_path):
    shard = {**write_prompts(tmp_path / "p.jsonl", 2), "shard_id": "7"}
    fleet = FakeFleet(1)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["shard_id"] == 7
    assert len(shard_output(tmp_path / "out", 7)["completions"]) == 2


async def test_failed_prompts_are_counted_apart_from_done_ones(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1)
    fleet.behaviour["s0:1"] = lambda prompt_id, n: _error(400, "bad prompt") if prompt_id == "p0002" else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert (summary["done"], summary["failed"]) == (5, 1)
    assert summary["servers"]["s0:1"]["completed"] == 5 and summary["servers"]["s0:1"]["failed"] == 1


async def test_a_rerun_counts_the_completed_and_the_failed_prompts_of_earlier_tries(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    first = FakeFleet(1)
    first.behaviour["s0:1"] = lambda prompt_id, n: _error(400) if prompt_id in ("p0001", "p0004") else None
    await run_shard_async(shard, first.endpoints(), tmp_path / "out", fast_settings(), options=first.options())
    again = FakeFleet(2)
    with caplog.at_level(logging.INFO, logger="fleetgen.generate"):
        summary = await run_shard_async(shard, again.endpoints(), tmp_path / "out", fast_settings(),
                                        options=again.options())
    assert summary["skipped_already_done"] == 6 and (summary["done"], summary["failed"]) == (0, 0)
    assert sum(again.requests.values()) == 0
    messages = [record.getMessage() for record in caplog.records]
    assert ("shard 0: 6 prompts, 6 already done (4 completed, 2 failed earlier); servers and in-flight limits: "
            "s0:1=4, s1:1=4; request timeout 73 s") in messages
    assert any(message.startswith("shard 0 finished: 0 done, 0 failed, 6 from earlier tries, 0 completion tokens "
                                  "in ") and message.endswith(" s") for message in messages)
    assert any(message.startswith("shard 0: ") and "6/6 done" in message for message in messages)


async def test_the_shard_logs_to_the_logger_it_is_given(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 2)
    fleet = FakeFleet(1)
    own = logging.getLogger("tests.own_shard_log")
    with caplog.at_level(logging.INFO):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                              options=fleet.options(log=own))
    names = {record.name for record in caplog.records if "shard 0" in record.getMessage()}
    assert names == {"tests.own_shard_log"}
    assert any(record.getMessage().startswith("shard 0 finished: 2 done, 0 failed, 0 from earlier tries, 20 "
                                              "completion tokens in ") for record in caplog.records)


async def test_without_a_logger_the_shard_logs_to_fleetgen_generate(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 2)
    fleet = FakeFleet(1)
    with caplog.at_level(logging.INFO):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert any(record.name == "fleetgen.generate" and record.getMessage().startswith("shard 0 finished")
               for record in caplog.records)


# --- request headers and the transport ------------------------------------------------------------------------

async def test_an_api_key_is_sent_as_a_bearer_header_and_none_or_empty_sends_no_authorization(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 2)
    for key, expected in (("k-1", "Bearer k-1"), (None, None), ("", None)):
        fleet = FakeFleet(1)
        await run_shard_async(shard, fleet.endpoints(), tmp_path / f"out-{key}", fast_settings(),
                              options=fleet.options(api_key=key))
        assert fleet.requests["s0:1"] == 2
        assert {h.get("authorization") for h in fleet.headers} == {expected}
        assert {h.get("content-type") for h in fleet.headers if h.get("content-length")} == {"application/json"}


class _RecordingTransport(httpx.AsyncBaseTransport):
    """The fake fleet's transport, counting how often the shard closes it."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.closed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_transport_the_caller_gives_is_left_open_and_the_shards_own_is_closed(tmp_path, monkeypatch):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(1)
    given = _RecordingTransport(fleet.transport())
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "a", fast_settings(),
                          options=ShardRunOptions(transport=given))
    assert given.closed == 0 and fleet.requests["s0:1"] == 3
    own: list[_RecordingTransport] = []

    def pooled() -> _RecordingTransport:
        own.append(_RecordingTransport(fleet.transport()))
        return own[-1]

    monkeypatch.setattr(shard_module, "PooledTransport", pooled)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "b", fast_settings())
    assert len(own) == 1 and own[0].closed == 1 and fleet.requests["s0:1"] == 6


async def test_httpx_request_logging_is_quieted_to_warnings_and_a_quieter_level_is_kept(tmp_path):
    httpx_log = logging.getLogger("httpx")
    before = httpx_log.level
    shard = write_prompts(tmp_path / "p.jsonl", 1)
    try:
        for level, after in ((logging.DEBUG, logging.WARNING), (logging.INFO, logging.WARNING),
                             (logging.WARNING, logging.WARNING), (logging.ERROR, logging.ERROR)):
            httpx_log.setLevel(level)
            fleet = FakeFleet(1)
            await run_shard_async(shard, fleet.endpoints(), tmp_path / f"out-{level}", fast_settings(),
                                  options=fleet.options())
            assert httpx_log.level == after
    finally:
        httpx_log.setLevel(before)


# --- shared server health, events, metrics -------------------------------------------------------------------

def _record_health_owners(monkeypatch) -> list[str]:
    owners: list[str] = []

    def shared_health(run_dir, *, who, log):
        owners.append(who)
        return SharedHealth(run_dir, who=who, log=log)

    monkeypatch.setattr(shard_module, "SharedHealth", shared_health)
    return owners


@pytest.mark.parametrize("try_number, who", [(None, "shard 3"), (0, "shard 3 (try 0)"), (2, "shard 3 (try 2)")])
async def test_a_server_found_down_is_shared_under_this_shards_and_tries_name(tmp_path, monkeypatch, try_number, who):
    owners = _record_health_owners(monkeypatch)
    shard = {**write_prompts(tmp_path / "p.jsonl", 20), "shard_id": 3}
    fleet = FakeFleet(2)
    fleet.behaviour["s1:1"] = lambda prompt_id, n: _error(500, "engine died")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(try_number=try_number))
    assert owners == [who] and summary["done"] == 20
    health = json.loads(RunLayout(tmp_path / "out").servers_health.read_text())
    assert health["servers"]["s1:1"]["state"] == "down" and health["servers"]["s1:1"]["by"] == who


async def test_without_shared_health_no_health_file_is_kept(tmp_path, monkeypatch):
    owners = _record_health_owners(monkeypatch)
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(2)
    fleet.behaviour["s1:1"] = lambda prompt_id, n: _error(500, "engine died")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(share_server_health=False), options=fleet.options())
    assert summary["done"] == 20 and owners == []
    assert not RunLayout(tmp_path / "out").servers_health.exists()


async def test_server_events_go_to_this_shards_journal_which_is_closed_at_the_end(tmp_path, monkeypatch):
    journals: list[EventJournal] = []

    class Journal(EventJournal):
        def __init__(self, path, shard_id):
            super().__init__(path, shard_id)
            self.closed = False
            journals.append(self)

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(shard_module, "EventJournal", Journal)
    shard = {**write_prompts(tmp_path / "p.jsonl", 20), "shard_id": 5}
    fleet = FakeFleet(2)
    fleet.behaviour["s1:1"] = lambda prompt_id, n: _error(500, "engine died")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert len(journals) == 1 and journals[0].closed and journals[0].shard_id == 5
    layout = RunLayout(tmp_path / "out")
    events = [json.loads(line) for line in layout.shard_file("events", 5).read_text().splitlines()]
    assert {"down"} <= {event["event"] for event in events} and {event["shard"] for event in events} == {5}


async def test_metrics_samples_go_to_this_shards_metrics_file(tmp_path):
    shard = {**write_prompts(tmp_path / "p.jsonl", 30), "shard_id": 2}
    fleet = FakeFleet(2, delay_s=0.01)
    await run_shard_async(shard, fleet.endpoints(limit=1), tmp_path / "out", fast_settings(sample_interval_s=0.01),
                          options=fleet.options())
    path = RunLayout(tmp_path / "out").shard_file("metrics", 2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows and {row["server"] for row in rows} <= set(fleet.names) and sum(fleet.scrapes.values()) > 0


# --- heartbeat, lease and the sharing of the fleet -------------------------------------------------------------

def _lock_is_free(out_dir, shard_id: int) -> bool:
    fd = os.open(RunLayout(out_dir).shard(shard_id).lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


async def test_a_finished_shard_leaves_no_heartbeat_and_frees_its_output(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(1)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert not RunLayout(tmp_path / "out").shard(0).heartbeat.exists()
    assert _lock_is_free(tmp_path / "out", 0)


async def test_a_shard_stopped_by_every_server_down_still_removes_its_heartbeat_and_frees_its_output(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(2)
    for name in fleet.names:
        fleet.behaviour[name] = lambda prompt_id, n: _error(500, "engine died")
        fleet.health[name] = lambda name: httpx.Response(503)
    with pytest.raises(AllServersDown):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(all_down_timeout_s=0.1),
                              options=fleet.options())
    assert not RunLayout(tmp_path / "out").shard(0).heartbeat.exists()
    assert _lock_is_free(tmp_path / "out", 0)


async def test_a_try_that_died_is_reported_as_the_lost_try(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    dead = ShardHeartbeat(RunLayout(tmp_path / "out"), 0, try_number=1)
    dead.start()  # and never stopped: its process died
    fleet = FakeFleet(1)
    with caplog.at_level(logging.WARNING, logger="fleetgen.generate"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options(try_number=2))
    assert summary["lost_try"]["try"] == 1 and summary["lost_try"]["shard_id"] == 0
    assert "the previous try" in caplog.text and "try 1" in caplog.text
    assert summary["done"] == 3


class _QuickHeartbeat(ShardHeartbeat):
    """A heartbeat that beats at once and every 10 ms, so a short test sees what it publishes."""

    async def run(self, state=None, interval_s=0.0, first_s=0.0):
        await super().run(state, interval_s=0.01, first_s=0.0)


async def test_the_heartbeat_publishes_the_requests_in_flight_while_it_runs_and_stops_beating_at_the_end(
        tmp_path, monkeypatch):
    monkeypatch.setattr(shard_module, "ShardHeartbeat", _QuickHeartbeat)
    heartbeat_path = RunLayout(tmp_path / "out").shard(0).heartbeat
    seen: list[dict] = []

    async def slow_then_read(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        if heartbeat_path.exists():
            seen.append(json.loads(heartbeat_path.read_text()))
        return await fleet.handle(request)

    fleet = FakeFleet(1, limit=2)
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                          options=ShardRunOptions(transport=httpx.MockTransport(slow_then_read), try_number=4))
    assert any(beat.get("in_flight", {}).get("s0:1", 0) >= 1 for beat in seen), seen
    assert {beat["try"] for beat in seen} == {4}
    assert not heartbeat_path.exists()
    await asyncio.sleep(0.05)  # a beating task left running would write it again within 10 ms
    assert not heartbeat_path.exists()


async def _other_shard_taking_prompts(out_dir) -> ShardHeartbeat:
    other = ShardHeartbeat(RunLayout(out_dir), 1)
    other.start()
    other.beat({}, draining=False)
    return other


async def test_without_a_sharing_count_the_shard_takes_each_servers_whole_limit(tmp_path, caplog):
    await _other_shard_taking_prompts(tmp_path / "out")
    fleet = FakeFleet(2, limit=6)
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    with caplog.at_level(logging.WARNING):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert all(fleet.max_in_flight[name] == 6 for name in fleet.names), fleet.max_in_flight
    assert "could not count" not in caplog.text


async def test_the_shards_heartbeats_decide_the_share_and_airflows_count_bounds_it(tmp_path):
    await _other_shard_taking_prompts(tmp_path / "out")
    fleet = FakeFleet(2, limit=6)
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                          options=fleet.options(sharing=lambda: 2))
    assert all(fleet.max_in_flight[name] == 3 for name in fleet.names), fleet.max_in_flight
    # Airflow counts this shard alone: the other heartbeat is of a try it no longer runs
    fleet = FakeFleet(2, limit=6)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out2", fast_settings(),
                          options=fleet.options(sharing=lambda: 1))
    assert all(fleet.max_in_flight[name] == 6 for name in fleet.names), fleet.max_in_flight


async def test_the_share_is_recounted_at_the_interval_given(tmp_path):
    await _other_shard_taking_prompts(tmp_path / "out")
    fleet = FakeFleet(2, limit=8, delay_s=0.02)
    counts = iter([2] * 2 + [1] * 10_000)
    shard = write_prompts(tmp_path / "p.jsonl", 200)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                          options=fleet.options(sharing=lambda: next(counts), sharing_interval_s=0.02,
                                                progress_interval_s=0.01))
    assert next(counts) == 1  # it was counted twice as shared, then alone
    assert all(fleet.max_in_flight[name] == 8 for name in fleet.names), fleet.max_in_flight


# --- the synchronous entry point ------------------------------------------------------------------------------

def test_run_shard_runs_the_shard_on_uvloop_and_returns_its_summary(tmp_path):
    import uvloop

    fleet = FakeFleet(2)
    loops: list[type] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        loops.append(type(asyncio.get_running_loop()))
        return await fleet.handle(request)

    shard = write_prompts(tmp_path / "p.jsonl", 4)
    summary = run_shard(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                        options=ShardRunOptions(api_key="k-2", transport=httpx.MockTransport(handle), try_number=3,
                                                progress_interval_s=0.5))
    assert summary["done"] == 4 and summary["shard_id"] == 0
    assert set(loops) == {uvloop.Loop}
    assert {h.get("authorization") for h in fleet.headers} == {"Bearer k-2"}
    assert json.loads(RunLayout(tmp_path / "out").shard(0).lease.read_text())["try"] == 3


# --- reuse from an earlier night ------------------------------------------------------------------------------

async def test_completions_reused_from_an_earlier_run_count_as_done_before_and_are_logged(tmp_path, caplog):
    from fleetgen.generate.reuse import look_up_reuse, write_reuse_index

    material = {"model": {"path": "/m", "weights": "w", "sglang": "0.5.23"}, "sampling": {"max_tokens": 64},
                "extra_body": {}}
    launches = {"s0:1": {"model_path": "/m", "weight_version": None, "version": "0.5.23"}}  # what wait_ready read
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(1)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "night1", fast_settings(), options=fleet.options())
    write_reuse_index(RunLayout(tmp_path / "night1"), material=material, run_id="night1", launches=launches)
    validated(RunLayout(tmp_path / "night1"))  # only a validated run is a source
    bigger = write_prompts(tmp_path / "p2.jsonl", 7)
    source = look_up_reuse(tmp_path, "night2", material).source
    fleet = FakeFleet(1)
    with caplog.at_level(logging.INFO, logger="fleetgen.generate"):
        summary = await run_shard_async(bigger, fleet.endpoints(), tmp_path / "night2", fast_settings(),
                                        options=fleet.options(reuse=source))
    assert (summary["reused"], summary["done"], summary["skipped_already_done"]) == (5, 2, 5)
    assert fleet.requests["s0:1"] == 2
    messages = [record.getMessage() for record in caplog.records]
    assert "shard 0: 5 completion(s) reused from run night1 (prompt, model and sampling unchanged)" in messages
    assert "shard 0: 7 prompts, 5 already done (0 completed, 0 failed earlier)" in caplog.text


# --- what the shard hands on to its parts ---------------------------------------------------------------------

async def test_a_fresh_shard_whose_first_results_are_all_client_errors_stops(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 8)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda prompt_id, n: _error(400, "unknown model")
    with pytest.raises(GenerationError, match="the first 2 results were all client errors"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                              options=fleet.options())


async def test_a_resumed_shard_with_completions_from_an_earlier_try_is_not_stopped_by_client_errors(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 8)
    first = FakeFleet(1, limit=1)
    first.behaviour["s0:1"] = lambda prompt_id, n: _error(400, "too long") if n > 2 else None
    await run_shard_async(shard, first.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=100),
                          options=first.options())
    errors = RunLayout(tmp_path / "out").shard_file("errors", 0)
    errors.write_bytes(b"")  # the failed prompts are offered again
    again = FakeFleet(1, limit=1)
    again.behaviour["s0:1"] = lambda prompt_id, n: _error(400, "too long")
    summary = await run_shard_async(shard, again.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                                    options=again.options())
    assert summary["skipped_already_done"] == 2 and summary["failed"] == 6


async def test_a_live_try_holding_the_output_makes_a_new_try_give_up_after_its_lease_wait(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 2)
    lock = RunLayout(tmp_path / "out").shard(0).lock
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # an older try, alive, writing the output
    try:
        with pytest.raises(ShardLeaseBusy):
            await run_shard_async(shard, FakeFleet(1).endpoints(), tmp_path / "out", fast_settings(lease_wait_s=0.05),
                                  options=ShardRunOptions(try_number=2))
    finally:
        os.close(fd)


async def test_a_repair_of_an_interrupted_try_is_logged_to_the_shards_logger(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(1)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    completions = RunLayout(tmp_path / "out").shard_file("completions", 0)
    completions.write_bytes(completions.read_bytes() + b'{"id": "p00')  # a try killed mid-write
    own = logging.getLogger("tests.own_shard_log")
    with caplog.at_level(logging.WARNING, logger="tests.own_shard_log"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                              options=fleet.options(log=own))
    assert any(record.name == "tests.own_shard_log" and "repaired output after an interrupted run"
               in record.getMessage() for record in caplog.records)


async def test_an_unreadable_shared_health_file_is_logged_to_the_shards_logger(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    health = RunLayout(tmp_path / "out").servers_health
    health.parent.mkdir(parents=True, exist_ok=True)
    health.write_text("{torn")
    fleet = FakeFleet(2)
    fleet.behaviour["s1:1"] = lambda prompt_id, n: _error(500, "engine died")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    own = logging.getLogger("tests.own_shard_log")
    with caplog.at_level(logging.WARNING, logger="tests.own_shard_log"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options(log=own))
    assert summary["done"] == 20
    assert any(record.name == "tests.own_shard_log" and "ignoring an unreadable" in record.getMessage()
               for record in caplog.records)


async def test_a_failure_before_dispatch_still_removes_the_heartbeat_and_frees_the_output(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)

    class BrokenSource:
        run_folder = "night0"
        log = None
        regenerated: dict = {}

        def find(self, digests):
            raise RuntimeError("index unreadable")

        def close(self):
            pass

    with pytest.raises(RuntimeError, match="index unreadable"):
        await run_shard_async(shard, FakeFleet(1).endpoints(), tmp_path / "out", fast_settings(),
                              options=ShardRunOptions(reuse=BrokenSource()))
    assert not RunLayout(tmp_path / "out").shard(0).heartbeat.exists()
    assert _lock_is_free(tmp_path / "out", 0)


def test_run_shard_hands_on_its_logger_progress_interval_sharing_and_reuse_source(tmp_path, caplog):
    from fleetgen.generate.reuse import look_up_reuse, write_reuse_index

    material = {"model": {"path": "/m", "weights": "w", "sglang": "0.5.23"}, "sampling": {"max_tokens": 64},
                "extra_body": {}}
    launches = {"s0:1": {"model_path": "/m", "weight_version": None, "version": "0.5.23"}}  # what wait_ready read
    fleet = FakeFleet(2, limit=4, delay_s=0.01)
    run_shard(write_prompts(tmp_path / "p.jsonl", 4), fleet.endpoints(), tmp_path / "night1", fast_settings(),
              options=fleet.options())
    write_reuse_index(RunLayout(tmp_path / "night1"), material=material, run_id="night1", launches=launches)
    validated(RunLayout(tmp_path / "night1"))  # only a validated run is a source
    other = ShardHeartbeat(RunLayout(tmp_path / "night2"), 1)
    other.start()
    other.beat({}, draining=False)
    fleet = FakeFleet(2, limit=4, delay_s=0.01)
    own = logging.getLogger("tests.own_shard_log")
    with caplog.at_level(logging.INFO, logger="tests.own_shard_log"):
        summary = run_shard(write_prompts(tmp_path / "p2.jsonl", 60), fleet.endpoints(), tmp_path / "night2",
                            fast_settings(), options=fleet.options(
                                log=own, progress_interval_s=0.01, sharing=lambda: 2,
                                reuse=look_up_reuse(tmp_path, "night2", material).source))
    assert summary["reused"] == 4 and summary["done"] == 56
    assert all(fleet.max_in_flight[name] == 2 for name in fleet.names), fleet.max_in_flight
    progress_lines = [record.getMessage() for record in caplog.records
                      if record.name == "tests.own_shard_log" and "/60 done" in record.getMessage()]
    assert len(progress_lines) >= 2  # a line every 10 ms, not only the last one


async def test_a_shard_none_of_whose_prompts_completed_fails_saying_what_to_clear(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    busy = FakeFleet(1, limit=1)
    busy.behaviour["s0:1"] = lambda prompt_id, n: _error(429, "busy")
    with pytest.raises(GenerationError, match="none of the shard's 3 prompts completed: 3 failed") as caught:
        await run_shard_async(shard, busy.endpoints(), tmp_path / "out", fast_settings(max_attempts=1),
                              options=busy.options())
    assert caught.value.shard == 0 and "errors/shard-00000.jsonl" in caught.value.message
    assert "clear this task" in caught.value.hint and "start a new run" in caught.value.hint
    fixed = FakeFleet(1, limit=1)
    summary = await run_shard_async(shard, fixed.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fixed.options())
    assert (summary["done"], summary["failed"]) == (3, 0)
    assert shard_output(tmp_path / "out")["errors"] == []


# --- a time cap (the tuning trial's tuning_trial_max_s) -------------------------------------------------------

async def test_a_try_started_past_its_time_cap_sends_nothing_and_leaves_every_prompt_to_a_later_try(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(2)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(stop_taking_at=time.time() - 1))
    assert (summary["done"], summary["failed"], summary["left"]) == (0, 0, 12)
    assert sum(fleet.requests.values()) == 0
    later = FakeFleet(2)
    summary = await run_shard_async(shard, later.endpoints(), tmp_path / "out", fast_settings(),
                                    options=later.options())
    assert (summary["done"], summary["skipped_already_done"], summary["left"]) == (12, 0, 0)


async def test_a_time_cap_reached_mid_shard_finishes_what_is_in_flight_and_a_later_try_does_the_rest_once(
        tmp_path, monkeypatch):
    from fleetgen.generate import dispatch

    shard = write_prompts(tmp_path / "p.jsonl", 200)
    clock = {"now": 1000.0}
    monkeypatch.setattr(dispatch, "time", type("Clock", (), {"time": staticmethod(lambda: clock["now"]),
                                                             "monotonic": staticmethod(time.monotonic)}))
    fleet = FakeFleet(2, delay_s=0.02, limit=2)

    def the_fifth_request_passes_the_cap(prompt_id, number):
        if number == 5:
            clock["now"] = 2000.0
        return None

    fleet.behaviour["s0:1"] = the_fifth_request_passes_the_cap
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(stop_taking_at=1500.0))
    sent = sum(fleet.requests.values())
    # every prompt sent was finished, none written off; the others were never sent
    assert summary["done"] == sent and summary["failed"] == 0 and summary["left"] == 200 - sent
    assert 5 <= sent < 200, sent
    later = FakeFleet(2)
    again = await run_shard_async(shard, later.endpoints(), tmp_path / "out", fast_settings(),
                                  options=later.options())
    assert (again["done"], again["skipped_already_done"], again["left"]) == (200 - sent, sent, 0)
    assert not set(later.by_prompt) & set(fleet.by_prompt)  # nothing sent twice
    ids = [row["id"] for row in shard_output(tmp_path / "out")["completions"]]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 200


async def test_a_capped_try_whose_every_sent_prompt_failed_still_fails(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 50)
    busy = FakeFleet(1, limit=1, delay_s=0.05)
    busy.behaviour["s0:1"] = lambda prompt_id, n: _error(429, "busy")
    with pytest.raises(GenerationError, match="none of the shard's 50 prompts completed"):
        await run_shard_async(shard, busy.endpoints(), tmp_path / "out", fast_settings(max_attempts=1),
                              options=busy.options(stop_taking_at=time.time() + 0.2))


async def test_a_shard_samples_the_servers_as_it_ends_and_a_try_that_sends_nothing_adds_no_last_row(tmp_path):
    from generate_fakes import read_jsonl

    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(2)
    settings = fast_settings(sample_interval_s=60.0)  # one sample as it starts, one as it ends
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", settings, options=fleet.options())
    assert dict(fleet.scrapes) == {"s0:1": 2, "s1:1": 2}
    rows = read_jsonl(tmp_path / "out" / "metrics" / "shard-00000.jsonl")
    assert [row["running"] for row in rows[-2:]] == [0, 0]  # the servers as the shard left them
    again = FakeFleet(2)  # every prompt done before: a resume that sends nothing samples nothing
    await run_shard_async(shard, again.endpoints(), tmp_path / "out", settings, options=again.options())
    assert sum(again.scrapes.values()) == 0
    assert read_jsonl(tmp_path / "out" / "metrics" / "shard-00000.jsonl") == rows
    capped = FakeFleet(2)  # past its time cap from the start: nothing sent, nothing sampled
    await run_shard_async(write_prompts(tmp_path / "q.jsonl", 6), capped.endpoints(), tmp_path / "out2", settings,
                          options=capped.options(stop_taking_at=time.time() - 1))
    assert sum(capped.scrapes.values()) == 0
