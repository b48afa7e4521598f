"""An OpenAI Batch API input file read as prompts: recognised once per file, mapped onto fleetgen's record (the same
checks, plan figures, identity hash and resume), every refusal named with its line."""

import json

import pytest
from prompt_files import chat, write_lines

from fleetgen.errors import PromptsError
from fleetgen.generate.reuse import prompt_hash
from fleetgen.prompts.batch_api import BATCH_FORMAT
from fleetgen.prompts.length import LengthLimit
from fleetgen.prompts.lines import FLEETGEN_FORMAT, parse_line, read_line
from fleetgen.prompts.planned import iter_shard, read_planned_prompts
from fleetgen.prompts.scan import plan_shards, scan_prompts

USER = [{"role": "user", "content": "Explain KV caches."}]


def request(custom_id, *, url="/v1/chat/completions", method="POST", **body):
    body.setdefault("prompt" if url == "/v1/completions" else "messages",
                    "Explain KV caches." if url == "/v1/completions" else USER)
    return {"custom_id": custom_id, "method": method, "url": url, "body": {"model": "gpt-4o-mini", **body}}


def _rejects(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_file_is_recognised_and_each_request_mapped_onto_its_prompt(tmp_path):
    path = write_lines(tmp_path / "batch.jsonl", [
        request("chat-1", max_completion_tokens=300, temperature=0.2, top_p=0.9, stop=["\n\n"], seed=7,
                presence_penalty=0.5, frequency_penalty=0.1, top_k=20, min_p=0.05, repetition_penalty=1.1,
                n=1, stream=False, logprobs=False, user="u-1", metadata={"a": "b"}, store=False),
        request("completion-1", url="/v1/completions", max_tokens=50, temperature=None),
    ])
    scan = scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl")
    assert (scan.format, scan.count, scan.rejected, scan.own_max_tokens_max) == (BATCH_FORMAT, 2, 0, 300)
    chat_prompt, completion = iter_shard(path, 0, 2)
    assert chat_prompt.id == "chat-1" and chat_prompt.messages == USER and chat_prompt.prompt is None
    assert chat_prompt.sampling == {"max_tokens": 300, "temperature": 0.2, "top_p": 0.9, "stop": ["\n\n"], "seed": 7,
                                    "presence_penalty": 0.5, "frequency_penalty": 0.1, "top_k": 20, "min_p": 0.05,
                                    "repetition_penalty": 1.1}
    # null is the API's "the default": no override
    assert (completion.id, completion.prompt, completion.messages, completion.sampling) == \
        ("completion-1", "Explain KV caches.", None, {"max_tokens": 50})
    assert read_planned_prompts(scan).own_max_tokens == {"chat-1": 300, "completion-1": 50}


def test_max_completion_tokens_wins_over_max_tokens_as_in_sglang():
    prompt = parse_line(json.dumps(request("a", max_tokens=10, max_completion_tokens=40)).encode())[0]
    assert prompt.sampling == {"max_tokens": 40}


def test_a_request_and_the_same_prompt_in_fleetgen_format_are_one_prompt_to_reuse():
    ours = {"id": "a", "messages": USER, "sampling": {"max_tokens": 64, "temperature": 0.3}}
    batch = request("a", max_completion_tokens=64, temperature=0.3)
    mine, theirs = (read_line(json.dumps(record).encode()) for record in (ours, batch))
    assert (mine.format, theirs.format) == (FLEETGEN_FORMAT, BATCH_FORMAT)
    assert prompt_hash(mine.prompt) == prompt_hash(theirs.prompt)
    # the model named in the body is not part of the prompt: the model identity is the generation key's
    other_model = read_line(json.dumps({**batch, "body": {**batch["body"], "model": "other"}}).encode())
    assert prompt_hash(other_model.prompt) == prompt_hash(theirs.prompt)
    edited = read_line(json.dumps(request("a", max_completion_tokens=65, temperature=0.3)).encode())
    assert prompt_hash(edited.prompt) != prompt_hash(theirs.prompt)


@pytest.mark.parametrize("record, reason", [
    (request("r", method="GET"), '"method" is "GET": a Batch API request is a POST'),
    (request("r", url="/v1/embeddings", input="x"),
     '"url" is "/v1/embeddings": fleetgen generates for /v1/chat/completions and /v1/completions'),
    ({"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": [1]},
     '"body" must be an object, got list'),
    (request("r", stream=True), "body.stream is true: a Batch API request is answered whole, not streamed"),
    (request("r", n=2), "body.n is 2: fleetgen generates one answer a request (n = 1)"),
    (request("r", n=True), "body.n is true: fleetgen generates one answer a request (n = 1)"),
    (request("r", logprobs=True), "body.logprobs is true: fleetgen records no log probabilities"),
    (request("r", prompt="x"), "body.prompt is not read on /v1/chat/completions, which takes body.messages"),
    ({"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}},
     "body.prompt is missing: a /v1/completions request needs it"),
    (request("r", max_completion_tokens=0), "body.max_completion_tokens must be a positive integer, got 0"),
    (request("r", temperature=-1), "body.temperature must be a number >= 0, got -1"),
    (request("r", messages=[]), '"messages" is empty'),
])
def test_every_refused_request_is_rejected_with_its_line_and_reason(tmp_path, record, reason):
    path = write_lines(tmp_path / "batch.jsonl", [request("ok-1"), record, request("ok-2")])
    scan = scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl")
    assert (scan.count, scan.rejected, scan.format) == (2, 1, BATCH_FORMAT)
    assert _rejects(tmp_path / "rejects.jsonl") == [{"line": 2, "id": "r", "error": reason}]
    assert [prompt.id for prompt in iter_shard(path, 0, 2)] == ["ok-1", "ok-2"]  # the shards skip it too


def test_a_body_key_that_would_change_the_answer_is_refused_naming_what_is_read(tmp_path):
    path = write_lines(tmp_path / "batch.jsonl", [request("ok"), request("tools", tools=[{"type": "function"}])])
    scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl")
    [reject] = _rejects(tmp_path / "rejects.jsonl")
    assert reject["line"] == 2 and reject["error"].startswith("body.tools is not supported (fleetgen reads the "
                                                              "sampling keys max_tokens, temperature, top_p")
    assert "max_completion_tokens" in reject["error"] and "model" in reject["error"]


@pytest.mark.parametrize("bad, problem", [
    ({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}},
     '"custom_id" must be a non-empty string, got 7'),
    ({"custom_id": None, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}, 'missing "custom_id"'),
    (request("ok-1"), "duplicate id 'ok-1' (first at line 1)"),
])
def test_a_request_without_a_usable_custom_id_is_structural(tmp_path, bad, problem):
    path = write_lines(tmp_path / "batch.jsonl", [request("ok-1"), bad])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path)
    assert caught.value.problems == [(2, problem)]


@pytest.mark.parametrize("rejected, first, other, first_name, other_name", [
    (request("r", method="GET"), request("a"), chat("b"), "the OpenAI Batch API's input format",
     "fleetgen's prompts format"),
    ({"id": "r", "prompt": 5}, chat("a"), request("b"), "fleetgen's prompts format",
     "the OpenAI Batch API's input format"),
])
def test_a_file_that_mixes_formats_is_refused_at_the_first_line_that_differs(tmp_path, rejected, first, other,
                                                                             first_name, other_name):
    path = write_lines(tmp_path / "mixed.jsonl", ["", "[1]", rejected, first, other])
    with pytest.raises(PromptsError) as caught:
        scan_prompts(path)
    # line 3 (rejected, but naming its prompt) decided the format; line 2 named none
    assert [line for line, _ in caught.value.problems] == [2, 5] and caught.value.line == 2
    line, message = caught.value.problems[1]
    assert message.startswith(f"this line is in {other_name}") and f"the file in {first_name}" in message
    assert message.endswith("(as its first prompt, line 3, is): one file holds one format")


def test_a_fleetgen_line_carrying_a_custom_id_key_stays_in_fleetgen_format(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [chat("a", custom_id="x"), chat("b")])
    scan = scan_prompts(path)
    assert (scan.format, scan.count) == (FLEETGEN_FORMAT, 2)
    assert [prompt.id for prompt in iter_shard(path, 0, 2)] == ["a", "b"]


def test_requests_naming_another_model_are_counted_and_generated_with_the_runs(tmp_path):
    path = write_lines(tmp_path / "batch.jsonl", [
        request("a", model="qwen3-8b"), request("b"), request("c", model="gpt-4.1"), request("r", n=3),
        request("d", model=None)])
    scan = scan_prompts(path, rejects_path=tmp_path / "rejects.jsonl", run_model="qwen3-8b")
    # the rejected request is not generated, so not counted; a body without a model names none
    assert (scan.other_model_lines, scan.other_model) == (2, {"line": 2, "model": "gpt-4o-mini"})
    assert scan_prompts(path).other_model_lines == 0  # not told the run's model: nothing to compare
    assert json.loads(json.dumps(scan.to_dict()))["other_model"] == {"line": 2, "model": "gpt-4o-mini"}


def test_requests_naming_another_model_are_counted_when_the_cap_cut_factor_scans_the_file_again(tmp_path):
    short = [request(f"s{number}", url="/v1/completions", prompt="why " * 20) for number in range(9)]
    path = write_lines(tmp_path / "batch.jsonl", [*short, request("other", url="/v1/completions", prompt="why",
                                                                  model="other-model"),
                                                  request("long", url="/v1/completions", prompt="x" * 40_000)])
    limit = LengthLimit(context_tokens=262_144, max_tokens=16, source="the model's context length")
    scan = scan_prompts(path, length_limit=limit, max_cap_cut_factor=4, run_model="gpt-4o-mini")
    assert (scan.count, scan.too_long) == (10, 1)  # set aside by the second scan, under the tighter limit
    assert (scan.other_model_lines, scan.other_model) == (1, {"line": 10, "model": "other-model"})


def test_shards_of_a_batch_file_resume_past_the_prompts_already_done(tmp_path):
    path = write_lines(tmp_path / "batch.jsonl", [request(f"q{i}", max_tokens=8 + i) for i in range(7)])
    scan = scan_prompts(path)
    shards = plan_shards(path, shard_size=3, scan=scan)
    assert [shard["count"] for shard in shards] == [3, 3, 1]
    second = shards[1]
    ids = [prompt.id for prompt in iter_shard(path, second["start"], second["count"])]
    assert ids == ["q3", "q4", "q5"]
    resumed = iter_shard(path, second["start"], second["count"], skip_ids={b"q3", b"q5"})
    assert [prompt.id for prompt in resumed] == ["q4"]
