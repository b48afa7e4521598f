"""What a user reads after servers fail: when a down server is re-checked and used again, how long a
retried prompt waits, the counts per server, and the exact words of the logs and errors."""

import asyncio
import logging
import re
import sys
import time
import types
from collections import Counter

import httpx
import pytest

from generate_fakes import FakeFleet, completion_body, fast_settings, read_jsonl, write_prompts

from fleetgen.errors import AllServersDown, GenerationError
from fleetgen.generate import ShardRunOptions, dispatch, health_keeping, run_shard_async
from fleetgen.generate.health import DOWN, UP, SharedHealth
from fleetgen.generate.queue import WorkQueue

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]  # a hang (a broken dispatcher) fails in seconds

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def patch_clock(monkeypatch, clock) -> None:
    """The dispatcher's clock, in both its halves: sending prompts and keeping the servers' health."""
    for module in (dispatch, health_keeping):
        monkeypatch.setattr(module, "time", clock)
API_KEY = "sk-recheck"


def recording(fleet: FakeFleet, seen: list) -> httpx.MockTransport:
    """The fleet behind a transport that keeps every request; like SGLang, /health answers only GET and the
    chat endpoint only POST."""
    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method != {"/health": "GET", "/v1/chat/completions": "POST"}.get(request.url.path, request.method):
            return httpx.Response(405)
        return await fleet.handle(request)
    return httpx.MockTransport(handle)


class FakeClock:
    """dispatch's monotonic clock, moved only by the test: what it reports is exactly known."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def fast_rechecks(monkeypatch) -> list[float]:
    """Re-check waits are recorded and not waited out; every other sleep runs as usual."""
    real_sleep = asyncio.sleep
    waits = []

    def sleep(delay, result=None):
        if "_recheck" in sys._getframe(1).f_code.co_name:
            waits.append(delay)
            return real_sleep(0.001, result)
        return real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return waits


def messages(caplog, level="INFO"):
    return [r.getMessage() for r in caplog.records if r.levelname == level]


async def test_a_server_down_twice_is_rechecked_on_a_doubling_schedule_and_reports_its_downtime(
        tmp_path, monkeypatch, caplog):
    waits = fast_rechecks(monkeypatch)
    clock = FakeClock()
    patch_clock(monkeypatch, types.SimpleNamespace(monotonic=clock.monotonic))
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.01, "s1:1": 0.001})
    # s1 fails its 1st and its 6th request; its /health fails twice after the first, once after the second.
    fleet.behaviour["s1:1"] = lambda pid, n: (
        httpx.Response(500, json={"error": {"message": "CUDA error"}}) if n in (1, 6) else None)
    health_calls = Counter()

    def health(name):
        health_calls[name] += 1
        clock.now += 0.123  # each re-check happens 0.123 s (of the fake clock) after the last
        return httpx.Response(503 if health_calls[name] in (1, 2, 4) else 200)

    fleet.health["s1:1"] = health
    seen = []
    settings = fast_settings(recheck_initial_s=1.0, recheck_max_s=8.0, health_timeout_s=3.5, connect_timeout_s=2.5)
    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", settings,
                                        options=ShardRunOptions(api_key=API_KEY, transport=recording(fleet, seen)))
    assert summary["done"] == 40 and summary["failed"] == 0
    # 1 s, doubling after each failed check; a server down a second time starts at 2 s.
    assert waits == [1.0, 2.0, 4.0, 2.0, 4.0]
    server = summary["servers"]["s1:1"]
    assert [d["reason"] for d in server["marked_down"]] == ["http_500: HTTP 500: CUDA error"] * 2
    assert all(re.fullmatch(STAMP, d["at"]) for d in server["marked_down"] + server["recovered"])
    assert [sorted(r) for r in server["recovered"]] == [["at", "down_s"]] * 2
    downtimes = [r["down_s"] for r in server["recovered"]]
    assert downtimes == [0.4, 0.2] and all(type(d) is float for d in downtimes)  # 3 and 2 checks of 0.123 s
    assert server["retried"] == 2 and server["failed"] == 0
    assert summary["servers"]["s0:1"]["marked_down"] == []

    warnings = messages(caplog, "WARNING")
    down = [m for m in warnings if "marked down" in m]
    assert len(down) == 2 and all(re.fullmatch(
        rf"shard 0: server s1:1 marked down at {STAMP} \(http_500: HTTP 500: CUDA error\); its prompts go to "
        r"the other servers; re-checking http://s1:1/health", m) for m in down), down
    up = [m for m in warnings if "back up" in m]
    assert [re.sub(STAMP, "T", m) for m in up] == ["shard 0: server s1:1 is back up at T after 0.4 s down",
                                                   "shard 0: server s1:1 is back up at T after 0.2 s down"]
    still = [m for m in messages(caplog) if "still down" in m]
    assert still == [f"shard 0: server s1:1 still down (/health: HTTP 503); next check in {s} s"
                     for s in ("2.0", "4.0", "4.0")]

    checks = [r for r in seen if r.url.path == "/health"]
    assert len(checks) == 5 and {r.method for r in checks} == {"GET"}
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in checks)
    assert all(r.extensions["timeout"] == {"connect": 2.5, "read": 3.5, "write": 2.5, "pool": 2.5} for r in checks)
    generations = [r for r in seen if r.url.path == "/v1/chat/completions"]
    assert generations and all(r.extensions["timeout"] == {
        "connect": 2.5, "read": settings.effective_request_timeout_s, "write": 2.5, "pool": 2.5} for r in generations)


async def test_a_server_whose_health_keeps_failing_is_not_used_again_even_when_it_could_answer(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.005, "s1:1": 0.001})
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(502, text="bad gateway") if n == 1 else None
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options())
    assert summary["done"] == 30
    server = summary["servers"]["s1:1"]
    assert len(server["marked_down"]) == 1 and server["recovered"] == [] and server["completed"] == 0
    assert fleet.requests["s1:1"] == 1  # no trial request: /health never answered 200
    assert "server s1:1 still down (/health: HTTP 503)" in caplog.text


async def test_a_lone_server_back_up_goes_on_generating(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=2)
    fleet.behaviour["s0:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("refused")) if n == 2 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(progress_interval_s=0.01))
    server = summary["servers"]["s0:1"]
    assert summary["done"] == 12 and len(server["marked_down"]) == 1 and len(server["recovered"]) == 1


async def test_a_server_back_up_while_no_prompt_is_waiting_resumes_without_a_trial(tmp_path):
    # s1 fails p0001 and is re-checked while p0001 still waits out its backoff and p0000 is on s0:
    # nothing to try it with, so its /health alone brings it back, and it then takes p0001.
    shard = write_prompts(tmp_path / "p.jsonl", 2)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.15, "s1:1": 0.001})
    fleet.behaviour["s1:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("refused")) if n == 1 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(retry_backoff_s=0.1, recheck_initial_s=0.005),
                                    options=fleet.options())
    server = summary["servers"]["s1:1"]
    assert summary["done"] == 2 and len(server["marked_down"]) == 1 and len(server["recovered"]) == 1
    assert fleet.by_prompt["p0001"] == ["s1:1", "s1:1"] and server["completed"] == 1


async def test_a_retried_prompt_waits_a_doubling_backoff_capped_at_recheck_max(tmp_path, monkeypatch):
    waits = []
    retry_later = WorkQueue.retry_later

    def spy(self, item, delay_s):
        waits.append((item.prompt.id, delay_s))
        return retry_later(self, item, 0.0)

    monkeypatch.setattr(WorkQueue, "retry_later", spy)
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(429, text="slow down") if pid == "p0002" else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(max_attempts=5, retry_backoff_s=0.5, recheck_max_s=3.0),
                                    options=fleet.options())
    assert waits == [("p0002", 0.5), ("p0002", 1.0), ("p0002", 2.0), ("p0002", 3.0)]
    assert summary["failed"] == 1 and summary["servers"]["s0:1"]["retried"] == 5


async def test_requests_failing_on_a_server_already_down_wait_the_first_backoff(tmp_path, monkeypatch):
    waits = []
    retry_later = WorkQueue.retry_later

    def spy(self, item, delay_s):
        waits.append(delay_s)
        return retry_later(self, item, 0.0)

    monkeypatch.setattr(WorkQueue, "retry_later", spy)
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=3, delay_s={"s0:1": 0.002, "s1:1": 0.02})
    fleet.behaviour["s1:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("refused"))
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(retry_backoff_s=0.25, recheck_max_s=5.0),
                                    options=fleet.options())
    assert summary["done"] == 10 and summary["servers"]["s1:1"]["retried"] == 3
    assert waits == [0.25, 0.25, 0.25]  # one blamed failure (1st try), two not counted (still 1st try)


async def test_written_off_prompts_are_counted_on_their_server(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 8)
    fleet = FakeFleet(1, limit=1)
    written_off = ("p0001", "p0004", "p0005")
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="too long") if pid in written_off else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["failed"] == 3 and summary["done"] == 5
    assert summary["servers"]["s0:1"]["failed"] == 3 and summary["servers"]["s0:1"]["completed"] == 5


async def test_the_breaker_says_which_settings_to_check(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="max_tokens too large")
    with pytest.raises(GenerationError) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=3),
                              options=fleet.options())
    assert caught.value.hint == ("a setting or the server is wrong rather than the prompts: check the model name, "
                                 "max_tokens against the context length, extra_body and the server's chat template; "
                                 "once fixed, clear this task: it sends these prompts again")


async def test_completions_without_token_counts_add_no_tokens(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 4)
    fleet = FakeFleet(1, limit=1)

    def no_usage(pid, n):
        body = completion_body(pid)
        body["usage"] = {"prompt_tokens": 0} if n % 2 else None
        return httpx.Response(200, json=body)

    fleet.behaviour["s0:1"] = no_usage
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 4 and (summary["prompt_tokens"], summary["completion_tokens"]) == (0, 0)


async def test_every_server_down_on_a_resumed_shard_counts_earlier_and_new_prompts_one_line_per_server(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)

    def failing_except(answered):
        fleet = FakeFleet(2, limit=1)
        for name in fleet.names:
            fleet.behaviour[name] = lambda pid, n: (
                None if pid in answered else (_ for _ in ()).throw(httpx.ConnectError("gone")))
            fleet.health[name] = lambda name: httpx.Response(503)
        return fleet

    # Each server takes a prompt at a time in file order: the first try finishes p0000-p0002, the second
    # p0003-p0004, and each stops when both servers have failed the next prompts.
    settings = fast_settings(all_down_timeout_s=0.05, share_server_health=False)
    first = failing_except({"p0000", "p0001", "p0002"})
    with pytest.raises(AllServersDown):
        await run_shard_async(shard, first.endpoints(), tmp_path / "out", settings,
                              options=first.options(progress_interval_s=0.01))
    again = failing_except({"p0003", "p0004"})
    with pytest.raises(AllServersDown) as caught:
        await run_shard_async(shard, again.endpoints(), tmp_path / "out", settings,
                              options=again.options(progress_interval_s=0.01))
    head, *lines = caught.value.message.split("\n")
    down_for = re.fullmatch(r"every server has been down for (\d+) s; progress is saved \(5 done, 5 left\):", head)
    assert down_for and int(down_for.group(1)) <= 60, head  # measured since the last server went down
    assert len(lines) == 2 and all(re.fullmatch(rf"  s{n}:1: down since {STAMP} \(connection: ConnectError: gone\)",
                                                line) for n, line in enumerate(lines)), lines


async def test_a_hung_servers_reported_silence_is_measured_from_its_last_answer(tmp_path, monkeypatch):
    offset = 10_000_000.0  # a clock far from zero: a sum instead of a difference cannot pass for a duration
    patch_clock(monkeypatch, types.SimpleNamespace(monotonic=lambda: time.monotonic() + offset))
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.01, "s1:1": 2.0})  # silent 40x the stall check
    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectTimeout("no answer"))
    started = time.monotonic()
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.05),
                                    options=fleet.options(progress_interval_s=0.01))
    ran_s = time.monotonic() - started
    [down] = summary["servers"]["s1:1"]["marked_down"]
    silent = re.fullmatch(r"stalled: no answer for (\d+) s with 1 request\(s\) in flight, and /health: "
                          r"ConnectTimeout: no answer", down["reason"])
    assert silent and int(silent.group(1)) <= ran_s + 1, down["reason"]
    assert summary["done"] == 6
    stats = read_jsonl(tmp_path / "out" / "stats" / "shard-00000.jsonl")
    assert len(stats) == 6 and all(0 <= row["latency_s"] <= ran_s for row in stats)
    # Its abandoned request went back to the queue, saying why.
    assert [e["reason"] for e in events_of(tmp_path / "out", "retried")] == ["abandoned: the server stopped answering"]


def events_of(out_dir, kind):
    return [{k: v for k, v in row.items() if k not in ("at", "t")}
            for row in read_jsonl(out_dir / "events" / "shard-00000.jsonl") if row["event"] == kind]


async def test_the_events_file_names_each_down_recovery_retry_and_write_off(tmp_path, monkeypatch):
    clock = FakeClock()
    patch_clock(monkeypatch, types.SimpleNamespace(monotonic=clock.monotonic))
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.01, "s1:1": 0.001})
    crash = "CUDA error: " + "x" * 600  # reasons are kept to their first 500 characters
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(500, json={"error": {"message": crash}}) if n == 1 else None
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="y" * 600) if pid == "p0000" else None

    def health(name):
        clock.now += 0.25
        return httpx.Response(200)

    fleet.health["s1:1"] = health
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 11 and summary["failed"] == 1
    [down] = events_of(tmp_path / "out", "down")
    assert down == {"shard": 0, "event": "down", "server": "s1:1", "reason": ("http_500: HTTP 500: " + crash)[:500]}
    [retried] = events_of(tmp_path / "out", "retried")
    assert retried == {"shard": 0, "event": "retried", "server": "s1:1", "prompt": "p0001",
                       "reason": ("HTTP 500: " + crash)[:500]}
    [recovered] = events_of(tmp_path / "out", "recovered")
    assert recovered == {"shard": 0, "event": "recovered", "server": "s1:1", "down_s": 0.2}  # 0.25 rounded down
    [failed] = events_of(tmp_path / "out", "failed")
    assert failed == {"shard": 0, "event": "failed", "server": "s0:1", "prompt": "p0000", "code": "http_400",
                      "reason": ("HTTP 400: " + "y" * 600)[:500]}


async def test_a_server_another_shard_marks_down_and_back_up_follows_its_word(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "HEALTH_POLL_S", 0.005)
    shard = write_prompts(tmp_path / "p.jsonl", 150)
    other = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other"))
    fleet = FakeFleet(2, limit=1, delay_s=0.003)
    used_before_up = []

    def s0(pid, n):  # the other shard's findings arrive while this one generates
        if n == 3:
            other.publish("s1:1", DOWN, "http_502: HTTP 502: bad gateway")
        if n == 7:  # still down there: nothing changes here
            other.publish("s1:1", DOWN, "http_502: HTTP 502: bad gateway")
        if n == 12:
            used_before_up.append(fleet.requests["s1:1"])
            other.publish("s1:1", UP, "health and a trial request succeeded")
        if n == 20:  # news of a server that is up here changes nothing either
            other.publish("s0:1", UP, "health and a trial request succeeded")

    fleet.behaviour["s0:1"] = s0
    # This shard's own re-checks fail until it has taken the other shard's word (and sent s1 requests again):
    # a re-check still running then must not bring the server back a second time.
    fleet.health["s1:1"] = lambda name: httpx.Response(
        200 if used_before_up and fleet.requests["s1:1"] > used_before_up[0] else 503)
    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options(progress_interval_s=0.005))
    assert summary["done"] == 150
    server = summary["servers"]["s1:1"]
    assert [d["reason"] for d in server["marked_down"]] == ["marked down by shard 9: http_502: HTTP 502: bad gateway"]
    assert len(server["recovered"]) == 1 and server["completed"] > 0
    assert summary["servers"]["s0:1"]["marked_down"] == []
    [recovered] = events_of(tmp_path / "out", "recovered")
    assert recovered["by"] == "shard 9"
    assert re.search(rf"server s1:1 is back up at {STAMP} after \d+\.\d s down \(re-checked by shard 9\)", caplog.text)


async def test_a_server_this_shard_finds_down_is_published_for_the_other_shards(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=1)
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(502, text="bad gateway")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    before = time.time()
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    entries = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other")).changed_entries()
    entry = entries["s1:1"]
    assert (entry.state, entry.reason, entry.by) == (DOWN, "http_502: HTTP 502: bad gateway", "shard 0")
    assert entry.at >= before and "s0:1" not in entries


async def test_a_server_this_shard_brings_back_is_published_up_and_generation_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "HEALTH_POLL_S", 0.005)
    shard = write_prompts(tmp_path / "p.jsonl", 80)
    fleet = FakeFleet(2, limit=1, delay_s=0.002)
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(502, text="bad gateway") if n == 1 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(progress_interval_s=0.005))
    assert summary["done"] == 80 and len(summary["servers"]["s1:1"]["recovered"]) == 1
    entry = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other")).changed_entries()["s1:1"]
    assert (entry.state, entry.reason, entry.by) == (UP, "health and a trial request succeeded", "shard 0")


async def test_server_metrics_are_sampled_at_the_interval_and_not_at_all_when_it_is_zero(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    sampled = FakeFleet(1, limit=1, delay_s=0.005)
    await run_shard_async(shard, sampled.endpoints(), tmp_path / "a", fast_settings(sample_interval_s=0.01),
                          options=sampled.options())
    assert sampled.scrapes["s0:1"] > 0
    unsampled = FakeFleet(1, limit=1, delay_s=0.005)
    summary = await run_shard_async(shard, unsampled.endpoints(), tmp_path / "b", fast_settings(sample_interval_s=0),
                                    options=unsampled.options())
    assert summary["done"] == 20 and not unsampled.scrapes


async def test_each_completion_is_indexed_for_reuse_by_its_prompt_hash(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(1, limit=1)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    rows = read_jsonl(tmp_path / "out" / "reuse" / "shard-00000.jsonl")
    assert len(rows) == 5 and len({row["h"] for row in rows}) == 5


async def test_a_lone_shard_sharing_the_fleet_with_nobody_announces_no_change(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(1, limit=2)
    with caplog.at_level("INFO"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                              options=fleet.options(sharing=lambda: 1))
    assert "share the fleet" not in caplog.text and fleet.max_in_flight["s0:1"] == 2


async def test_when_the_other_shard_ends_this_one_grows_back_to_each_servers_whole_limit(tmp_path):
    from fleetgen.generate.liveness import ShardHeartbeat
    from fleetgen.outputs import RunLayout

    other = ShardHeartbeat(RunLayout(tmp_path / "out"), 1)
    other.start()
    other.beat({}, draining=False)  # another shard takes prompts: each gets half of the limit
    running = [2]
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    fleet = FakeFleet(1, limit=4, delay_s=0.01)
    halves = []

    def s0(pid, n):
        if n == 8:  # the other shard ends
            halves.append(fleet.max_in_flight["s0:1"])
            other.stop()
            running[0] = 1

    fleet.behaviour["s0:1"] = s0
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(sharing=lambda: running[0], sharing_interval_s=0.02))
    assert summary["done"] == 60 and halves == [2] and fleet.max_in_flight["s0:1"] == 4


async def test_a_request_timeout_marks_the_server_down_as_timed_out(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=1)
    fleet.behaviour["s1:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ReadTimeout("timed out"))
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 10
    assert [d["reason"] for d in summary["servers"]["s1:1"]["marked_down"]] == ["timeout: ReadTimeout: timed out"]


async def test_the_final_progress_line_shows_nothing_left_in_flight_and_the_down_server(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(2, limit=2)
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(503, text="overloaded") if n > 3 else None
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    with caplog.at_level("INFO"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    last = [m for m in messages(caplog) if "in flight:" in m][-1]
    assert last.startswith("shard 0: 20/20 done") and last.endswith("in flight: s0:1=0 s1:1=DOWN/0")


async def test_what_was_wrong_with_a_200_and_an_abort_is_kept(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(2, limit=1)
    aborted = completion_body("p0002")
    aborted["choices"][0]["finish_reason"] = "abort"
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(200, json=aborted) if pid == "p0002" else None
    # s1 may come back before p0002's second try (how soon depends on the machine): it aborts p0002 too
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(200, text="<html>proxy</html>") if n == 1 else (
        httpx.Response(200, json=aborted) if pid == "p0002" else None)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=2),
                                    options=fleet.options())
    [down] = summary["servers"]["s1:1"]["marked_down"]
    assert down["reason"].startswith("bad_response: not a chat completion (")
    assert down["reason"].endswith("): b'<html>proxy</html>'")
    errors = read_jsonl(tmp_path / "out" / "errors" / "shard-00000.jsonl")
    assert [e["error"]["message"] for e in errors] == [
        "2 attempts failed; the last: the server aborted the request (finish_reason abort)"]


async def test_metrics_samples_count_this_shards_requests_and_skip_a_down_server(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    fleet = FakeFleet(2, limit=3, delay_s=0.01)
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(500, text="dead")
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(sample_interval_s=0.01),
                                    options=fleet.options())
    assert summary["done"] == 40
    rows = read_jsonl(tmp_path / "out" / "metrics" / "shard-00000.jsonl")
    sent = [row["sent"] for row in rows if row["server"] == "s0:1"]
    assert sent and all(type(n) is int and 0 <= n <= 3 for n in sent) and max(sent) > 0
    assert fleet.scrapes["s0:1"] > 5 and fleet.scrapes["s1:1"] <= 2  # s1, down from its first answer, is left alone


async def test_a_server_without_metrics_is_named_once_in_the_log(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(1, limit=1, delay_s=0.005)

    async def handle(request):
        return httpx.Response(404) if request.url.path == "/metrics" else await fleet.handle(request)

    with caplog.at_level("WARNING"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(sample_interval_s=0.01),
                              options=ShardRunOptions(transport=httpx.MockTransport(handle)))
    gaps = [m for m in messages(caplog, "WARNING") if "no metrics" in m]
    assert len(gaps) == 1 and gaps[0].startswith("shard 0: no metrics from s0:1 (") and gaps[0].endswith(
        "); its occupancy has gaps")


async def test_a_shard_that_ends_before_its_first_scrape_answers_still_samples_each_server_once(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(2, limit=2)
    slow_first = Counter()

    async def handle(request):
        if request.url.path == "/metrics":
            slow_first[request.url.host, request.url.port] += 1
            if slow_first[request.url.host, request.url.port] == 1:
                await asyncio.sleep(5)  # the shard is done long before this answers
        return await fleet.handle(request)

    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(sample_interval_s=60),
                                    options=ShardRunOptions(transport=httpx.MockTransport(handle)))
    rows = read_jsonl(tmp_path / "out" / "metrics" / "shard-00000.jsonl")
    assert summary["done"] == 3 and sorted(row["server"] for row in rows) == ["s0:1", "s1:1"]


async def test_a_server_another_shard_found_hung_has_this_shards_requests_abandoned_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "HEALTH_POLL_S", 0.005)
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    other = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other"))
    fleet = FakeFleet(2, limit=2, delay_s={"s0:1": 0.003, "s1:1": 2.0})  # s1 hangs; this shard's watchdog is slow

    def s0(pid, n):
        if n == 2:
            other.publish("s1:1", DOWN, "no answer for 30 s with 4 request(s) in flight", hung=True)

    fleet.behaviour["s0:1"] = s0
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=60),
                                    options=fleet.options(progress_interval_s=0.005))
    out_dir = tmp_path / "out"
    assert summary["done"] == 30 and {r["server"] for r in read_jsonl(out_dir / "completions" / "shard-00000.jsonl")} \
        == {"s0:1"}
    assert [e["reason"] for e in events_of(out_dir, "retried")] == ["abandoned: the server stopped answering"] * 2


async def test_a_shard_count_share_leaves_the_room_the_other_shard_uses_on_each_server(tmp_path, caplog):
    from fleetgen.generate.liveness import ShardHeartbeat
    from fleetgen.outputs import RunLayout

    other = ShardHeartbeat(RunLayout(tmp_path / "out"), 1)
    other.start()
    other.beat({"s0:1": 3}, draining=False)  # the other shard has 3 of s0's 4 requests in flight
    try:
        shard = write_prompts(tmp_path / "p.jsonl", 20)
        fleet = FakeFleet(2, limit=4, delay_s=0.005)
        with caplog.at_level("INFO"):
            await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                  options=fleet.options(sharing=lambda: 2, sharing_interval_s=0.01,
                                                        progress_interval_s=0.005))
    finally:
        other.stop()
    assert fleet.max_in_flight == Counter({"s0:1": 1, "s1:1": 2})
    # Said once, when the share changed from the lone shard's whole limit; the later counts change nothing.
    assert [m for m in messages(caplog) if "share the fleet" in m] == [
        "shard 0: 2 shard(s) share the fleet; in-flight caps now s0:1=1, s1:1=2"]


async def test_progress_is_saved_on_the_way_every_mark_interval(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "MARK_INTERVAL_S", 0.01)
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    fleet = FakeFleet(1, limit=1, delay_s=0.004)
    marks = []
    fleet.behaviour["s0:1"] = lambda pid, n: marks.append(
        (tmp_path / "out" / "shards" / "shard-00000.mark.json").exists()) if n == 25 else None
    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options(progress_interval_s=0.005))
    assert summary["done"] == 30 and marks == [True]
    progress = [m for m in messages(caplog) if m.startswith("shard 0: ") and " done (" in m and "in flight: " in m]
    assert len(progress) >= 2  # lines on the way, and the last one


async def test_a_failing_share_count_is_logged_with_its_cause(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 4)
    fleet = FakeFleet(1, limit=2)

    def broken():
        raise RuntimeError("API unavailable")

    with caplog.at_level("WARNING"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                              options=fleet.options(sharing=broken))
    assert "shard 0: could not count the shards sharing the fleet (API unavailable); keeping 1/1" in messages(
        caplog, "WARNING")


async def test_a_server_answering_usage_as_strings_is_a_bad_response_and_its_prompts_go_elsewhere(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 8)
    fleet = FakeFleet(2, limit=1)

    def string_usage(pid, n):
        body = completion_body(pid)
        body["usage"] = {"prompt_tokens": 7, "completion_tokens": "12", "total_tokens": 19}
        return httpx.Response(200, json=body)

    fleet.behaviour["s1:1"] = string_usage
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 8 and summary["failed"] == 0
    assert summary["completion_tokens"] == 8 * 10  # s0:1's answers only
    [down] = summary["servers"]["s1:1"]["marked_down"]
    assert down["reason"].startswith("bad_response: usage.completion_tokens is not a token count ('12'): ")
    assert summary["servers"]["s1:1"]["completed"] == 0 and summary["servers"]["s1:1"]["retried"] >= 1


async def test_a_server_this_shard_finds_hung_is_published_hung_for_the_other_shards(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.01, "s1:1": 2.0})  # silent 40x the stall check
    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectTimeout("no answer"))
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.05),
                                    options=fleet.options(progress_interval_s=0.01))
    assert summary["done"] == 6
    entry = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other")).changed_entries()["s1:1"]
    assert (entry.state, entry.hung, entry.by) == (DOWN, True, "shard 0")
    assert entry.reason.startswith("stalled: no answer for ")


async def test_a_server_down_here_that_another_shard_also_finds_down_stays_down(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch, "HEALTH_POLL_S", 0.005)
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    other = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other"))
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.005, "s1:1": 0.001})
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(502, text="bad gateway")
    checks = Counter()

    def health(name):  # re-checked only once this shard has it down; the other shard finds it down too
        checks[name] += 1
        if checks[name] == 1:
            other.publish("s1:1", DOWN, "http_502: HTTP 502: bad gateway")
        return httpx.Response(503)

    fleet.health["s1:1"] = health
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options(progress_interval_s=0.005))
    assert summary["done"] == 40 and checks["s1:1"] >= 1
    server = summary["servers"]["s1:1"]
    assert [d["reason"] for d in server["marked_down"]] == ["http_502: HTTP 502: bad gateway"]
    assert server["recovered"] == [] and fleet.requests["s1:1"] == 1 and events_of(tmp_path / "out", "recovered") == []


async def test_a_trial_request_abandoned_on_a_server_found_hung_is_logged_as_stalled(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "HEALTH_POLL_S", 0.005)
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    other = SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("other"))
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.005, "s1:1": 0.001})
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(502, text="bad gateway") if n == 1 else None
    sent = Counter()

    async def handle(request):
        name = f"{request.url.host}:{request.url.port}"
        if name == "s1:1" and request.url.path == "/v1/chat/completions":
            sent[name] += 1
            if sent[name] == 2:  # this shard's trial request: the other shard finds s1 back up meanwhile...
                other.publish("s1:1", UP, "health and a trial request succeeded")
                await asyncio.sleep(5)
            if sent[name] == 3:  # ... and s1's worker, back at it, finds it hung there
                other.publish("s1:1", DOWN, "stalled: no answer for 61 s", hung=True)
                await asyncio.sleep(5)
        return await fleet.handle(request)

    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                        fast_settings(recheck_initial_s=0.05),
                                        options=ShardRunOptions(transport=httpx.MockTransport(handle),
                                                                progress_interval_s=0.005))
    assert summary["done"] == 40 and summary["failed"] == 0
    assert [d["reason"] for d in summary["servers"]["s1:1"]["marked_down"]] == [
        "http_502: HTTP 502: bad gateway", "marked down by shard 9: stalled: no answer for 61 s"]
    assert [m for m in messages(caplog) if "trial request failed" in m] == [
        "shard 0: server s1:1 still down (trial request failed: stalled: abandoned: the server stopped answering); "
        "next check in 0.1 s"]


async def test_every_server_down_fails_the_shard_exactly_at_the_timeout(tmp_path, monkeypatch):
    clock = FakeClock()
    patch_clock(monkeypatch, types.SimpleNamespace(monotonic=clock.monotonic))
    shard = write_prompts(tmp_path / "p.jsonl", 5)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("gone"))

    def health(name):  # re-checked once down (at 1000.0 of the fake clock): the clock then reads the timeout
        clock.now = 1000.25
        return httpx.Response(503)

    fleet.health["s0:1"] = health
    with pytest.raises(AllServersDown) as caught:
        await asyncio.wait_for(run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                               fast_settings(all_down_timeout_s=0.25),
                                               options=fleet.options(progress_interval_s=0.005)), timeout=2)
    assert caught.value.message.startswith("every server has been down for 0 s; progress is saved (0 done, 5 left)")


async def test_a_server_silent_for_exactly_the_stall_check_is_probed(tmp_path, monkeypatch):
    clock = FakeClock()
    patch_clock(monkeypatch, types.SimpleNamespace(monotonic=clock.monotonic))
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.002, "s1:1": 1.0})

    async def handle(request):
        if request.url.host == "s1" and request.url.path == "/v1/chat/completions":
            clock.now = 1002.0  # s1 has been silent since its request went out at 1000.0
        return await fleet.handle(request)

    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectTimeout("no answer"))
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=2.0),
                                    options=ShardRunOptions(transport=httpx.MockTransport(handle),
                                                            progress_interval_s=0.005))
    assert summary["done"] == 6
    [down] = summary["servers"]["s1:1"]["marked_down"]
    assert down["reason"] == ("stalled: no answer for 2 s with 1 request(s) in flight, and /health: ConnectTimeout: "
                              "no answer")
    assert summary["servers"]["s1:1"]["completed"] == 0
