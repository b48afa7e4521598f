"""The per-shard output records (generate/records.py): completion, stats and error lines."""

import re
import time
from datetime import datetime, timezone

import pytest

from fleetgen.generate import records
from fleetgen.generate.chat import ChatResult
from fleetgen.generate.records import PROMPT_FAULT, completion_record, error_record, stats_record, utc_now
from fleetgen.outputs import STATS_COLUMNS
from fleetgen.prompts.lines import Prompt

RESULT = ChatResult(content="the answer", reasoning_content="some thinking", finish_reason="length",
                    usage={"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12}, model="m-1")
CHAT = Prompt(id="p0000", messages=[{"role": "user", "content": "q"}])


def test_a_chat_prompt_keeps_its_messages_and_every_field_in_the_documented_order(monkeypatch):
    monkeypatch.setattr(records.time, "time", lambda: 1764500000.123456)
    record = completion_record(CHAT, RESULT, server="n1:30000", latency_s=1.23456, sampling={"temperature": 0.6})
    assert record == {"id": "p0000", "messages": [{"role": "user", "content": "q"}],
                      "reasoning_content": "some thinking", "content": "the answer", "finish_reason": "length",
                      "usage": RESULT.usage, "server": "n1:30000", "latency_s": 1.235, "model": "m-1",
                      "sampling": {"temperature": 0.6}, "finished_at": 1764500000.123}
    assert list(record)[0] == "id" and "prompt" not in record


def test_a_bare_prompt_is_recorded_as_prompt_and_not_as_messages():
    record = completion_record(Prompt(id="p0001", prompt="say hi"), RESULT, server="s", latency_s=0.0,
                               sampling={})
    assert record["prompt"] == "say hi" and "messages" not in record and list(record)[:2] == ["id", "prompt"]


def test_finished_at_is_wall_clock_seconds_not_milliseconds():
    before = time.time()
    finished = completion_record(CHAT, RESULT, server="s", latency_s=0.5, sampling={})["finished_at"]
    assert before - 0.01 <= finished <= time.time() + 0.01


def test_a_stats_row_counts_characters_and_keeps_zero_tokens_as_zero():
    completion = completion_record(CHAT, RESULT, server="n1:30000", latency_s=2.0, sampling={})
    row = stats_record(completion)
    assert list(row) == list(STATS_COLUMNS)
    assert row == {"id": "p0000", "prompt_tokens": 12, "completion_tokens": 0, "finish_reason": "length",
                   "reasoning_chars": len("some thinking"), "content_chars": len("the answer"),
                   "server": "n1:30000", "latency_s": 2.0, "finished_at": completion["finished_at"],
                   "reused_from": None}


def test_a_stats_row_of_a_sparse_completion_has_nones_and_zero_lengths():
    row = stats_record({"id": "p0002", "usage": None, "reasoning_content": None, "content": None,
                        "reused_from": "run-1"})
    assert row == {"id": "p0002", "prompt_tokens": None, "completion_tokens": None, "finish_reason": None,
                   "reasoning_chars": 0, "content_chars": 0, "server": None, "latency_s": None,
                   "finished_at": None, "reused_from": "run-1"}


def test_an_error_record_names_the_prompt_code_server_and_utc_time():
    record = error_record("p0003", code="context_length", message="too long", server=None, fault=PROMPT_FAULT)
    assert list(record) == ["id", "status", "error", "server", "fault", "at"]
    assert record["fault"] == "prompt"
    assert record["id"] == "p0003" and record["status"] == "failed" and record["server"] is None
    assert record["error"] == {"code": "context_length", "message": "too long"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["at"])


def test_utc_now_is_the_current_utc_second_with_a_z():
    stamp = utc_now()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    parsed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs(parsed.timestamp() - time.time()) < 2


@pytest.mark.parametrize("latency_s, kept", [(0.0004, 0.0), (0.0005, 0.001), (12.3456, 12.346)])
def test_latency_is_kept_to_the_millisecond_in_seconds(latency_s, kept):
    assert completion_record(CHAT, RESULT, server="s", latency_s=latency_s, sampling={})["latency_s"] == kept
