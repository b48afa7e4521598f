"""wait_ready's trigger hands the calibration SGLang's pre-load memory line even when the server logged dozens of
lines after it (the real server logs the warm-up and one line per health check before it is ready)."""

import asyncio
from types import SimpleNamespace

from fleetgen.airflow.triggers import ReadinessTrigger
from fleetgen.nodes.remote import ALIVE_MARK

SERVER = {"node": "node0", "name": "node0:30000", "url": "http://127.0.0.1:1", "port": 30000, "gpu_ids": [0]}
LOAD_LINE = "[2026-12-01 14:51:26] Load weight begin. avail mem=21.60 GB"


def _tail(lines: list[str]) -> SimpleNamespace:
    return SimpleNamespace(stdout="\n".join(lines) + f"\n{ALIVE_MARK}1\n", exit_status=0)


class FakeSSH:
    def __init__(self, outputs):
        self.outputs = list(outputs)

    async def run(self, command, check=False):
        return self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]


def _ready_event(outputs, ready_at_poll: int) -> dict:
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x.log", pid=7, watch={"timeout_s": 600})
    ssh, polls = FakeSSH(outputs), []

    async def probe(http):
        polls.append(1)
        return {"version": "0.5.23"} if len(polls) >= ready_at_poll else None

    trigger._probe_http = probe

    async def until_ready():
        for _ in range(ready_at_poll):
            event = await trigger._poll(ssh, None)
            if event is not None:
                return event.payload
        raise AssertionError("never ready")

    return asyncio.run(until_ready())


def test_the_load_line_seen_in_an_early_tail_reaches_the_ready_event():
    early = ["[..] Init parallel ends.", LOAD_LINE, "[..] Load weight end. elapsed=0.03 s"]
    later = ['[..] INFO:     127.0.0.1:4711 - "GET /health HTTP/1.1" 503' for _ in range(60)]
    event = _ready_event([_tail(early), _tail(later), _tail(later)], ready_at_poll=3)
    assert event["status"] == "ready"
    assert event["log_tail"][0] == LOAD_LINE and event["log_tail"][1:] == later[-5:]


def test_the_newest_load_line_wins_after_a_relaunch_in_the_same_log():
    second = LOAD_LINE.replace("21.60", "20.10")
    event = _ready_event([_tail([LOAD_LINE]), _tail([second, "[..] fired up"])], ready_at_poll=2)
    assert event["log_tail"][0] == second


def test_a_log_without_the_line_gives_only_the_tail():
    event = _ready_event([_tail(["[..] The server is fired up and ready to roll!"])], ready_at_poll=1)
    assert event["log_tail"] == ["[..] The server is fired up and ready to roll!"]
