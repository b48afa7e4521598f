"""Dispatcher decisions a user meets: what is retried, what counts against a prompt, when the shard stops,
and the stall watchdog (a busy server stays up, a hung one is abandoned)."""

import asyncio
import json
import logging
from collections import Counter
import httpx
import pytest
from generate_fakes import FakeFleet, fast_settings, shard_output, write_prompts
from fleetgen.errors import AllServersDown, GenerationError, PromptsError
from fleetgen.generate import ServerEndpoint, run_shard_async
from fleetgen.generate.queue import WorkQueue
from fleetgen.prompts.scan import Prompt, plan_shards
import re
from fleetgen.errors import AllServersDown, GenerationError

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]  # a hang (a broken dispatcher) fails in seconds

API_KEY = "sk-very-secret-key-123"


def assert_each_prompt_once(out, count):
    finished = [r["id"] for r in out["completions"]] + [r["id"] for r in out["errors"]]
    assert sorted(finished) == [f"p{n:04d}" for n in range(count)]
    assert [r["id"] for r in out["stats"]] == [r["id"] for r in out["completions"]]


async def test_generates_every_prompt_once_with_the_documented_fields(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 30, extra={"p0003": {"sampling": {"temperature": 0.0}}})
    fleet = FakeFleet(2)
    settings = fast_settings(extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    with caplog.at_level(logging.DEBUG):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", settings,
                                        options=fleet.options(api_key=API_KEY, progress_interval_s=0.01))
    out = shard_output(tmp_path / "out")
    assert_each_prompt_once(out, 30)
    assert summary["done"] == 30 and summary["failed"] == 0 and summary["skipped_already_done"] == 0
    assert summary["completion_tokens"] == 300 and summary["prompt_tokens"] == 210
    assert sum(s["completed"] for s in summary["servers"].values()) == 30
    first = next(r for r in out["completions"] if r["id"] == "p0003")
    assert first["messages"] == [{"role": "user", "content": "question 3"}]
    assert (first["reasoning_content"], first["content"]) == ("thinking about p0003", "answer to p0003")
    assert first["finish_reason"] == "stop" and first["model"] == "test-model"
    assert first["sampling"] == {"max_tokens": 64, "temperature": 0.0, "top_p": 0.95}
    assert first["usage"]["completion_tokens"] == 10 and first["server"] in fleet.names
    stats = next(r for r in out["stats"] if r["id"] == "p0003")
    assert set(stats) == {"id", "prompt_tokens", "completion_tokens", "finish_reason", "reasoning_chars",
                          "content_chars", "server", "latency_s", "finished_at", "reused_from"}
    assert stats["reasoning_chars"] == len("thinking about p0003")
    body = fleet.bodies["p0003"]
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["temperature"] == 0.0
    assert fleet.bodies["p0004"]["temperature"] == 0.6
    assert all(h["authorization"] == f"Bearer {API_KEY}" for h in fleet.headers)
    assert "tok/s" in caplog.text and "30/30 done" in caplog.text
    assert API_KEY not in caplog.text and API_KEY not in repr(summary)


async def test_bare_prompts_are_sent_as_one_user_turn(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "p0001", "prompt": "say 1"}\n')
    fleet = FakeFleet(1)
    await run_shard_async(plan_shards(path, shard_size=5)[0], fleet.endpoints(), tmp_path / "out", fast_settings(),
                          options=fleet.options())
    assert fleet.bodies["p0001"]["messages"] == [{"role": "user", "content": "say 1"}]
    assert shard_output(tmp_path / "out")["completions"][0]["prompt"] == "say 1"


async def test_in_flight_limits_hold_and_faster_servers_take_more(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 200)
    # 150x apart: on a loaded machine each request costs the fast server milliseconds of CPU besides its delay
    fleet = FakeFleet(2, delay_s={"s0:1": 0.002, "s1:1": 0.3}, limit=5)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert fleet.max_in_flight == Counter({"s0:1": 5, "s1:1": 5})
    assert summary["servers"]["s0:1"]["completed"] > 2 * summary["servers"]["s1:1"]["completed"]
    assert_each_prompt_once(shard_output(tmp_path / "out"), 200)


async def test_a_server_answering_500_is_marked_down_rechecked_and_used_again(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 120)
    fleet = FakeFleet(3, delay_s=0.005)
    def cuda_error(pid, n):
        return httpx.Response(500, json={"error": {"message": "CUDA error"}}) if n <= 3 else None

    fleet.behaviour["s1:1"] = cuda_error
    health_calls = Counter()

    def health(name):
        health_calls[name] += 1
        return httpx.Response(503 if health_calls[name] < 2 else 200)

    fleet.health["s1:1"] = health
    with caplog.at_level(logging.INFO):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert_each_prompt_once(out, 120) and not out["errors"]
    server = summary["servers"]["s1:1"]
    assert len(server["marked_down"]) == 1 and "http_500" in server["marked_down"][0]["reason"]
    assert "CUDA error" in server["marked_down"][0]["reason"] and len(server["recovered"]) == 1
    assert server["completed"] > 0 and server["retried"] >= 1
    assert "server s1:1 marked down at" in caplog.text and "server s1:1 is back up" in caplog.text


@pytest.mark.parametrize("error", [httpx.ConnectError("refused"), httpx.ReadTimeout("timed out"),
                                   httpx.RemoteProtocolError("Server disconnected")])
async def test_a_dead_server_loses_nothing(tmp_path, error):
    shard = write_prompts(tmp_path / "p.jsonl", 60)
    fleet = FakeFleet(2)

    def crash(pid, n):
        if n > 5:
            raise error

    fleet.behaviour["s1:1"] = crash
    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectError("refused"))
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert_each_prompt_once(shard_output(tmp_path / "out"), 60)
    assert summary["done"] == 60 and summary["servers"]["s1:1"]["completed"] == 5
    assert type(error).__name__ in summary["servers"]["s1:1"]["marked_down"][0]["reason"]


async def test_all_servers_down_saves_progress_and_a_retry_finishes_exactly_once(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 80)
    fleet = FakeFleet(2, limit=2)
    for name in fleet.names:
        fleet.behaviour[name] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("refused")) if n > 10 else None
        fleet.health[name] = lambda name: httpx.Response(503)
    with pytest.raises(AllServersDown) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(all_down_timeout_s=0.2),
                              options=fleet.options())
    assert caught.value.shard == 0 and "s0:1: down since" in str(caught.value)
    saved = shard_output(tmp_path / "out")
    assert len(saved["completions"]) == len(saved["stats"]) == 20 and not saved["errors"]
    mark = json.loads((tmp_path / "out" / "shards" / "shard-00000.mark.json").read_text())
    assert mark["valid_before"] <= 20 and mark["valid_before"] == min(
        n for n in range(80) if f"p{n:04d}" not in {r["id"] for r in saved["completions"]})

    healthy = FakeFleet(2)
    summary = await run_shard_async(shard, healthy.endpoints(), tmp_path / "out", fast_settings(),
                                    options=healthy.options())
    assert summary["skipped_already_done"] == 20 and summary["done"] == 60
    assert_each_prompt_once(shard_output(tmp_path / "out"), 80)
    assert not set(healthy.by_prompt) & {r["id"] for r in saved["completions"]}


async def test_a_client_error_fails_that_prompt_only(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    fleet = FakeFleet(2)
    too_long = {"object": "error", "message": "Requested token count exceeds the model's maximum context length",
                "type": "BadRequestError", "code": 400}
    for name in fleet.names:
        fleet.behaviour[name] = lambda pid, n: httpx.Response(400, json=too_long) if pid == "p0007" else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert_each_prompt_once(out, 40)
    [error] = out["errors"]
    assert error["id"] == "p0007" and error["status"] == "failed" and error["server"] in fleet.names
    assert error["error"] == {"code": "http_400", "message": "HTTP 400: " + too_long["message"]}
    assert error["at"].endswith("Z")
    assert len(fleet.by_prompt["p0007"]) == 1 and summary["failed"] == 1
    assert all(not s["marked_down"] for s in summary["servers"].values())


async def test_only_client_errors_stop_the_shard(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 100)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, json={"error": {"message": "unknown model"}})
    with pytest.raises(GenerationError, match="first 5 results were all client errors") as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=5),
                              options=fleet.options())
    assert "model name" in str(caught.value)
    assert shard_output(tmp_path / "out")["errors"] == []  # the server's fault: the next try sends them again


async def test_a_refused_key_stops_at_once_without_leaking_it(tmp_path, caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 50)
    fleet = FakeFleet(2, limit=1)
    for name in fleet.names:
        fleet.behaviour[name] = lambda pid, n: httpx.Response(401, json={"error": "Unauthorized"})
    with caplog.at_level(logging.DEBUG), pytest.raises(GenerationError, match="API key") as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                              options=fleet.options(api_key=API_KEY))
    assert sum(fleet.requests.values()) <= 2
    assert API_KEY not in str(caught.value) and API_KEY not in caplog.text


async def test_aborted_requests_are_retried_then_written_off(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2)
    aborted = {**__import__("generate_fakes").completion_body("p0002")}
    aborted["choices"] = [{**aborted["choices"][0], "finish_reason": "abort"}]
    for name in fleet.names:
        fleet.behaviour[name] = lambda pid, n: httpx.Response(200, json=aborted) if pid == "p0002" else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=3),
                                    options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert_each_prompt_once(out, 10)
    assert len(fleet.by_prompt["p0002"]) == 3
    assert out["errors"][0]["error"]["code"] == "attempts_exhausted"
    assert summary["failed"] == 1 and all(not s["marked_down"] for s in summary["servers"].values())


async def test_a_finished_shard_sends_nothing_on_rerun(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 25)
    fleet = FakeFleet(2)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    again = FakeFleet(2)
    summary = await run_shard_async(shard, again.endpoints(), tmp_path / "out", fast_settings(),
                                    options=again.options())
    assert summary["done"] == 0 and summary["skipped_already_done"] == 25 and not again.requests
    assert_each_prompt_once(shard_output(tmp_path / "out"), 25)


async def test_the_low_water_mark_follows_the_first_unfinished_prompt():
    positions = [(n, 100 * n, 100 * n + 100, Prompt(id=f"q{n}", prompt="x")) for n in range(5)]
    queue = WorkQueue(iter(positions), (0, 0))
    items = [queue.take() for _ in range(3)]
    assert queue.low_water() == (0, 0)
    queue.finish(items[1])
    assert queue.low_water() == (0, 0)
    queue.finish(items[0])
    assert queue.low_water() == (2, 200)
    queue.retry_later(items[2], 0.0)
    assert queue.low_water() == (2, 200)  # waiting for a retry is not finished
    await asyncio.sleep(0.01)
    retried = queue.take()
    assert retried.index == 2
    queue.finish(retried)
    assert queue.low_water() == (3, 300)
    rest = [queue.take(), queue.take()]
    assert queue.take() is None and not queue.finished.is_set()
    for item in rest:
        queue.finish(item)
    assert queue.low_water() == (5, 500) and queue.finished.is_set()


@pytest.mark.timeout(60)  # a thousand prompts before the cut: seconds of CPU on a loaded machine, not a hang
async def test_a_prompts_file_cut_short_mid_run_stops_the_shard_with_progress_saved(tmp_path):
    path = tmp_path / "p.jsonl"
    shard = write_prompts(path, 2000)  # far more than the reader's buffer holds
    fleet = FakeFleet(1, limit=2)

    def truncate_once(prompt_id, attempt):  # someone truncates the file while the shard reads it
        if attempt == 5:
            with path.open("r+b") as handle:
                handle.truncate(path.stat().st_size // 2 + 7)

    fleet.behaviour[fleet.names[0]] = truncate_once
    with pytest.raises(PromptsError, match="malformed JSON") as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert "as they were when it was planned" in str(caught.value) and caught.value.shard == 0
    out = shard_output(tmp_path / "out")
    assert 0 < len(out["completions"]) == len(out["stats"]) < 2000


async def test_a_prompts_file_cut_short_after_planning_is_refused_before_the_first_request(tmp_path):
    path = tmp_path / "p.jsonl"
    shard = write_prompts(path, 40)
    fleet = FakeFleet(1, limit=2)
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    with pytest.raises(PromptsError, match="changed after the run was planned: bytes 0 to 2,950 ") as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert "the file is now 1,475 bytes" in caught.value.message
    assert "put the prompts_path file back" in caught.value.hint
    assert sum(fleet.requests.values()) == 0 and shard_output(tmp_path / "out")["completions"] == []


async def test_a_shard_smaller_than_the_fleets_limit_spreads_over_every_server_by_its_limit(tmp_path):
    # 8 prompts in flight at once on two servers of 8 slots: filling the first server's slots first would leave
    # the second idle (a small job, the end of one); each takes half.
    fleet = FakeFleet(2, limit=8, delay_s=0.05)
    await run_shard_async(write_prompts(tmp_path / "p.jsonl", 8), fleet.endpoints(), tmp_path / "out",
                          fast_settings(), options=fleet.options())
    assert fleet.requests == {"s0:1": 4, "s1:1": 4}, fleet.requests
    # Limits of 2 and 6: 4 prompts go 1 and 3, in proportion to each server's limit.
    fleet = FakeFleet(2, delay_s=0.05)
    endpoints = [ServerEndpoint(name="s0:1", url="http://s0:1", max_in_flight=2),
                 ServerEndpoint(name="s1:1", url="http://s1:1", max_in_flight=6)]
    await run_shard_async(write_prompts(tmp_path / "q.jsonl", 4), endpoints, tmp_path / "out-q", fast_settings(),
                          options=fleet.options())
    assert fleet.requests == {"s0:1": 1, "s1:1": 3}, fleet.requests


async def test_concurrent_shards_split_each_servers_limit_and_a_lone_shard_takes_it_all(tmp_path):
    # Two shards running together (the other one's heartbeat is live) each keep at most half of every
    # server's limit...
    from fleetgen.generate.liveness import ShardHeartbeat
    from fleetgen.outputs import RunLayout

    other = ShardHeartbeat(RunLayout(tmp_path / "out-a"), 1)
    other.start()
    other.beat({}, draining=False)  # taking prompts, nothing in flight yet
    fleet = FakeFleet(2, limit=8)
    shard = write_prompts(tmp_path / "a.jsonl", 120)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out-a", fast_settings(),
                          options=fleet.options(sharing=lambda: 2))
    assert all(fleet.max_in_flight[name] == 4 for name in fleet.names), fleet.max_in_flight
    assert_each_prompt_once(shard_output(tmp_path / "out-a"), 120)
    # ... and when the count drops to one mid-run, the shard grows back to the full limit.
    fleet = FakeFleet(2, limit=8, delay_s=0.02)
    counts = iter([3] + [1] * 10_000)
    shard = write_prompts(tmp_path / "b.jsonl", 200)
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out-b", fast_settings(),
                          options=fleet.options(sharing=lambda: next(counts), sharing_interval_s=0.05,
                                                progress_interval_s=0.01))
    assert all(fleet.max_in_flight[name] == 8 for name in fleet.names), fleet.max_in_flight
    assert_each_prompt_once(shard_output(tmp_path / "out-b"), 200)


async def test_a_failing_share_count_keeps_generating(tmp_path, caplog):
    fleet = FakeFleet(1, limit=4)
    shard = write_prompts(tmp_path / "p.jsonl", 20)

    def broken() -> int:
        raise RuntimeError("API unavailable")

    with caplog.at_level(logging.WARNING):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options(sharing=broken))
    assert summary["done"] == 20 and "could not count the shards sharing the fleet" in caplog.text


def _finished_ids(out):
    return sorted([r["id"] for r in out["completions"]] + [r["id"] for r in out["errors"]])


@pytest.mark.parametrize("status", [408, 429])
async def test_request_timeout_and_rate_limit_are_retried_and_the_server_stays_up(tmp_path, status):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=2)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(status, text="busy") if pid == "p0003" and n < 6 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=3),
                                    options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert not out["errors"] and len(out["completions"]) == 12
    assert len(fleet.by_prompt["p0003"]) == 2
    server = summary["servers"]["s0:1"]
    assert server["retried"] == 1 and server["marked_down"] == [] and summary["failed"] == 0


async def test_requests_failing_on_a_server_already_down_do_not_count_against_their_prompts(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(2, limit=4, delay_s={"s0:1": 0.002, "s1:1": 0.05})
    fleet.behaviour["s1:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("refused"))
    fleet.health["s1:1"] = lambda name: httpx.Response(503)
    # One attempt per prompt: only the request whose failure marked s1 down is the prompt's fault.
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=1),
                                    options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert _finished_ids(out) == [f"p{n:04d}" for n in range(20)]
    [written_off] = out["errors"]
    assert written_off["error"]["code"] == "attempts_exhausted"
    assert written_off["error"]["message"].startswith("1 attempts failed; the last: ConnectError: refused")
    assert fleet.requests["s1:1"] == 4 and summary["servers"]["s1:1"]["retried"] == 4
    assert len(summary["servers"]["s1:1"]["marked_down"]) == 1 and summary["failed"] == 1
    assert summary["servers"]["s1:1"]["failed"] == 1 and summary["servers"]["s0:1"]["failed"] == 0


async def test_client_errors_after_a_success_do_not_stop_the_shard(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="bad") if n > 2 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=3),
                                    options=fleet.options())
    assert summary["done"] == 2 and summary["failed"] == 10
    assert len(shard_output(tmp_path / "out")["errors"]) == 10


async def test_client_errors_on_resuming_a_shard_that_already_succeeded_do_not_stop_it(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    first = FakeFleet(1, limit=1)
    first.behaviour["s0:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("gone")) if n > 3 else None
    first.health["s0:1"] = lambda name: httpx.Response(503)
    with pytest.raises(AllServersDown):
        await run_shard_async(shard, first.endpoints(), tmp_path / "out", fast_settings(all_down_timeout_s=0.1),
                              options=first.options())
    again = FakeFleet(1, limit=1)
    again.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="bad")
    summary = await run_shard_async(shard, again.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                                    options=again.options())
    assert summary["skipped_already_done"] == 3 and summary["failed"] == 9


async def test_the_breaker_trips_exactly_at_its_count(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, json={"error": {"message": "unknown model"}})
    with pytest.raises(GenerationError) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                              options=fleet.options())
    assert (caught.value.shard, caught.value.server) == (0, "s0:1")
    assert caught.value.message == ("the first 2 results were all client errors, e.g. HTTP 400: unknown model; "
                                    "none of them is written off")
    assert shard_output(tmp_path / "out")["errors"] == []


async def test_a_busy_but_healthy_server_is_not_marked_down_by_the_stall_watchdog(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1, limit=3, delay_s=0.2)  # 4x the stall check, /health answers 200
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.05),
                                    options=fleet.options(progress_interval_s=0.01))
    assert summary["done"] == 6 and summary["servers"]["s0:1"]["marked_down"] == []
    assert fleet.requests["s0:1"] == 6


async def test_a_hung_server_is_marked_down_and_its_requests_go_elsewhere(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=2, delay_s={"s0:1": 0.03, "s1:1": 2.0})  # s1 silent 20x the stall check
    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectTimeout("no answer"))
    summary = await asyncio.wait_for(
        run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.1),
                        options=fleet.options(progress_interval_s=0.01)), timeout=20)
    out = shard_output(tmp_path / "out")
    assert summary["done"] == 10 and not out["errors"]
    assert {r["server"] for r in out["completions"]} == {"s0:1"}
    [down] = summary["servers"]["s1:1"]["marked_down"]
    assert re.fullmatch(r"stalled: no answer for \d+ s with 2 request\(s\) in flight, and /health: "
                        r"ConnectTimeout: no answer", down["reason"]), down["reason"]
    assert summary["servers"]["s1:1"]["retried"] == 2 and summary["servers"]["s1:1"]["failed"] == 0
    # The abandoned prompts were each sent twice (s1 first), and neither attempt counted against them.
    assert sorted(p for p, servers in fleet.by_prompt.items() if servers[0] == "s1:1") == sorted(
        p for p, servers in fleet.by_prompt.items() if len(servers) == 2)
    mark = json.loads((tmp_path / "out" / "shards" / "shard-00000.mark.json").read_text())
    assert mark["valid_before"] == 10


KEY_HINT = "the server refused the API key: check the key in the run's connection/secret matches the servers' --api-key"


@pytest.mark.parametrize("status, words, hint", [
    (404, "HTTP 404: nope for /v1/chat/completions",
     "check the server URL and that it is an OpenAI-compatible SGLang server"),
    (403, "HTTP 403: nope", KEY_HINT),
    (401, "HTTP 401: nope", KEY_HINT),
])
async def test_a_wrong_url_or_key_stops_the_shard_at_once_naming_the_server(tmp_path, status, words, hint):
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(status, json={"error": {"message": "nope"}})
    with pytest.raises(GenerationError) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), options=fleet.options())
    assert caught.value.message == words and (caught.value.shard, caught.value.server) == (0, "s0:1")
    assert caught.value.hint == hint
    assert fleet.requests["s0:1"] == 1 and shard_output(tmp_path / "out")["errors"] == []


async def test_a_200_that_is_not_a_completion_marks_the_server_down_and_a_failing_trial_keeps_it_down(tmp_path,
                                                                                                      caplog):
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    fleet = FakeFleet(2, limit=1, delay_s={"s0:1": 0.02, "s1:1": 0.002})
    fleet.behaviour["s1:1"] = lambda pid, n: httpx.Response(200, text="<html>proxy</html>") if n <= 2 else None
    with caplog.at_level("INFO"):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert summary["done"] == 40 and not out["errors"]
    server = summary["servers"]["s1:1"]
    assert server["marked_down"][0]["reason"].startswith("bad_response: ")
    assert "server s1:1 still down (trial request failed: bad_response: " in caplog.text
    assert len(server["recovered"]) == 1 and server["recovered"][0]["down_s"] >= 0


async def test_every_server_down_names_each_with_its_reason(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=1)
    for name in fleet.names:
        fleet.behaviour[name] = lambda pid, n: httpx.Response(502, text="bad gateway")
        fleet.health[name] = lambda name: httpx.Response(503)
    with pytest.raises(AllServersDown) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(all_down_timeout_s=0.2),
                              options=fleet.options())
    message = caught.value.message
    assert re.match(r"every server has been down for \d+ s; progress is saved \(0 done, 10 left\):\n", message)
    assert "  s0:1: down since " in message and "(http_502: HTTP 502: bad gateway)" in message
    assert "  s1:1: down since " in message and caught.value.shard == 0
    assert caught.value.hint == "check the servers' logs and GPUs; a retry of this task resumes where it stopped"


def test_periodic_work_runs_once_per_interval_from_its_start():
    from fleetgen.generate.dispatch import Periodic

    runs = []
    timer = Periodic(2.0, lambda: runs.append(True))
    timer.start(100.0)
    for now in (100.0, 101.9, 102.0, 103.0, 103.9, 104.0, 104.1):
        timer.run_if_due(now)
    assert len(runs) == 2 and timer.next_at == 106.0


# --- a fault of the server is not a fault of the prompt ---------------------------------------------------------

async def test_a_tripped_breaker_writes_off_none_of_its_window_and_a_retry_sends_them_all(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    broken = FakeFleet(1, limit=2)
    broken.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, json={"error": {"message": "chat template"}})
    with pytest.raises(GenerationError, match="first 5 results were all client errors") as caught:
        await run_shard_async(shard, broken.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=5),
                              options=broken.options())
    assert shard_output(tmp_path / "out")["errors"] == []
    assert "none of them is written off" in caught.value.message
    fixed = FakeFleet(1, limit=2)
    summary = await run_shard_async(shard, fixed.endpoints(), tmp_path / "out", fast_settings(),
                                    options=fixed.options())
    assert (summary["done"], summary["failed"], summary["skipped_already_done"]) == (30, 0, 0)
    assert_each_prompt_once(shard_output(tmp_path / "out"), 30)


async def test_a_shard_whose_every_result_is_a_client_error_fails_below_the_breaker_count(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 3)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, json={"error": {"message": "chat template"}})
    with pytest.raises(GenerationError, match="all 3 results were client errors") as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=20),
                              options=fleet.options())
    assert "clear this task" in caught.value.hint
    assert shard_output(tmp_path / "out")["errors"] == []


async def test_client_errors_before_the_first_success_are_written_off_as_the_prompts_own_fault(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="too long") if n <= 2 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=3),
                                    options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert (summary["done"], summary["failed"]) == (4, 2)
    assert sorted((r["id"], r["fault"]) for r in out["errors"]) == [("p0000", "prompt"), ("p0001", "prompt")]
    assert_each_prompt_once(out, 6)


async def test_a_prompt_failing_every_attempt_is_recorded_as_the_servers_fault(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 4)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(429, text="busy") if pid == "p0002" else None
    await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=2),
                          options=fleet.options())
    [error] = shard_output(tmp_path / "out")["errors"]
    assert (error["id"], error["error"]["code"], error["fault"]) == ("p0002", "attempts_exhausted", "server")


async def test_a_completion_landing_after_the_breaker_tripped_writes_off_nothing_of_its_window(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 4)
    fleet = FakeFleet(1, limit=2, delay_s=0.05)  # both first requests answer in the same turn of the loop
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="chat template") if pid == "p0000" else None
    with pytest.raises(GenerationError, match="none of them is written off"):
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=1),
                              options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert out["errors"] == [] and [r["id"] for r in out["completions"]] in (["p0001"], [])
