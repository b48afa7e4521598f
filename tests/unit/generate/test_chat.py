"""Reading a chat completion: what is not one is a BadResponse naming what is wrong, never a raw error later."""

import json
import re

import pytest

from generate_fakes import completion_body

from fleetgen.generate.chat import BadResponse, parse_chat_response


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
