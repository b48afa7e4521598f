"""One prompts line: every sampling bound, every message check, the id fast path, and the messages' wording."""

import json

import pytest

from fleetgen.prompts.lines import Prompt, fast_id, parse_line, shorten

USER = [{"role": "user", "content": "hi"}]


def _parse(record):
    return parse_line(json.dumps(record).encode())


@pytest.mark.parametrize("key, good, bad", [
    ("max_tokens", [1, 4096], [0, -1, 1.5, True, "8"]),
    ("temperature", [0, 0.0, 1.7], [-0.1, False, "0.5"]),
    ("top_p", [1, 0.5, 1e-9], [0, 0.0, 1.01, -1]),
    ("top_k", [-1, 1, 40], [0, -2, 2.0]),
    ("min_p", [0, 1, 0.3], [-0.01, 1.5]),
    ("seed", [0, -5, 7], [1.0, "1", None]),
    ("stop", ["x", [], ["a", "b"]], [1, ["a", 2]]),
    ("presence_penalty", [-2, 0.5], ["0", True]),
    ("frequency_penalty", [-2, 0.5], [None]),
    ("repetition_penalty", [0.5, 1], [0, -1]),
])
def test_each_sampling_override_accepts_its_range_and_refuses_the_rest(key, good, bad):
    for value in good:
        prompt, structural, problem, prompt_id = _parse({"id": "a", "messages": USER, "sampling": {key: value}})
        assert (structural, problem, prompt_id) == (None, None, "a") and prompt.sampling == {key: value}
    for value in bad:
        prompt, structural, problem, _ = _parse({"id": "a", "messages": USER, "sampling": {key: value}})
        assert prompt is None and structural is None
        assert problem.startswith(f'sampling override "{key}" must be ')


def test_top_p_zero_names_its_range():
    assert _parse({"id": "a", "prompt": "x", "sampling": {"top_p": 0}})[2] == \
        'sampling override "top_p" must be a number in (0, 1], got 0'


@pytest.mark.parametrize("messages, problem", [
    ([{"role": "user", "content": ""}], "no user message with content"),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}], "no user message with content"),
    ([{"role": "assistant", "content": "hello"}], "no user message with content"),
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "no user message with content"),
    ([{"role": "user", "content": None}], "message 1: content must be a string, got NoneType"),
    ([], '"messages" is empty'),
    ({"role": "user"}, '"messages" must be a list, got dict'),
    (["hi"], "message 1 must be an object, got str"),
    ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
     "message 2 has role 'robot' (expected one of assistant, developer, system, tool, user)"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
     'message 1: content parts must be {"type": "text", "text": str}'),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}],
     'message 1: content parts must be {"type": "text", "text": str}'),
])
def test_message_problems(messages, problem):
    assert _parse({"id": "a", "messages": messages}) == (None, None, problem, "a")


def test_valid_chat_shapes_and_their_content_size():
    messages = [{"role": "system", "content": "sys"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
                {"role": "user", "content": [{"type": "text", "text": "four"}, {"type": "text", "text": "56"}]}]
    prompt, structural, problem, _ = _parse({"id": "a", "messages": messages, "other": 1})
    assert (structural, problem) == (None, None)
    assert prompt == Prompt(id="a", messages=messages, prompt=None, sampling={})
    assert prompt.content_chars() == 9 and prompt.chat_messages() == messages
    bare = _parse({"id": "b", "prompt": "say hi"})[0]
    assert bare.content_chars() == 6 and bare.chat_messages() == [{"role": "user", "content": "say hi"}]


@pytest.mark.parametrize("record, problem", [
    ({"id": "a"}, 'needs exactly one of "messages" and "prompt"'),
    ({"id": "a", "prompt": "x", "messages": USER}, 'needs exactly one of "messages" and "prompt"'),
    ({"id": "a", "prompt": 5}, '"prompt" must be a string, got int'),
    ({"id": "a", "prompt": " \n"}, '"prompt" is empty'),
    ({"id": "a", "prompt": "x", "sampling": [1]}, '"sampling" must be an object, got list'),
    ({"id": "a", "prompt": "x", "sampling": {"beam": 2}},
     'unknown sampling override "beam" (allowed: max_tokens, temperature, top_p, top_k, min_p, seed, stop, '
     'presence_penalty, frequency_penalty, repetition_penalty)'),
])
def test_per_prompt_problems(record, problem):
    assert _parse(record) == (None, None, problem, "a")


@pytest.mark.parametrize("raw, structural", [
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"prompt": "x"}', 'missing "id"'),
    (b'{"id": 7, "prompt": "x"}', '"id" must be a non-empty string, got 7'),
    (b'{"id": "  ", "prompt": "x"}', "\"id\" must be a non-empty string, got '  '"),
])
def test_structural_problems(raw, structural):
    assert parse_line(raw) == (None, structural, None, None)


def test_malformed_json_quotes_the_parser_shortly():
    prompt, structural, problem, prompt_id = parse_line(b'{"id": "a", ' + b"x" * 200)
    assert structural.startswith("malformed JSON (") and len(structural) <= len("malformed JSON ()") + 80
    assert "line 1 column" in structural  # the parser's own words say where
    assert (prompt, problem, prompt_id) == (None, None, None)


@pytest.mark.parametrize("raw, expected", [
    (b'{"id":"abc","x":1}\n', b"abc"),
    (b'{"id": "abc", "x": 1}\n', b"abc"),
    (b'{"id":"a\\"b","x":1}\n', None),
    (b'{"x":1,"id":"abc"}\n', None),
    (b'{"id":"unterminated', None),
    (b'{"id":"","x":1}', b""),
])
def test_fast_id(raw, expected):
    assert fast_id(raw) == expected


def test_shorten():
    assert shorten("x" * 80) == "x" * 80
    assert shorten("x" * 81) == "x" * 77 + "..."
    assert shorten("abcdef", limit=5) == "ab..."
