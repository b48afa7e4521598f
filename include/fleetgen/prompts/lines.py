"""One line of the prompts file: its format, and the checks that make it a usable prompt.

A line is a JSON object: ``{"id": str, "messages": [...]}`` (chat, possibly multi-turn) or
``{"id": str, "prompt": str}``, with an optional ``"sampling"`` object of per-prompt overrides
(keys in ``SAMPLING_OVERRIDES``). Other top-level keys are carried along unread.

:func:`parse_line` tells the two kinds of problem apart (see :mod:`fleetgen.prompts.scan` for what each
leads to): *structural* (not a JSON object, no usable ``id``) and *per-prompt* (the id is good but
the content is unusable). Scanning the file as a whole is :mod:`fleetgen.prompts.scan`;
reading a planned shard back is :mod:`fleetgen.prompts.planned`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleetgen.json_types import is_json_int, is_json_number, is_positive_int

__all__ = ["Prompt", "ROLES", "SAMPLING_OVERRIDES", "fast_id", "parse_line", "shorten"]

try:  # orjson parses ~3x faster; the stdlib parser gives the same values
    import orjson as _orjson

    _loads = _orjson.loads
    _JSONError: tuple[type[Exception], ...] = (_orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _JSONError = (ValueError,)

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# Per-prompt overrides and the check each value must pass (OpenAI / SGLang sampling names).
SAMPLING_OVERRIDES: dict[str, tuple[str, Any]] = {
    "max_tokens": ("a positive integer", is_positive_int),
    "temperature": ("a number >= 0", lambda v: is_json_number(v) and v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: is_json_number(v) and 0 < v <= 1),
    "top_k": ("an integer (-1 or >= 1)", lambda v: is_json_int(v) and (v == -1 or v >= 1)),
    "min_p": ("a number in [0, 1]", lambda v: is_json_number(v) and 0 <= v <= 1),
    "seed": ("an integer", lambda v: is_json_int(v)),
    "stop": ("a string or a list of strings",
             lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))),
    "presence_penalty": ("a number", lambda v: is_json_number(v)),
    "frequency_penalty": ("a number", lambda v: is_json_number(v)),
    "repetition_penalty": ("a number > 0", lambda v: is_json_number(v) and v > 0),
}


@dataclass(frozen=True, slots=True)
class Prompt:
    """One valid prompt. Exactly one of ``messages`` and ``prompt`` is set."""

    id: str
    messages: list[dict] | None = None
    prompt: str | None = None
    sampling: dict = field(default_factory=dict)

    def chat_messages(self) -> list[dict]:
        """The messages to send to a chat endpoint (a bare prompt becomes one user turn)."""
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.prompt}]

    def content_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(_content_chars(m.get("content")) for m in self.messages or ())


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


def fast_id(raw_line: bytes) -> bytes | None:
    """The UTF-8 id of a line written as ``{"id":"..."`` with no escapes in the id, else None.

    Lets resume skip finished prompts without parsing their text; any other layout returns None
    and the caller parses the line.
    """
    if raw_line.startswith(b'{"id":"'):
        start = 7
    elif raw_line.startswith(b'{"id": "'):
        start = 8
    else:
        return None
    end = raw_line.find(b'"', start)
    raw_id = raw_line[start:end]
    return raw_id if end > 0 and b"\\" not in raw_id else None


def parse_line(raw: bytes) -> tuple[Prompt | None, str | None, str | None, str | None]:
    """(prompt, structural problem, per-prompt problem, id) for one non-blank line."""
    try:
        record = _loads(raw)
    except _JSONError as exc:
        return None, f"malformed JSON ({shorten(str(exc))})", None, None
    except UnicodeDecodeError:
        return None, "not valid UTF-8", None, None
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}", None, None
    prompt_id = record.get("id")
    if prompt_id is None:
        return None, 'missing "id"', None, None
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        return None, f'"id" must be a non-empty string, got {shorten(repr(prompt_id))}', None, None
    if problem := _content_problem(record):
        return None, None, problem, prompt_id
    return (Prompt(id=prompt_id, messages=record.get("messages"), prompt=record.get("prompt"),
                   sampling=record.get("sampling") or {}), None, None, prompt_id)


def _content_problem(record: dict) -> str | None:
    has_messages, has_prompt = "messages" in record, "prompt" in record
    if has_messages == has_prompt:
        return 'needs exactly one of "messages" and "prompt"'
    if has_prompt:
        text = record["prompt"]
        if not isinstance(text, str):
            return f'"prompt" must be a string, got {type(text).__name__}'
        if not text.strip():
            return '"prompt" is empty'
    elif problem := _messages_problem(record["messages"]):
        return problem
    sampling = record.get("sampling")
    if sampling is not None:
        if not isinstance(sampling, dict):
            return f'"sampling" must be an object, got {type(sampling).__name__}'
        for key, value in sampling.items():
            if key not in SAMPLING_OVERRIDES:
                return f'unknown sampling override "{key}" (allowed: {", ".join(SAMPLING_OVERRIDES)})'
            what, check = SAMPLING_OVERRIDES[key]
            if not check(value):
                return f'sampling override "{key}" must be {what}, got {shorten(repr(value))}'
    return None


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return f'"messages" must be a list, got {type(messages).__name__}'
    if not messages:
        return '"messages" is empty'
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            return f"message {number} must be an object, got {type(message).__name__}"
        role = message.get("role")
        if role not in ROLES:
            return f"message {number} has role {shorten(repr(role))} (expected one of {', '.join(sorted(ROLES))})"
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                return f'message {number}: content parts must be {{"type": "text", "text": str}}'
        elif not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            return f"message {number}: content must be a string, got {type(content).__name__}"
    if not any(m["role"] == "user" and _content_chars(m.get("content")) for m in messages):
        return "no user message with content"
    return None


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (ending in "..."), to quote a value in a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."

