"""A completion is accepted only from the launch wait_ready read: the shard re-reads each server's /server_info
before sending anything, before a returning server's trial request and every launch_check_s, and a server that is
another launch (another run's, or restarted by hand from our own command line) stops the shard."""

import asyncio
import contextlib
import dataclasses

import httpx
import pytest
from generate_fakes import FakeFleet, completion_body, fast_settings, read_jsonl, shard_output, write_prompts

from fleetgen.errors import ServerReplaced
from fleetgen.generate import run_shard_async
from fleetgen.nodes import launch_identity, readiness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

NIGHT_1 = launch_identity.launch_id("night-1")
NIGHT_2 = launch_identity.launch_id("night-2")
PLAN = {"--max-running-requests": 71, "--mem-fraction-static": 0.83}


def server_info(model_path: str = "/models/a", identity: str = NIGHT_1, cap: int = 71, **more) -> dict:
    return {"model_path": model_path, "weight_version": identity, "max_running_requests": cap,
            "mem_fraction_static": 0.83, "internal_states": [{"last_gen_throughput": 800.0}], **more}


def read_at_wait_ready(fleet: FakeFleet, info: dict, limit: int) -> list:
    fields = readiness.launch_fields(info, PLAN)
    return [dataclasses.replace(endpoint, launch_id=fields["weight_version"], launch_fields=fields)
            for endpoint in fleet.endpoints(limit)]


def answered_by(identity: str, prompt_id: str) -> httpx.Response:
    return httpx.Response(200, json={**completion_body(prompt_id), "metadata": {"weight_version": identity}})


async def test_a_server_restarted_by_hand_from_our_command_line_is_caught_by_the_periodic_check(tmp_path):
    """Another checkpoint and --max-running-requests 4, our --weight-version copied from ps: its completions name
    the right launch, so only /server_info tells. No down/up cycle: the periodic re-read catches it."""
    shard = write_prompts(tmp_path / "p.jsonl", 30)
    fleet = FakeFleet(1)
    replaced_after = 6
    fleet.server_info["s0:1"] = lambda name: server_info() if fleet.requests[name] <= replaced_after else \
        server_info("/models/b", cap=4)

    async def answer(prompt_id, number):
        if number == replaced_after + 1:  # the new server's first request: held until the check abandons it (capped)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.Event().wait(), 5.0)
        return answered_by(NIGHT_1, prompt_id)

    fleet.behaviour["s0:1"] = answer
    with pytest.raises(ServerReplaced) as caught:
        await run_shard_async(shard, read_at_wait_ready(fleet, server_info(), limit=1), tmp_path / "out",
                              fast_settings(launch_check_s=0.05), options=fleet.options())
    assert [record["id"] for record in shard_output(tmp_path / "out")["completions"]] == \
        [f"p{number:04d}" for number in range(replaced_after)]
    error = caught.value
    assert error.server == "s0:1" and error.shard == 0
    assert error.message == (
        "s0:1 (http://s0:1) is not the launch wait_ready read: model_path: read '/models/a', now '/models/b'; "
        "max_running_requests: read 71, now 4 (its /server_info). wait_ready read: '/models/a', launched by run "
        "'night-1'; now: '/models/b', launched by run 'night-1'. 1 request(s) in flight there abandoned, none of "
        "its completions written from now on")
    assert error.hint.startswith("the server was restarted outside fleetgen: stop it, then trigger a new run")
    [event] = [e for e in read_jsonl(tmp_path / "out" / "events" / "shard-00000.jsonl") if e["event"] == "replaced"]
    assert (event["changes"], event["seen_in"], event["abandoned"]) == (
        ["model_path: read '/models/a', now '/models/b'", "max_running_requests: read 71, now 4"],
        "its /server_info", 1)


async def test_a_shard_of_an_old_run_refuses_servers_another_run_relaunched_before_sending_anything(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2)
    for name in fleet.names:
        fleet.server_info[name] = server_info(identity=NIGHT_2)
        fleet.behaviour[name] = lambda prompt_id, number: answered_by(NIGHT_2, prompt_id)
    with pytest.raises(ServerReplaced) as caught:
        await run_shard_async(shard, read_at_wait_ready(fleet, server_info(identity=NIGHT_1), limit=2),
                              tmp_path / "out", fast_settings(), options=fleet.options())
    assert sum(fleet.requests.values()) == 0 and shard_output(tmp_path / "out")["completions"] == []
    assert ("weight_version: read 'fleetgen/night-1', now 'fleetgen/night-2' (its /server_info). wait_ready read: "
            "'/models/a', launched by run 'night-1'; now: '/models/a', launched by run 'night-2'") in caught.value.message
    assert "a shard of an old run is re-run by a new run" in caught.value.hint


async def test_a_server_kept_from_an_earlier_run_is_accepted_by_the_run_that_read_it(tmp_path):
    """stop_servers kept night 1's server for night 2: night 2's wait_ready read it as it is, so it is accepted;
    what changes while it serves (its throughput) is no sign of another launch."""
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(1, delay_s=0.005)
    fleet.server_info["s0:1"] = lambda name: server_info(identity=NIGHT_1,
                                                         last_gen_throughput=float(fleet.requests[name]))
    fleet.behaviour["s0:1"] = lambda prompt_id, number: answered_by(NIGHT_1, prompt_id)
    summary = await run_shard_async(shard, read_at_wait_ready(fleet, server_info(identity=NIGHT_1), limit=2),
                                    tmp_path / "out", fast_settings(launch_check_s=0.01), options=fleet.options())
    assert summary["done"] == 20 and len(shard_output(tmp_path / "out")["completions"]) == 20
    assert fleet.info_reads["s0:1"] >= 2  # at the start, and at least once while it served


async def test_a_server_back_up_as_another_launch_stops_the_shard_before_its_trial_request(tmp_path):
    """Marked down, then back up (/health 200) as another checkpoint: its trial request is never sent."""
    shard = write_prompts(tmp_path / "p.jsonl", 300)
    fleet = FakeFleet(2, delay_s={"s0:1": 0.001, "s1:1": 0.01})
    went_down_at = 4
    fleet.server_info["s0:1"] = lambda name: server_info() if fleet.requests[name] < went_down_at else \
        server_info("/models/b", cap=4)
    fleet.server_info["s1:1"] = server_info()
    fleet.behaviour["s1:1"] = lambda prompt_id, number: answered_by(NIGHT_1, prompt_id)

    def s0(prompt_id, number):
        if number == went_down_at:
            raise httpx.ConnectError("connection refused")
        return answered_by(NIGHT_1, prompt_id)  # back up after its restart: it would answer

    fleet.behaviour["s0:1"] = s0
    with pytest.raises(ServerReplaced) as caught:
        await run_shard_async(shard, read_at_wait_ready(fleet, server_info(), limit=1), tmp_path / "out",
                              fast_settings(), options=fleet.options())
    assert fleet.requests["s0:1"] == went_down_at  # no trial request went to the new launch
    assert caught.value.server == "s0:1" and "0 request(s) in flight there abandoned" in caught.value.message
    written_by = {record["server"] for record in shard_output(tmp_path / "out")["completions"]}
    assert len(shard_output(tmp_path / "out")["completions"]) < 300 and written_by <= {"s0:1", "s1:1"}

