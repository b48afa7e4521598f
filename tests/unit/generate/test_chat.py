"""Reading a chat completion: what is not one is a BadResponse naming what is wrong, never a raw error later."""

import json
import re

import pytest

from generate_fakes import completion_body

from fleetgen.generate.chat import BadResponse, Verdict, error_message, parse_chat_response, request_body, verdict_for_status
from fleetgen.generate.settings import GenerationSettings
from fleetgen.prompts.lines import Prompt


def _raw(**usage) -> bytes:
    body = completion_body("p0001")
    body["usage"] = usage if usage else None
    return json.dumps(body).encode()


def test_sglang_usage_with_null_counts_is_read_as_it_is():
    result = parse_chat_response(_raw(prompt_tokens=7, completion_tokens=None, total_tokens=7, reasoning_tokens=None))
    assert result.usage == {"prompt_tokens": 7, "completion_tokens": None, "total_tokens": 7,
                            "reasoning_tokens": None}
    assert parse_chat_response(_raw()).usage == {}


@pytest.mark.parametrize("usage, problem", [
    ({"prompt_tokens": 7, "completion_tokens": "12"}, "usage.completion_tokens is not a token count ('12')"),
    ({"prompt_tokens": "7", "completion_tokens": 12}, "usage.prompt_tokens is not a token count ('7')"),
    ({"prompt_tokens": 7.5}, "usage.prompt_tokens is not a token count (7.5)"),
    ({"prompt_tokens": True}, "usage.prompt_tokens is not a token count (True)"),
    ({"prompt_tokens": -1}, "usage.prompt_tokens is not a token count (-1)"),
    ({"total_tokens": [19]}, "usage.total_tokens is not a token count ([19])"),
])
def test_usage_that_is_not_token_counts_is_a_bad_response(usage, problem):
    with pytest.raises(BadResponse, match=re.escape(problem)):
        parse_chat_response(_raw(**usage))


def test_usage_that_is_not_an_object_is_a_bad_response():
    body = completion_body("p0001")
    body["usage"] = "12 tokens"
    with pytest.raises(BadResponse, match="usage is not an object"):
        parse_chat_response(json.dumps(body).encode())


# --- the request body -------------------------------------------------------------------------------------

def test_the_request_body_carries_model_messages_sampling_and_extra_body():
    settings = GenerationSettings(model="qwen", max_tokens=256, temperature=0.3, top_p=0.9,
                                  extra_body={"separate_reasoning": True})
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    raw, sampling = request_body(Prompt(id="a", messages=messages), settings)
    assert sampling == {"max_tokens": 256, "temperature": 0.3, "top_p": 0.9}
    assert json.loads(raw) == {"model": "qwen", "messages": messages, "max_tokens": 256, "temperature": 0.3,
                               "top_p": 0.9, "separate_reasoning": True}


def test_a_prompts_own_max_tokens_wins_over_the_runs_and_is_reported_as_used():

    settings = GenerationSettings(model="qwen", max_tokens=256)
    raw, sampling = request_body(Prompt(id="a", prompt="hello", sampling={"max_tokens": 4000}), settings)
    assert sampling["max_tokens"] == 4000 and json.loads(raw)["max_tokens"] == 4000
    assert json.loads(raw)["messages"] == [{"role": "user", "content": "hello"}]
    # the next prompt without its own max_tokens gets the run's again
    _, sampling = request_body(Prompt(id="b", prompt="hello"), settings)
    assert sampling["max_tokens"] == 256


# --- reading a completion ---------------------------------------------------------------------------------

def test_a_completion_is_read_into_its_fields():
    body = completion_body("p0001")
    body["usage"]["reasoning_tokens"] = 0
    result = parse_chat_response(json.dumps(body).encode())
    assert result.content == "answer to p0001"
    assert result.reasoning_content == "thinking about p0001"
    assert result.finish_reason == "stop"
    assert result.model == "test-model"
    assert result.usage == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17, "reasoning_tokens": 0}


def test_the_first_choice_is_the_answer():
    body = completion_body("p0001")
    second = {"index": 1, "finish_reason": "length", "message": {"role": "assistant", "content": "other"}}
    body["choices"].append(second)
    result = parse_chat_response(json.dumps(body).encode())
    assert result.content == "answer to p0001" and result.finish_reason == "stop"


def test_null_content_reads_as_empty_text_and_missing_reasoning_as_none():
    body = completion_body("p0001")
    body["choices"][0]["message"] = {"role": "assistant", "content": None}
    del body["model"]
    result = parse_chat_response(json.dumps(body).encode())
    assert result.content == "" and result.reasoning_content is None and result.model == ""
    body["model"] = None
    assert parse_chat_response(json.dumps(body).encode()).model == ""


def test_a_zero_token_count_is_a_count():
    result = parse_chat_response(_raw(prompt_tokens=0, completion_tokens=0, total_tokens=0, reasoning_tokens=0))
    assert result.usage == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "reasoning_tokens": 0}


@pytest.mark.parametrize("key", ["prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens"])
@pytest.mark.parametrize("bad", [True, False, -1, 1.0, "3"])
def test_every_usage_count_must_be_a_non_negative_integer(key, bad):
    with pytest.raises(BadResponse, match=re.escape(f"usage.{key} is not a token count ({bad!r})")):
        parse_chat_response(_raw(**{key: bad}))


@pytest.mark.parametrize("raw, problem", [
    (b"not json", "not a chat completion (JSONDecodeError"),
    (b"[]", "not a chat completion (TypeError"),
    (b'{"object": "error"}', "not a chat completion (KeyError"),
    (b'{"choices": []}', "not a chat completion (IndexError"),
    (b'{"choices": [{"message": "hi"}]}', "not a chat completion (AttributeError"),
    (b'{"choices": [{"finish_reason": "stop"}]}', "not a chat completion (KeyError"),
])
def test_what_is_not_a_completion_is_a_bad_response_naming_why(raw, problem):
    with pytest.raises(BadResponse, match=re.escape(problem)) as caught:
        parse_chat_response(raw)
    assert repr(raw) in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_bad_response_quotes_only_the_first_200_bytes():
    raw = b'{"choices": []' + b" " * 300 + b"}"
    with pytest.raises(BadResponse) as caught:
        parse_chat_response(raw)
    assert str(caught.value).endswith(repr(raw[:200]))


@pytest.mark.parametrize("message, problem", [
    ({"content": 5}, "message content is not text"),
    ({"content": ["a"]}, "message content is not text"),
    ({"content": "ok", "reasoning_content": 5}, "message content is not text"),
    ({"content": "ok", "reasoning_content": {"t": 1}}, "message content is not text"),
])
def test_content_that_is_not_text_is_a_bad_response(message, problem):
    body = completion_body("p0001")
    body["choices"][0]["message"] = message
    raw = json.dumps(body).encode()
    with pytest.raises(BadResponse, match=problem) as caught:
        parse_chat_response(raw)
    assert str(caught.value).endswith(repr(raw[:200]))


@pytest.mark.parametrize("finish_reason", [None, 0, ["stop"]])
def test_a_missing_finish_reason_is_a_bad_response(finish_reason):
    body = completion_body("p0001")
    body["choices"][0]["finish_reason"] = finish_reason
    raw = json.dumps(body).encode()
    with pytest.raises(BadResponse, match="finish_reason missing") as caught:
        parse_chat_response(raw)
    assert str(caught.value).endswith(repr(raw[:200]))
    del body["choices"][0]["finish_reason"]
    with pytest.raises(BadResponse, match="finish_reason missing"):
        parse_chat_response(json.dumps(body).encode())


def test_usage_of_the_wrong_kind_quotes_the_response():
    body = completion_body("p0001")
    body["usage"] = [7]
    raw = json.dumps(body).encode()
    with pytest.raises(BadResponse, match="usage is not an object") as caught:
        parse_chat_response(raw)
    assert str(caught.value).endswith(repr(raw[:200]))
    with pytest.raises(BadResponse) as caught:
        parse_chat_response(_raw(prompt_tokens=-1))
    assert str(caught.value).endswith(repr(_raw(prompt_tokens=-1)[:200]))


# --- an error response in the server's words ---------------------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    ({"object": "error", "message": "outer", "error": {"message": "context too long", "code": 400}},
     "context too long"),
    ({"message": "OpenAI-style flat", "detail": "d", "error": "e"}, "OpenAI-style flat"),
    ({"detail": "Not Found", "error": "e"}, "Not Found"),
    ({"detail": [{"loc": ["body"], "msg": "field required"}]}, "[{'loc': ['body'], 'msg': 'field required'}]"),
    ({"error": "plain string"}, "plain string"),
    ({"error": {"message": ""}, "message": "fallback"}, "fallback"),
    ({"error": {"code": 1}}, "{'code': 1}"),
    ({"message": "", "detail": None, "error": None, "x": 1}, '{"message": "", "detail": null, "error": null, "x": 1}'),
    ({"message": 404}, "404"),
])
def test_an_error_is_told_in_the_servers_own_words(body, expected):
    assert error_message(json.dumps(body).encode()) == expected


def test_an_error_that_is_not_json_is_its_text_and_an_empty_one_says_so():
    assert error_message(b"Internal Server Error") == "Internal Server Error"
    assert error_message(b"[1, 2]") == "[1, 2]"
    assert error_message(b"bad \xff byte") == "bad \ufffd byte"
    assert error_message(b"") == "(empty response)"


@pytest.mark.parametrize("wrap", [
    lambda text: {"error": {"message": text}},
    lambda text: {"message": text},
    lambda text: {"detail": text},
    lambda text: {"error": text},
])
def test_a_long_error_is_cut_at_500_characters(wrap):
    text = "x" * 499 + "yz"
    assert error_message(json.dumps(wrap(text)).encode()) == "x" * 499 + "y"
    assert error_message(json.dumps(wrap(text[:500])).encode()) == text[:500]


def test_a_long_raw_error_is_cut_at_500_bytes():
    assert error_message(b"e" * 499 + b"fg") == "e" * 499 + "f"


@pytest.mark.parametrize(("status", "verdict"), [
    (200, Verdict.ANSWERED), (401, Verdict.BAD_KEY), (403, Verdict.BAD_KEY), (404, Verdict.NO_ROUTE),
    (408, Verdict.RETRY), (429, Verdict.RETRY), (400, Verdict.CLIENT_ERROR), (413, Verdict.CLIENT_ERROR),
    (499, Verdict.CLIENT_ERROR), (500, Verdict.SERVER_FAILED), (503, Verdict.SERVER_FAILED),
    (399, Verdict.SERVER_FAILED), (201, Verdict.SERVER_FAILED), (302, Verdict.SERVER_FAILED)])
def test_each_status_has_one_verdict_and_only_200_is_an_answer(status, verdict):
    assert verdict_for_status(status) is verdict
