"""Server health shared between the shards of a run (generate/health.py)."""

import asyncio
import json
import logging

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output

from fleetgen.generate import run_shard_async
from fleetgen.generate.health import SharedHealth
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import plan_shards

pytestmark = pytest.mark.anyio


def two_shards(path, count=120):
    with path.open("w") as handle:
        for number in range(count):
            handle.write(json.dumps({"id": f"p{number:04d}", "messages": [{"role": "user", "content": f"q {number}"}]})
                         + "\n")
    return plan_shards(path, shard_size=count // 2)




class HungFleet(FakeFleet):
    """FakeFleet whose ``hung`` server stops answering (health included) after ``after`` requests."""

    def __init__(self, *args, hung: str, after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hung, self.after = hung, after

    async def handle(self, request):
        name = f"{request.url.host}:{request.url.port}"
        if name == self.hung and (request.url.path == "/health" or self.requests[name] >= self.after):
            if request.url.path != "/health":
                self.requests[name] += 1
            read_timeout = request.extensions["timeout"]["read"]  # MockTransport itself has no timeouts
            try:
                async with asyncio.timeout(read_timeout):
                    await asyncio.sleep(3600)
            except TimeoutError:
                raise httpx.ReadTimeout(f"no answer within {read_timeout} s", request=request) from None
        return await super().handle(request)


def servers_health(out):
    return json.loads(RunLayout(out).servers_health.read_text())["servers"]


async def test_a_shard_that_starts_after_a_server_hung_sends_it_nothing(tmp_path):
    first, second = two_shards(tmp_path / "p.jsonl")
    fleet = HungFleet(2, hung="s1:1", after=5)
    settings = fast_settings(stall_check_s=0.3, health_timeout_s=0.2, request_timeout_s=600.0)
    await run_shard_async(first, fleet.endpoints(), tmp_path / "out", settings, transport=fleet.transport())
    assert servers_health(tmp_path / "out")["s1:1"]["state"] == "down"
    sent_before = fleet.requests["s1:1"]
    summary = await run_shard_async(second, fleet.endpoints(), tmp_path / "out", settings,
                                    transport=fleet.transport())
    assert fleet.requests["s1:1"] == sent_before  # not one request to the hung server
    assert summary["done"] == 60 and len(shard_output(tmp_path / "out", 1)["completions"]) == 60
    reason = summary["servers"]["s1:1"]["marked_down"][0]["reason"]
    assert reason.startswith("marked down by shard 0: stalled: no answer for"), reason


async def test_running_shards_abandon_a_server_another_shard_found_hung(tmp_path):
    first, second = two_shards(tmp_path / "p.jsonl", 200)
    fleet = HungFleet(2, hung="s1:1", after=6, delay_s=0.01)
    watchful = fast_settings(stall_check_s=0.3, health_timeout_s=0.2, request_timeout_s=600.0)
    # The second shard alone would wait out 10 minutes: only the first shard's finding frees it.
    patient = fast_settings(stall_check_s=600.0, health_timeout_s=0.2, request_timeout_s=600.0)
    summaries = await asyncio.wait_for(asyncio.gather(
        run_shard_async(first, fleet.endpoints(), tmp_path / "out", watchful, transport=fleet.transport()),
        run_shard_async(second, fleet.endpoints(), tmp_path / "out", patient, transport=fleet.transport())), 60)
    assert [s["done"] for s in summaries] == [100, 100]
    held = summaries[1]["servers"]["s1:1"]
    assert held["marked_down"][0]["reason"].startswith("marked down by shard 0: stalled"), held
    assert held["retried"] >= 1  # what it held on the hung server was sent elsewhere


async def test_a_server_found_back_up_is_marked_up_for_every_shard(tmp_path, caplog):
    [shard] = two_shards(tmp_path / "p.jsonl", 40)[:1]
    out = tmp_path / "out"
    SharedHealth(out, who="shard 9 (try 1)", log=logging.getLogger("test")).publish("s1:1", "down",
                                                                                    "connection: refused")
    fleet = FakeFleet(2, delay_s=0.01)
    with caplog.at_level(logging.WARNING):
        summary = await run_shard_async(shard, fleet.endpoints(), out, fast_settings(), transport=fleet.transport())
    server = summary["servers"]["s1:1"]
    assert server["marked_down"][0]["reason"] == "marked down by shard 9 (try 1): connection: refused"
    assert len(server["recovered"]) == 1 and server["completed"] > 0
    entry = servers_health(out)["s1:1"]
    assert entry["state"] == "up" and entry["by"] == "shard 0"


async def test_an_unreadable_health_file_is_ignored_with_a_warning(tmp_path, caplog):
    [shard] = two_shards(tmp_path / "p.jsonl", 40)[:1]
    (tmp_path / "out").mkdir()
    RunLayout(tmp_path / "out").servers_health.write_text('{"servers": {"s1:1": {"state": "do')
    fleet = FakeFleet(2)
    with caplog.at_level(logging.WARNING):
        summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out", fast_settings(),
                                        transport=fleet.transport())
    assert summary["done"] == 20 and fleet.requests["s1:1"] > 0
    assert f"ignoring an unreadable {RunLayout(tmp_path / 'out').servers_health}" in caplog.text


async def test_health_sharing_can_be_turned_off(tmp_path):
    [shard] = two_shards(tmp_path / "p.jsonl", 40)[:1]
    SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("test")).publish("s1:1", "down", "x")
    fleet = FakeFleet(2)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(share_server_health=False), transport=fleet.transport())
    assert not summary["servers"]["s1:1"]["marked_down"]


def test_a_hung_server_is_flagged_as_such_for_the_other_shards_and_a_plain_down_one_is_not(tmp_path):
    writer = SharedHealth(tmp_path, who="shard 0", log=logging.getLogger("w"))
    reader = SharedHealth(tmp_path, who="shard 1", log=logging.getLogger("r"))
    writer.publish("a:1", "down", "no answer for 61 s with 2 request(s) in flight", hung=True)
    writer.publish("b:1", "down", "stalled: HTTP 502 (a reason's words decide nothing)")
    entries = reader.changed_entries()
    assert (entries["a:1"].hung, entries["b:1"].hung) == (True, False)
    assert servers_health(tmp_path)["a:1"]["hung"] is True and "hung" not in servers_health(tmp_path)["b:1"]
