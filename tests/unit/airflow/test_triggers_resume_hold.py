"""wait_ready's trigger holds an early event: Airflow 3.3 fails a deferred task that resumes before the
scheduler has drained the worker's "success" for the defer exit (apache/airflow#72716), which is what a
server already up (a kept server, a fast load) would otherwise cause."""

import asyncio

import pytest

from fleetgen.airflow import triggers
from fleetgen.airflow.operators import WaitReadyOperator
from fleetgen.airflow.triggers import DEFAULT_RESUME_SETTLE_S, ReadinessTrigger

SERVER = {"node": "node0", "name": "node0:30000", "url": "http://127.0.0.1:1", "port": 30000, "gpu_ids": [0]}


class FakeClock:
    """time.monotonic and asyncio.sleep of the trigger module: time passes only when the trigger sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _trigger_ready_after(monkeypatch, clock: FakeClock, polls_until_ready: int, **kwargs) -> ReadinessTrigger:
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x.log", pid=7,
                               watch={"timeout_s": 600, "poll_s": 1.0, **kwargs})
    polls = []

    async def poll(ssh, http):
        polls.append(clock.now)
        return trigger._event("ready", server_info={}) if len(polls) >= polls_until_ready else None

    async def connect():
        return object()

    monkeypatch.setattr(trigger, "_poll", poll)
    monkeypatch.setattr(trigger, "_connect", connect)
    monkeypatch.setattr(trigger, "_drop", lambda ssh: None)
    monkeypatch.setattr(triggers.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(triggers.asyncio, "sleep", clock.sleep)
    return trigger


async def _first(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("no event")


def test_a_server_ready_at_once_is_reported_only_after_the_hold(monkeypatch):
    clock = FakeClock()
    trigger = _trigger_ready_after(monkeypatch, clock, polls_until_ready=1, resume_settle_s=15.0)
    started = clock.now
    event = asyncio.run(_first(trigger))
    assert event["status"] == "ready"
    assert clock.sleeps == [15.0] and clock.now - started == 15.0


def test_a_server_ready_after_the_hold_is_reported_without_waiting_more(monkeypatch):
    clock = FakeClock()
    trigger = _trigger_ready_after(monkeypatch, clock, polls_until_ready=20, resume_settle_s=15.0)
    event = asyncio.run(_first(trigger))
    assert event["status"] == "ready"
    assert clock.sleeps == [1.0] * 19  # the poll pauses only: no hold once 15 s have passed


def test_part_of_the_hold_already_spent_polling_is_not_waited_again(monkeypatch):
    clock = FakeClock()
    trigger = _trigger_ready_after(monkeypatch, clock, polls_until_ready=5, resume_settle_s=15.0)
    asyncio.run(_first(trigger))
    assert clock.sleeps == [1.0, 1.0, 1.0, 1.0, 11.0]


def test_the_hold_defaults_on_and_survives_serialisation():
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x.log", pid=7,
                               watch={"timeout_s": 600})
    assert trigger.watch.resume_settle_s == DEFAULT_RESUME_SETTLE_S >= 10
    _, kwargs = trigger.serialize()
    settled = ReadinessTrigger(**{**kwargs, "watch": {**kwargs["watch"], "resume_settle_s": 2.5}})
    assert settled.serialize()[1]["watch"]["resume_settle_s"] == 2.5
    assert ReadinessTrigger(**kwargs).watch.resume_settle_s == DEFAULT_RESUME_SETTLE_S


@pytest.mark.parametrize(("given", "expected"), [(None, DEFAULT_RESUME_SETTLE_S), ("0", 0.0), (0, 0.0), ("7.5", 7.5)])
def test_the_operator_passes_the_deployments_setting_or_the_default(given, expected):
    launched = {**SERVER, "ssh_conn_id": "node0", "log_path": "/x.log", "pid": 7}
    fleet = {"nodes": [{"name": "node0", "ssh_conn_id": "node0", "address": "127.0.0.1", "gpus": [0]}],
             "model": {"path": "/models/m"}, "server": {}}
    operator = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=fleet, timeout_s=600,
                                 resume_settle_s=given)
    assert operator._trigger(launched, 0).watch.resume_settle_s == expected
