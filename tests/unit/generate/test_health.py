"""Server health shared between the shards of a run (generate/health.py)."""

import asyncio
import fcntl
import json
import logging
import os
import threading
import time

import httpx
import pytest

from generate_fakes import FakeFleet, fast_settings, shard_output

from fleetgen.generate import run_shard_async
from fleetgen.generate.health import HealthEntry, SharedHealth
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
    await run_shard_async(first, fleet.endpoints(), tmp_path / "out", settings, options=fleet.options())
    assert servers_health(tmp_path / "out")["s1:1"]["state"] == "down"
    sent_before = fleet.requests["s1:1"]
    summary = await run_shard_async(second, fleet.endpoints(), tmp_path / "out", settings, options=fleet.options())
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
        run_shard_async(first, fleet.endpoints(), tmp_path / "out", watchful, options=fleet.options()),
        run_shard_async(second, fleet.endpoints(), tmp_path / "out", patient, options=fleet.options())), 60)
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
        summary = await run_shard_async(shard, fleet.endpoints(), out, fast_settings(), options=fleet.options())
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
                                        options=fleet.options())
    assert summary["done"] == 20 and fleet.requests["s1:1"] > 0
    assert f"ignoring an unreadable {RunLayout(tmp_path / 'out').servers_health}" in caplog.text


async def test_health_sharing_can_be_turned_off(tmp_path):
    [shard] = two_shards(tmp_path / "p.jsonl", 40)[:1]
    SharedHealth(tmp_path / "out", who="shard 9", log=logging.getLogger("test")).publish("s1:1", "down", "x")
    fleet = FakeFleet(2)
    summary = await run_shard_async(shard, fleet.endpoints(), tmp_path / "out",
                                    fast_settings(share_server_health=False), options=fleet.options())
    assert not summary["servers"]["s1:1"]["marked_down"]


def test_a_hung_server_is_flagged_as_such_for_the_other_shards_and_a_plain_down_one_is_not(tmp_path):
    writer = SharedHealth(tmp_path, who="shard 0", log=logging.getLogger("w"))
    reader = SharedHealth(tmp_path, who="shard 1", log=logging.getLogger("r"))
    writer.publish("a:1", "down", "no answer for 61 s with 2 request(s) in flight", hung=True)
    writer.publish("b:1", "down", "stalled: HTTP 502 (a reason's words decide nothing)")
    entries = reader.changed_entries()
    assert (entries["a:1"].hung, entries["b:1"].hung) == (True, False)
    assert servers_health(tmp_path)["a:1"]["hung"] is True and "hung" not in servers_health(tmp_path)["b:1"]


# The shared file itself, without a shard around it.

def health(path, who="shard 0", name="health"):
    return SharedHealth(path, who=who, log=logging.getLogger(name))


def test_two_servers_marked_down_by_two_shards_are_both_kept_with_who_saw_each(tmp_path):
    health(tmp_path, "shard 0 (try 1)").publish("a:1", "down", "connection: refused")
    health(tmp_path, "shard 1 (try 2)").publish("b:1", "down", "stalled: no answer", hung=True)
    entries = health(tmp_path, "shard 2").changed_entries()
    assert set(entries) == {"a:1", "b:1"}
    assert (entries["a:1"].state, entries["a:1"].by, entries["a:1"].reason, entries["a:1"].hung) == (
        "down", "shard 0 (try 1)", "connection: refused", False)
    assert (entries["b:1"].state, entries["b:1"].by, entries["b:1"].reason, entries["b:1"].hung) == (
        "down", "shard 1 (try 2)", "stalled: no answer", True)


def test_a_later_transition_of_a_server_replaces_its_entry_and_leaves_the_others(tmp_path):
    first, second = health(tmp_path, "shard 0"), health(tmp_path, "shard 1")
    down_at = first.publish("a:1", "down", "refused")
    first.publish("b:1", "down", "refused")
    up_at = second.publish("a:1", "up", "health and a trial request answered")
    assert up_at >= down_at
    servers = servers_health(tmp_path)
    assert servers["a:1"] == {"state": "up", "at": up_at, "reason": "health and a trial request answered",
                              "by": "shard 1"}
    assert servers["b:1"]["state"] == "down" and servers["b:1"]["by"] == "shard 0"


def test_a_transition_is_stamped_with_wall_clock_seconds(tmp_path):
    before = time.time()
    at = health(tmp_path).publish("a:1", "down", "x")
    assert before <= at <= time.time()  # seconds since the epoch, not milliseconds nor a monotonic clock
    assert servers_health(tmp_path)["a:1"]["at"] == at
    assert health(tmp_path).changed_entries()["a:1"].at == at


def test_publishing_leaves_one_whole_file_and_its_lock_and_no_partial_file(tmp_path):
    out = tmp_path / "not" / "yet"
    health(out).publish("a:1", "down", "x")
    layout = RunLayout(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([layout.servers_health.name,
                                                            layout.servers_health_lock.name])


def test_the_file_is_read_again_only_when_it_changed(tmp_path):
    writer, reader = health(tmp_path, "shard 0"), health(tmp_path, "shard 1")
    assert reader.changed_entries() is None  # no file yet: nothing known
    writer.publish("a:1", "down", "x")
    assert set(reader.changed_entries()) == {"a:1"}
    assert reader.changed_entries() is None
    writer.publish("a:1", "up", "x")  # the same size: the file is a new one all the same
    assert reader.changed_entries()["a:1"].state == "up"
    assert reader.changed_entries() is None


def test_a_file_that_changed_in_place_is_read_again(tmp_path):
    writer, reader = health(tmp_path, "shard 0"), health(tmp_path, "shard 1")
    writer.publish("a:1", "down", "x")
    reader.changed_entries()
    path = RunLayout(tmp_path).servers_health
    stat = path.stat()
    path.write_text(path.read_text().replace('"down"', '"up"'))  # same inode and mtime, another size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert reader.changed_entries()["a:1"].state == "up"
    path.write_text(path.read_text().replace('"x"', '"y"'))  # same inode and size, another mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert reader.changed_entries()["a:1"].reason == "y"


def test_one_bad_entry_does_not_hide_the_others(tmp_path):
    RunLayout(tmp_path).servers_health.write_text(json.dumps({"servers": {
        "a:1": {"state": "sideways", "at": 1.0}, "b:1": {"at": 1.0}, "c:1": {"state": "down", "at": "soon"},
        "d:1": {"state": "down", "at": None}, "e:1": "down",
        "f:1": {"state": "down", "at": "1764500000.5"}}}))
    entries = health(tmp_path).changed_entries()
    assert list(entries) == ["f:1"]
    assert entries["f:1"] == HealthEntry(state="down", at=1764500000.5, reason="", by="?", hung=False)


@pytest.mark.parametrize("hung", [1, "true", "yes", None, False])
def test_only_json_true_marks_a_server_hung(tmp_path, hung):
    entry = HealthEntry.from_json({"state": "down", "at": 1, "hung": hung, "reason": 5, "by": 7})
    assert entry.hung is False and entry.reason == "5" and entry.by == "7" and entry.at == 1.0
    assert HealthEntry.from_json({"state": "up", "at": 2, "hung": True}).hung is True


@pytest.mark.parametrize("content", ['{"servers": ["a:1"]}', '["servers"]', "{", '{"servers": {"a:1": {"sta'])
def test_an_unreadable_file_reads_as_nothing_known_and_is_warned_about_once(tmp_path, caplog, content):
    path = RunLayout(tmp_path).servers_health
    path.write_text(content)
    reader = health(tmp_path, "shard 4")
    with caplog.at_level(logging.WARNING, logger="health"):
        assert reader.changed_entries() == {}
        os.utime(path, ns=(1, 1))
        assert reader.changed_entries() == {}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith(f"shard 4: ignoring an unreadable {path} (")
    assert "(servers is not an object)" in warnings[0] or content != '{"servers": ["a:1"]}'
    assert "()" not in warnings[0] and "(None)" not in warnings[0]  # the cause is named
    assert warnings[0].endswith("); it is rewritten at the next change")


def test_a_writer_replaces_an_unreadable_file_with_its_own_entry(tmp_path):
    RunLayout(tmp_path).servers_health.write_text('{"servers": ')
    health(tmp_path).publish("a:1", "down", "x")
    assert list(servers_health(tmp_path)) == ["a:1"]


def test_a_file_without_servers_reads_as_nothing_known_without_a_warning(tmp_path, caplog):
    RunLayout(tmp_path).servers_health.write_text("{}")
    with caplog.at_level(logging.WARNING, logger="health"):
        assert health(tmp_path).changed_entries() == {}
    assert not caplog.records


def test_a_failure_to_write_is_logged_and_the_shard_goes_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = health(blocker / "out", "shard 3")
    with caplog.at_level(logging.WARNING, logger="health"):
        at = writer.publish("a:1", "down", "refused")
    assert abs(at - time.time()) < 5
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"shard 3: could not record server a:1 as down in {writer.path} (")
    assert message.endswith("); other shards will find out for themselves")
    assert "Not a directory" in message  # the cause is named


def test_writers_take_the_lock_for_their_read_modify_write(tmp_path):
    writer = health(tmp_path, "shard 0")
    writer.publish("a:1", "down", "x")
    with open(RunLayout(tmp_path).servers_health_lock, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        done = threading.Event()
        other = threading.Thread(target=lambda: (health(tmp_path, "shard 1").publish("b:1", "down", "y"),
                                                 done.set()))
        other.start()
        assert not done.wait(0.1)  # the second writer waits for the lock
    other.join(5)
    assert done.is_set() and set(servers_health(tmp_path)) == {"a:1", "b:1"}


def test_on_an_object_store_a_transition_is_written_off_the_callers_thread_in_order(object_store, monkeypatch):
    from fleetgen.storage.run_files import ObjectRunFiles

    files = ObjectRunFiles(object_store)
    writer = SharedHealth(files, who="shard 0 (try 1)", log=logging.getLogger("test"))
    gate, callers = threading.Event(), []
    update = files.update

    def held_update(name, change):  # the store answers only once the gate opens
        callers.append(threading.current_thread().name)
        gate.wait(10)
        update(name, change)

    monkeypatch.setattr(files, "update", held_update)
    started = time.monotonic()
    writer.publish("a:1", "down", "refused")
    writer.publish("a:1", "up", "health and a trial request answered")
    assert time.monotonic() - started < 1  # the caller did not wait on the store
    gate.set()
    writer.close()  # waits until what was published is written
    assert json.loads(object_store.get("servers-health.json"))["servers"]["a:1"]["state"] == "up"
    assert callers == ["servers-health-writer"] * 2
    reader = SharedHealth(files, who="shard 1 (try 1)", log=logging.getLogger("test"))
    try:
        deadline = time.monotonic() + 10
        while (entries := reader.changed_entries()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert entries["a:1"].state == "up" and entries["a:1"].by == "shard 0 (try 1)"
    finally:
        reader.close()
