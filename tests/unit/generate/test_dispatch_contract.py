"""Dispatcher decisions a user meets: what is retried, what counts against a prompt, when the shard stops,
and the stall watchdog (a busy server stays up, a hung one is abandoned)."""

import asyncio
import json
import re

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output, write_prompts

from fleetgen.errors import AllServersDown, GenerationError
from fleetgen.generate import run_shard_async

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]  # a hang (a broken dispatcher) fails in seconds


def _finished_ids(out):
    return sorted([r["id"] for r in out["completions"]] + [r["id"] for r in out["errors"]])


@pytest.mark.parametrize("status", [408, 429])
async def test_request_timeout_and_rate_limit_are_retried_and_the_server_stays_up(tmp_path, status):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=2)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(status, text="busy") if pid == "p0003" and n < 6 else None
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(max_attempts=3),
                                    transport=fleet.transport())
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
                                    transport=fleet.transport())
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
                                    transport=fleet.transport())
    assert summary["done"] == 2 and summary["failed"] == 10
    assert len(shard_output(tmp_path / "out")["errors"]) == 10


async def test_client_errors_on_resuming_a_shard_that_already_succeeded_do_not_stop_it(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    first = FakeFleet(1, limit=1)
    first.behaviour["s0:1"] = lambda pid, n: (_ for _ in ()).throw(httpx.ConnectError("gone")) if n > 3 else None
    first.health["s0:1"] = lambda name: httpx.Response(503)
    with pytest.raises(AllServersDown):
        await run_shard_async(shard, first.endpoints(), tmp_path / "out", fast_settings(all_down_timeout_s=0.1),
                              transport=first.transport())
    again = FakeFleet(1, limit=1)
    again.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, text="bad")
    summary = await run_shard_async(shard, again.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                                    transport=again.transport())
    assert summary["skipped_already_done"] == 3 and summary["failed"] == 9


async def test_the_breaker_trips_exactly_at_its_count(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 12)
    fleet = FakeFleet(1, limit=1)
    fleet.behaviour["s0:1"] = lambda pid, n: httpx.Response(400, json={"error": {"message": "unknown model"}})
    with pytest.raises(GenerationError) as caught:
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(client_error_breaker=2),
                              transport=fleet.transport())
    assert (caught.value.shard, caught.value.server) == (0, "s0:1")
    assert caught.value.message == "the first 2 results were all client errors, e.g. HTTP 400: unknown model"
    assert len(shard_output(tmp_path / "out")["errors"]) == 2


async def test_a_busy_but_healthy_server_is_not_marked_down_by_the_stall_watchdog(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1, limit=3, delay_s=0.2)  # 4x the stall check, /health answers 200
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.05),
                                    transport=fleet.transport(), progress_interval_s=0.01)
    assert summary["done"] == 6 and summary["servers"]["s0:1"]["marked_down"] == []
    assert fleet.requests["s0:1"] == 6


async def test_a_hung_server_is_marked_down_and_its_requests_go_elsewhere(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2, limit=2, delay_s={"s0:1": 0.03, "s1:1": 2.0})  # s1 silent 20x the stall check
    fleet.health["s1:1"] = lambda name: (_ for _ in ()).throw(httpx.ConnectTimeout("no answer"))
    summary = await asyncio.wait_for(
        run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(stall_check_s=0.1),
                        transport=fleet.transport(), progress_interval_s=0.01), timeout=20)
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
        await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(), transport=fleet.transport())
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
                                        transport=fleet.transport())
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
                              transport=fleet.transport())
    message = caught.value.message
    assert re.match(r"every server has been down for \d+ s; progress is saved \(0 done, 10 left\):\n", message)
    assert "  s0:1: down since " in message and "(http_502: HTTP 502: bad gateway)" in message
    assert "  s1:1: down since " in message and caught.value.shard == 0
    assert caught.value.hint == "check the servers' logs and GPUs; a retry of this task resumes where it stopped"
