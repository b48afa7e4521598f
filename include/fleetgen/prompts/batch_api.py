"""The OpenAI Batch API's input format: one request line turned into fleetgen's own prompt record.

A Batch API input file holds one request a line, ``{"custom_id", "method": "POST", "url": "/v1/chat/completions",
"body": {"model", "messages", "max_tokens", ...}}`` (the ``BatchRequestInput`` object of OpenAI's API reference),
so that one file can go to a hosted provider or to the fleet. ``to_prompt_record`` maps it onto the record
:mod:`fleetgen.prompts.lines` checks for its own format: ``custom_id`` is the prompt's ``id``, ``body.messages``
its ``messages`` (``body.prompt`` its ``prompt`` on ``/v1/completions``) and the sampling keys of ``body`` its
``sampling`` overrides, under the override names (``lines.SAMPLING_OVERRIDES``: Batch's own names but for
``RENAMED``), so they are checked, planned for and hashed exactly as the same overrides given in fleetgen's format.
Which format a file is in is decided by the scan, once per file (docs/output-formats.md §1.1).

What a line asks for that fleetgen would not honour is refused with the reason (a per-prompt reject): another
``method`` than POST, another ``url`` than the two completions routes, ``stream``, more than one answer (``n``),
log probabilities, and any body key that is neither a sampling override nor in ``UNREAD``. ``body.model`` is read,
not obeyed: the fleet serves one model, and the scan counts the lines that name another.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from fleetgen.json_types import is_json_int

__all__ = ["BATCH_FORMAT", "ID_KEY", "ROUTES", "BatchLine", "is_batch_record", "to_prompt_record"]

BATCH_FORMAT = "openai_batch"
ID_KEY = "custom_id"
# The routes a request line may name, and the body key that holds its prompt there. Both are generated on the
# fleet's /v1/chat/completions: a /v1/completions prompt is sent as one user turn, as fleetgen's own "prompt" is.
ROUTES = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}
# Batch body names that are not the override's name. max_completion_tokens wins when a body gives both, as in SGLang's
# ChatCompletionRequest.to_sampling_params ("max_completion_tokens or max_tokens";
# sglang/srt/entrypoints/openai/protocol.py).
RENAMED = {"max_completion_tokens": "max_tokens"}
# Body keys that change nothing the fleet generates or fleetgen records: read and let go. "model" is counted by the
# scan when it names another model than the fleet's.
UNREAD = frozenset({"model", "user", "metadata", "store", "service_tier", "stream_options"})
# Body keys fleetgen honours only at the value that asks for one plain answer, and why another value is refused.
ONE_ANSWER = {
    "stream": (lambda value: value is False, "a Batch API request is answered whole, not streamed"),
    "n": (lambda value: is_json_int(value) and value == 1, "fleetgen generates one answer a request (n = 1)"),
    "logprobs": (lambda value: value is False, "fleetgen records no log probabilities"),
}


class BatchLine(NamedTuple):
    """A request line as fleetgen's own record, or why it cannot be one (``problem``); ``names`` maps each sampling
    override back to the body key it came from, for the messages."""

    record: dict
    problem: str | None
    model: str | None
    names: dict[str, str]


def is_batch_record(record: dict) -> bool:
    """A line of the Batch API's format: it names itself by ``custom_id`` (fleetgen's own lines by ``id``, which a
    request line never has)."""
    return ID_KEY in record and "id" not in record


def to_prompt_record(record: dict) -> BatchLine:
    """``{"id", "messages" | "prompt", "sampling"}`` from a request line (``record["id"]`` is its ``custom_id`` as
    given: the caller checks it as it checks its own ids), with the first reason it cannot be generated, if any."""
    own: dict[str, Any] = {"id": record.get(ID_KEY)}
    names: dict[str, str] = {}
    method, url, body = record.get("method"), record.get("url"), record.get("body")
    if method != "POST":
        return BatchLine(own, f'"method" is {_quoted(method)}: a Batch API request is a POST', None, names)
    if url not in ROUTES:
        return BatchLine(own, f'"url" is {_quoted(url)}: fleetgen generates for {" and ".join(ROUTES)}', None, names)
    if not isinstance(body, dict):
        return BatchLine(own, f'"body" must be an object, got {type(body).__name__}', None, names)
    content_key = ROUTES[url]
    model = body.get("model") if isinstance(body.get("model"), str) else None
    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in UNREAD:  # null is the API's "the default"
            continue
        if key in ONE_ANSWER:
            check, why = ONE_ANSWER[key]
            if not check(value):
                return BatchLine(own, f"body.{key} is {_quoted(value)}: {why}", model, names)
        elif key == content_key:
            own[key] = value
        elif key in ROUTES.values():
            return BatchLine(own, f"body.{key} is not read on {url}, which takes body.{content_key}", model, names)
        elif not (key == "max_tokens" and body.get("max_completion_tokens") is not None):
            sampling[RENAMED.get(key, key)] = value
            names[RENAMED.get(key, key)] = key
    if content_key not in own:
        return BatchLine(own, f"body.{content_key} is missing: a {url} request needs it", model, names)
    if sampling:
        own["sampling"] = sampling
    return BatchLine(own, None, model, names)


def _quoted(value: Any) -> str:
    """A value as the line wrote it (JSON), cut short."""
    from fleetgen.prompts.lines import shorten  # lines imports this module: read when a line is refused

    return shorten(json.dumps(value, ensure_ascii=False, default=str))
