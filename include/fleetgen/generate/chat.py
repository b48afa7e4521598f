"""OpenAI-compatible chat requests and responses as SGLang serves them (docs/sglang-memory-model.md §6).

With a reasoning parser, ``choices[0].message`` carries the thinking in ``reasoning_content`` and
the answer in ``content``; ``usage.completion_tokens`` includes the reasoning tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fleetgen.generate import jsonio
from fleetgen.generate.settings import GenerationSettings
from fleetgen.prompts.scan import Prompt

CHAT_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"
ERROR_TEXT_LIMIT = 500
# The token counts of SGLang's UsageInfo (entrypoints/openai/protocol.py): integers, completion_tokens and
# reasoning_tokens possibly null. The progress line, the stats and the report add them up.
USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")


class Verdict(Enum):
    """What an HTTP status says, and so what becomes of the prompt and the server."""

    ANSWERED = "answered"  # 200: a completion, unless the body says otherwise
    RETRY = "retry"  # 408, 429: the prompt goes back to the queue; the server stays up
    BAD_KEY = "bad_key"  # 401, 403: the run is misconfigured, the shard stops
    NO_ROUTE = "no_route"  # 404: wrong URL or not an OpenAI-compatible server, the shard stops
    CLIENT_ERROR = "client_error"  # other 4xx: the prompt itself is wrong, written off
    SERVER_FAILED = "server_failed"  # 5xx and anything else: the server is marked down


def verdict_for_status(status: int) -> Verdict:
    if status == 200:
        return Verdict.ANSWERED
    if status in (401, 403):
        return Verdict.BAD_KEY
    if status == 404:
        return Verdict.NO_ROUTE
    if status in (408, 429):
        return Verdict.RETRY
    if 400 <= status < 500:
        return Verdict.CLIENT_ERROR
    return Verdict.SERVER_FAILED


class BadResponse(ValueError):
    """A 200 response that is not a chat completion."""


@dataclass(frozen=True, slots=True)
class ChatResult:
    content: str
    reasoning_content: str | None
    finish_reason: str
    usage: dict
    model: str
    # which launch wrote it: SGLang's weight_version in the completion's metadata (nodes/launch_identity.py)
    weight_version: str | None = None


def request_body(prompt: Prompt, settings: GenerationSettings) -> tuple[bytes, dict]:
    """The JSON body for one prompt and the sampling parameters it used (for the output record)."""
    sampling = settings.sampling(prompt.sampling)
    body = {"model": settings.model, "messages": prompt.chat_messages(), **sampling, **settings.extra_body}
    return jsonio.dumps(body), sampling


def parse_chat_response(raw: bytes) -> ChatResult:
    try:
        data = jsonio.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content")
        finish_reason = choice.get("finish_reason")
        usage = data.get("usage") or {}
        metadata = data.get("metadata") or {}
        weight_version = metadata.get("weight_version") if isinstance(metadata, dict) else None
    except (jsonio.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise BadResponse(f"not a chat completion ({type(exc).__name__}: {exc}): {raw[:200]!r}") from None
    if not isinstance(content, str) or not (reasoning is None or isinstance(reasoning, str)):
        raise BadResponse(f"message content is not text: {raw[:200]!r}")
    if not isinstance(finish_reason, str):
        raise BadResponse(f"finish_reason missing: {raw[:200]!r}")
    if not isinstance(usage, dict):
        raise BadResponse(f"usage is not an object: {raw[:200]!r}")
    for key in USAGE_COUNTS:
        count = usage.get(key)
        if count is not None and (type(count) is not int or count < 0):  # bool is an int: not a count
            raise BadResponse(f"usage.{key} is not a token count ({count!r}): {raw[:200]!r}")
    return ChatResult(content=content, reasoning_content=reasoning, finish_reason=finish_reason,
                      usage=usage, model=data.get("model") or "",
                      weight_version=weight_version if isinstance(weight_version, str) else None)


def error_message(raw: bytes) -> str:
    """The server's own words for an error response: OpenAI-style, FastAPI-style, or the raw text."""
    try:
        data = jsonio.loads(raw)
    except jsonio.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:ERROR_TEXT_LIMIT]
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])[:ERROR_TEXT_LIMIT]
    return raw[:ERROR_TEXT_LIMIT].decode("utf-8", "replace") or "(empty response)"
