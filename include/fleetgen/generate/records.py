"""The three per-shard output records: completion, stats and error lines.

Every record starts with ``"id"`` so that resume can read ids without parsing the rest of a line
(``fleetgen.prompts.lines.fast_id``). Field lists are described in docs/output-formats.md;
the stats columns are ``fleetgen.outputs.STATS_COLUMNS``.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from fleetgen.generate.chat import ChatResult
from fleetgen.outputs import STATS_COLUMNS
from fleetgen.prompts.scan import Prompt


def completion_record(prompt: Prompt, result: ChatResult, *, server: str, latency_s: float,
                      sampling: dict) -> dict:
    record = {"id": prompt.id}
    if prompt.messages is not None:
        record["messages"] = prompt.messages
    else:
        record["prompt"] = prompt.prompt
    record.update(reasoning_content=result.reasoning_content, content=result.content,
                  finish_reason=result.finish_reason, usage=result.usage, server=server,
                  latency_s=round(latency_s, 3), model=result.model, sampling=sampling,
                  finished_at=round(time.time(), 3))
    return record


def stats_record(completion: dict) -> dict:
    """The compact row validation and the report read instead of the text."""
    usage = completion.get("usage") or {}
    values = (completion["id"], usage.get("prompt_tokens"), usage.get("completion_tokens"),
              completion.get("finish_reason"), len(completion.get("reasoning_content") or ""),
              len(completion.get("content") or ""), completion.get("server"), completion.get("latency_s"),
              completion.get("finished_at"), completion.get("reused_from"))
    return dict(zip(STATS_COLUMNS, values, strict=True))


# Whose fault an error record says it was: only the prompt's own failures (a request the server refused while
# it completed others, e.g. longer than the context) stay failed on resume; the others are sent again by a new try.
PROMPT_FAULT = "prompt"
SERVER_FAULT = "server"


def error_record(prompt_id: str, *, code: str, message: str, server: str | None, fault: str) -> dict:
    """One failed prompt, in the spirit of the OpenAI Batch API's error file; ``fault`` is ``PROMPT_FAULT``
    or ``SERVER_FAULT`` (docs/output-formats.md §3.3)."""
    return {"id": prompt_id, "status": "failed", "error": {"code": code, "message": message},
            "server": server, "fault": fault, "at": utc_now()}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
