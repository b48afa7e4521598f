"""A run's completions, error records and rejects as OpenAI Batch API output and error files: every response body
read by the openai package's own ChatCompletion type, every prompt in exactly one file, the same bytes on a rewrite."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion

from fleetgen.errors import OutputError
from fleetgen.generate import jsonio
from fleetgen.generate.chat import ChatResult
from fleetgen.generate.records import PROMPT_FAULT, SERVER_FAULT, completion_record, error_record
from fleetgen.outputs import RunLayout
from fleetgen.prompts.lines import Prompt
from fleetgen.report import batch_output
from fleetgen.report.batch_output import REJECTED_CODE, write_batch_files

USAGE = {"prompt_tokens": 12, "total_tokens": 52, "completion_tokens": 40, "prompt_tokens_details": None,
         "reasoning_tokens": 30}


def _completion(prompt_id, *, reasoning="Let me think.", finish_reason="stop", **extra):
    prompt = Prompt(id=prompt_id, messages=[{"role": "user", "content": "Explain KV caches."}])
    result = ChatResult(content=f"answer to {prompt_id}", reasoning_content=reasoning, finish_reason=finish_reason,
                        usage=dict(USAGE), model="qwen3-8b")
    return {**completion_record(prompt, result, server="node0:30000", latency_s=1.5,
                                sampling={"max_tokens": 64, "temperature": 0.6, "top_p": 0.95}), **extra}


def _write(path, records, tail=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(jsonio.dumps(record) + b"\n" for record in records) + tail)


@pytest.fixture
def run(tmp_path):
    """Two shards: a reasoning answer, one without a trace, one cut at max_tokens, one reused from an earlier run;
    a prompt written off (its own fault), one failed by the server then answered by a retry, and a scan reject."""
    layout = RunLayout(tmp_path / "night-1")
    _write(layout.shard_file("completions", 0), [_completion("a"), _completion("b", reasoning=None)])
    _write(layout.shard_file("completions", 1), [_completion("c", finish_reason="length"),
                                                 _completion("d", reused_from="night-0"), _completion("e")])
    _write(layout.shard_file("errors", 0), [
        error_record("f", code="http_400", message="HTTP 400: input too long", server="node0:30000",
                     fault=PROMPT_FAULT)])
    _write(layout.shard_file("errors", 1), [
        error_record("e", code="attempts_exhausted", message="timed out", server="node0:30000", fault=SERVER_FAULT)])
    _write(layout.rejects, [{"line": 7, "id": "g", "error": "body.n is 2: fleetgen generates one answer a request "
                                                            "(n = 1)"}])
    return layout


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_completion_is_a_response_whose_body_the_openai_chat_completion_type_reads(run):
    written = write_batch_files(run)
    assert (written.responses, written.failed, written.unreadable) == (5, 2, 0)
    assert (written.output, written.errors) == (str(run.batch_output), str(run.batch_errors))
    lines = _lines(run.batch_output)
    assert [line["custom_id"] for line in lines] == ["a", "b", "c", "d", "e"]
    for line, source in zip(lines, [_completion(x) for x in "abcde"]):
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        response = line["response"]
        assert set(response) == {"status_code", "request_id", "body"} and response["status_code"] == 200
        body = ChatCompletion.model_validate(response["body"])
        assert body.object == "chat.completion" and body.model == "qwen3-8b" and len(body.choices) == 1
        assert body.choices[0].message.content == f"answer to {line['custom_id']}"
        assert body.usage.completion_tokens == 40 and body.usage.prompt_tokens == 12 and body.usage.total_tokens == 52
        assert response["body"]["usage"] == USAGE  # SGLang's usage as it came, reasoning_tokens included
        assert abs(body.created - source["finished_at"]) < 60
    by_id = {line["custom_id"]: line["response"]["body"]["choices"][0] for line in lines}
    # the trace as SGLang returned it: a string, or null without a reasoning parser's output
    assert by_id["a"]["message"]["reasoning_content"] == "Let me think."
    assert by_id["b"]["message"] == {"role": "assistant", "content": "answer to b", "reasoning_content": None}
    assert ChatCompletion.model_validate(lines[0]["response"]["body"]).choices[0].message.reasoning_content == \
        "Let me think."
    assert by_id["c"]["finish_reason"] == "length" and by_id["a"]["finish_reason"] == "stop"


def test_the_prompts_without_a_completion_are_the_error_file_each_with_its_code(run):
    write_batch_files(run)
    errors = _lines(run.batch_errors)
    # the reject first (the scan's), then the generation's; "e" failed once and was answered by the retry
    assert [line["custom_id"] for line in errors] == ["g", "f"]
    assert errors[0]["error"] == {"code": REJECTED_CODE, "message": "line 7 of the prompts file: body.n is 2: "
                                                                    "fleetgen generates one answer a request (n = 1)"}
    assert errors[1]["error"] == {"code": "http_400", "message": "HTTP 400: input too long"}
    assert all(line["response"] is None and set(line) == {"id", "custom_id", "response", "error"} for line in errors)
    answered = {line["custom_id"] for line in _lines(run.batch_output)}
    assert answered.isdisjoint(line["custom_id"] for line in errors)


def test_ids_are_one_per_prompt_and_run_and_a_rewrite_gives_the_same_bytes(run, tmp_path):
    write_batch_files(run)
    first = run.batch_output.read_bytes(), run.batch_errors.read_bytes()
    write_batch_files(run)
    assert (run.batch_output.read_bytes(), run.batch_errors.read_bytes()) == first
    lines = _lines(run.batch_output) + _lines(run.batch_errors)
    ids = [line["id"] for line in lines]
    assert len(set(ids)) == len(ids) == 7 and all(i.startswith("batch_req_") for i in ids)
    responses = [line["response"] for line in lines if line["response"]]
    assert len({r["request_id"] for r in responses}) == len({r["body"]["id"] for r in responses}) == 5
    other = RunLayout(tmp_path / "night-2")
    _write(other.shard_file("completions", 0), [_completion("a")])
    write_batch_files(other)
    assert _lines(other.batch_output)[0]["id"] != _lines(run.batch_output)[0]["id"]


def test_a_torn_last_line_is_counted_and_in_neither_file(run):
    path = run.shard_file("completions", 1)
    path.write_bytes(path.read_bytes() + b'{"id": "h", "messages": [{"ro')
    written = write_batch_files(run)
    assert (written.responses, written.unreadable) == (5, 1)
    assert "h" not in {line["custom_id"] for line in _lines(run.batch_output) + _lines(run.batch_errors)}


def test_a_write_that_fails_leaves_the_previous_files_whole_and_no_partial(run, monkeypatch):
    write_batch_files(run)
    before = run.batch_output.read_bytes()
    calls = []

    def fail_on_the_third(record):
        calls.append(record)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return jsonio.dumps(record)

    monkeypatch.setattr(batch_output.jsonio, "dumps", fail_on_the_third)
    with pytest.raises(OutputError) as caught:
        write_batch_files(run)
    assert caught.value.path == str(run.batch_output) and caught.value.errno == 28
    assert "No space left on device" in caught.value.message and "output_root" in caught.value.hint
    assert run.batch_output.read_bytes() == before
    assert sorted(p.name for p in run.batch_output.parent.iterdir()) == ["errors.jsonl", "output.jsonl"]


def test_a_run_without_errors_or_rejects_has_an_empty_error_file(tmp_path):
    layout = RunLayout(tmp_path / "clean")
    _write(layout.shard_file("completions", 0), [_completion("a")])
    written = write_batch_files(layout)
    assert (written.responses, written.failed) == (1, 0) and layout.batch_errors.read_bytes() == b""
