"""A completion is accepted only from the launch wait_ready read: each completion's weight_version (SGLang's
metadata) must be the launch identity of the server's readback; a server replaced under a shard stops it."""

import dataclasses

import httpx
import pytest
from generate_fakes import FakeFleet, completion_body, fast_settings, read_jsonl, shard_output, write_prompts

from fleetgen.airflow.context import DETERMINISTIC_ERRORS
from fleetgen.errors import ServerReplaced
from fleetgen.generate import run_shard_async
from fleetgen.generate.chat import parse_chat_response
from fleetgen.generate.watch import EventJournal
from fleetgen.nodes import launch_identity

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

NIGHT_1 = launch_identity.launch_id("scheduled__2026-12-01T00:00:00+00:00")
NIGHT_2 = launch_identity.launch_id("scheduled__2026-12-02T00:00:00+00:00")


def answered_as(prompt_id: str, weight_version: str | None) -> httpx.Response:
    body = completion_body(prompt_id)
    if weight_version is not None:
        body["metadata"] = {"weight_version": weight_version,
                            "weight_versions": [{"version": weight_version, "start": 0, "end": 10}]}
    return httpx.Response(200, json=body)


def launched_as(fleet: FakeFleet, launch_id: str | None, limit: int = 2):
    return [dataclasses.replace(endpoint, launch_id=launch_id) for endpoint in fleet.endpoints(limit)]


def serving(fleet: FakeFleet, versions: dict[str, object]) -> None:
    """Each server answers as ``versions[name]``: an identity, or a function of its request number."""
    for name, version in versions.items():
        fleet.behaviour[name] = (lambda v: lambda prompt_id, number: answered_as(
            prompt_id, v(number) if callable(v) else v))(version)


async def test_completions_of_the_launch_wait_ready_read_are_all_accepted(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 20)
    fleet = FakeFleet(2)
    serving(fleet, {name: NIGHT_1 for name in fleet.names})
    summary = await run_shard_async(shard, launched_as(fleet, NIGHT_1), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 20 and len(shard_output(tmp_path / "out")["completions"]) == 20


async def test_a_server_replaced_mid_shard_stops_it_and_none_of_its_later_completions_is_written(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 40)
    fleet = FakeFleet(1, delay_s=0.001)
    # restarted by hand on the same port after its 5th answer: SGLang's default weight_version
    serving(fleet, {"s0:1": lambda number: NIGHT_1 if number <= 5 else launch_identity.SGLANG_DEFAULT})
    with pytest.raises(ServerReplaced) as caught:
        await run_shard_async(shard, launched_as(fleet, NIGHT_1, limit=1), tmp_path / "out", fast_settings(),
                              options=fleet.options())
    out = shard_output(tmp_path / "out")
    assert len(out["completions"]) == 5 and out["errors"] == []
    error = caught.value
    assert error.server == "s0:1" and error.shard == 0
    assert error.message == (
        "s0:1 (http://s0:1) is not the launch wait_ready read: weight_version: read "
        "'fleetgen/scheduled__2026-12-01T00:00:00+00:00', now 'default' (its completion of prompt 'p0005', not "
        "written). wait_ready read: launched by run 'scheduled__2026-12-01T00:00:00+00:00'; now: weight_version "
        "'default': started without fleetgen's launch identity (by hand or another tool). 0 request(s) in flight "
        "there abandoned, none of its completions written from now on")
    assert error.hint.startswith("the server was restarted outside fleetgen: stop it, then trigger a new run")
    [event] = [e for e in read_jsonl(tmp_path / "out" / "events" / "shard-00000.jsonl") if e["event"] == "replaced"]
    assert (event["server"], event["changes"], event["seen_in"], event["abandoned"]) == (
        "s0:1", ["weight_version: read 'fleetgen/scheduled__2026-12-01T00:00:00+00:00', now 'default'"],
        "its completion of prompt 'p0005', not written", 0)


async def test_a_shard_of_an_earlier_run_refuses_servers_another_run_relaunched(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 10)
    fleet = FakeFleet(2)
    serving(fleet, {name: NIGHT_2 for name in fleet.names})
    with pytest.raises(ServerReplaced, match="wait_ready read: launched by run 'scheduled__2026-12-01T00:00:00"
                                             "\\+00:00'; now: launched by run 'scheduled__2026-12-02") as caught:
        await run_shard_async(shard, launched_as(fleet, NIGHT_1), tmp_path / "out", fast_settings(),
                              options=fleet.options())
    assert shard_output(tmp_path / "out")["completions"] == []
    assert caught.value.hint.startswith("another run relaunched the servers after this run's wait_ready read them")
    assert isinstance(caught.value, DETERMINISTIC_ERRORS)  # a retry reads the same readback: failed at once


async def test_a_completion_without_any_weight_version_is_refused_when_the_readback_had_one(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 4)
    fleet = FakeFleet(1)
    serving(fleet, {"s0:1": None})
    with pytest.raises(ServerReplaced, match="no weight_version at all"):
        await run_shard_async(shard, launched_as(fleet, NIGHT_1, limit=1), tmp_path / "out", fast_settings(),
                              options=fleet.options())


async def test_a_server_that_reported_no_launch_identity_is_not_checked(tmp_path):
    shard = write_prompts(tmp_path / "p.jsonl", 6)
    fleet = FakeFleet(1)
    serving(fleet, {"s0:1": None})
    summary = await run_shard_async(shard, launched_as(fleet, None, limit=1), tmp_path / "out", fast_settings(),
                                    options=fleet.options())
    assert summary["done"] == 6


def test_a_completion_names_the_weight_version_in_its_metadata():
    assert parse_chat_response(answered_as("p1", NIGHT_1).content).weight_version == NIGHT_1
    assert parse_chat_response(answered_as("p1", None).content).weight_version is None
    body = completion_body("p1") | {"metadata": {"weight_version": 7}}
    assert parse_chat_response(httpx.Response(200, json=body).content).weight_version is None
    body = completion_body("p1") | {"metadata": "v1"}
    assert parse_chat_response(httpx.Response(200, json=body).content).weight_version is None


def test_a_replaced_server_is_an_event_of_the_journal():
    assert "replaced" in EventJournal.EVENT_KINDS
