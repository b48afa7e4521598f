"""One line of the prompts file: its format, and the checks that make it a usable prompt.

A line is a JSON object: ``{"id": str, "messages": [...]}`` (chat, possibly multi-turn) or
``{"id": str, "prompt": str}``, with an optional ``"sampling"`` object of per-prompt overrides
(keys in ``SAMPLING_OVERRIDES``). Other top-level keys are carried along unread. A line of the OpenAI Batch API's
input format (``{"custom_id", "method", "url", "body"}``) is mapped onto the same record by
:mod:`fleetgen.prompts.batch_api` and checked the same way; :func:`read_line` says which format a line is in.

:func:`parse_line` tells the two kinds of problem apart (see :mod:`fleetgen.prompts.scan` for what each
leads to): *structural* (not a JSON object, no usable ``id``) and *per-prompt* (the id is good but
the content is unusable). Scanning the file as a whole is :mod:`fleetgen.prompts.scan`;
reading a planned shard back is :mod:`fleetgen.prompts.planned`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fleetgen.json_types import is_json_int, is_json_number, is_positive_int
from fleetgen.prompts import batch_api

__all__ = ["FLEETGEN_FORMAT", "FORMAT_NAMES", "ParsedLine", "Prompt", "ROLES", "SAMPLING_OVERRIDES", "fast_id", "parse_line",
           "mixed_formats", "read_fields", "read_line", "shorten"]

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


FLEETGEN_FORMAT = "fleetgen"  # the format above; batch_api.BATCH_FORMAT the other
FORMAT_NAMES = {FLEETGEN_FORMAT: 'fleetgen\'s prompts format ({"id", "messages" | "prompt"})',
                batch_api.BATCH_FORMAT: 'the OpenAI Batch API\'s input format ({"custom_id", "method", "url", "body"})'}


class ParsedLine(NamedTuple):
    """One line read: the prompt, or the structural or per-prompt problem; its id, and the format it is in (None
    when the line names no prompt: not an object, no id); a Batch API request's ``body.model``."""

    prompt: Prompt | None
    structural: str | None
    per_prompt: str | None
    id: str | None
    format: str | None = None
    model: str | None = None


def parse_line(raw: bytes) -> tuple[Prompt | None, str | None, str | None, str | None]:
    """(prompt, structural problem, per-prompt problem, id) for one non-blank line, in either format."""
    return read_fields(raw)[:4]


def read_line(raw: bytes) -> ParsedLine:
    """``parse_line`` with the line's format and the model a Batch API request names."""
    return ParsedLine._make(read_fields(raw))


_is_batch_record = batch_api.is_batch_record  # once per line of a file of millions: no attribute lookup


def read_fields(raw: bytes) -> tuple:
    """``ParsedLine``'s fields as a plain tuple: what the scan reads of every line of a file of millions."""
    try:
        record = _loads(raw)
    except _JSONError as exc:
        return None, f"malformed JSON ({shorten(str(exc))})", None, None, None, None
    except UnicodeDecodeError:
        return None, "not valid UTF-8", None, None, None, None
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}", None, None, None, None
    line_format, id_key, model, request_problem, names = FLEETGEN_FORMAT, "id", None, None, None
    if _is_batch_record(record):
        request = batch_api.to_prompt_record(record)
        line_format, id_key, model, request_problem, names = (batch_api.BATCH_FORMAT, batch_api.ID_KEY,
                                                              request.model, request.problem, request.names)
        record = request.record
    prompt_id = record.get("id")
    if prompt_id is None:
        return None, f'missing "{id_key}"', None, None, None, None
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        return (None, f'"{id_key}" must be a non-empty string, got {shorten(repr(prompt_id))}', None, None,
                line_format, None)
    if problem := request_problem or _content_problem(record, names):
        return None, None, problem, prompt_id, line_format, model
    return (Prompt(id=prompt_id, messages=record.get("messages"), prompt=record.get("prompt"),
                   sampling=record.get("sampling") or {}), None, None, prompt_id, line_format, model)


def mixed_formats(line_format: str, file_format: str, decided_at: int) -> str:
    """Why a line of one format cannot be in a file of the other (the file's first prompt, at ``decided_at``,
    decided its format): the structural problem the scan names the line with."""
    return (f"this line is in {FORMAT_NAMES[line_format]}, the file in {FORMAT_NAMES[file_format]} (as its first "
            f"prompt, line {decided_at}, is): one file holds one format")


def _content_problem(record: dict, batch_names: dict[str, str] | None = None) -> str | None:
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
            # a Batch API line's overrides are its body keys: named as the line names them
            name = f'sampling override "{key}"' if batch_names is None else f"body.{batch_names.get(key, key)}"
            if key not in SAMPLING_OVERRIDES:
                allowed = ", ".join(SAMPLING_OVERRIDES)
                return (f'unknown sampling override "{key}" (allowed: {allowed})' if batch_names is None else
                        f"{name} is not supported (fleetgen reads the sampling keys {allowed}, "
                        f"{', '.join(batch_api.RENAMED)}, and {', '.join(sorted(batch_api.UNREAD))}, which change "
                        f"nothing)")
            what, check = SAMPLING_OVERRIDES[key]
            if not check(value):
                return f"{name} must be {what}, got {shorten(repr(value))}"
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

