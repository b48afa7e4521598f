"""A finished run's results as OpenAI Batch API output and error files, for code written for a hosted provider.

Each line is the Batch API's ``BatchRequestOutput`` (``{"id", "custom_id", "response", "error"}``, the per-line
object of its output and error files in OpenAI's API reference). ``custom_id`` is the prompt's id, whichever format
the prompts file was in. The output file holds one line per completion (``completions/``, docs/output-formats.md
§3.1), its ``response.body`` a ``chat.completion`` rebuilt from the completion record: the answer and
``reasoning_content`` as SGLang returned them, its ``finish_reason``, SGLang's ``usage``, the model that answered.
The error file holds the prompts without a completion: those the scan set aside (``rejects.jsonl``, code
``REJECTED_CODE``) and those written off while generating (``errors/``, their own code: ``http_400``,
``attempts_exhausted``), each with ``response`` null.

fleetgen does not record SGLang's random response id, so the ids are derived from the run folder and the prompt
id (``request_hash``): the same run writes the same files, a retried task included. Both files are written to a
temporary name and renamed, so a reader never sees half of one. Reading goes through the run's layout
(:mod:`fleetgen.outputs`); completions are read a line at a time, so memory does not grow with the run.
The files, with an example line each: docs/output-formats.md §9.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetgen.errors import OutputError
from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout, write_whole

__all__ = ["REJECTED_CODE", "BatchFiles", "error_line", "request_hash", "response_line", "write_batch_files"]

log = logging.getLogger("fleetgen")

# The error code of a prompt the scan set aside (rejects.jsonl): it was never sent.
REJECTED_CODE = "prompt_rejected"
REQUEST_HASH_BYTES = 12


@dataclass(frozen=True)
class BatchFiles:
    """What ``write_batch_files`` wrote; JSON-safe through ``asdict``."""

    output: str
    errors: str
    responses: int  # lines of the output file
    failed: int  # lines of the error file
    unreadable: int  # completion lines that did not parse (a torn last line): in neither file

    def to_dict(self) -> dict:
        return asdict(self)


def request_hash(run_folder: str, prompt_id: str) -> str:
    """The hex digest the line's ids are made from: one per prompt of a run."""
    return hashlib.blake2b(f"{run_folder}\0{prompt_id}".encode(), digest_size=REQUEST_HASH_BYTES).hexdigest()


def response_line(completion: dict, run_folder: str) -> dict:
    """The output file's line for one completion record."""
    digest = request_hash(run_folder, completion["id"])
    message = {"role": "assistant", "content": completion.get("content"),
               "reasoning_content": completion.get("reasoning_content")}
    body = {"id": f"chatcmpl-{digest}", "object": "chat.completion", "created": int(completion["finished_at"]),
            "model": completion.get("model"),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": completion.get("finish_reason")}],
            "usage": completion.get("usage")}
    return {"id": f"batch_req_{digest}", "custom_id": completion["id"],
            "response": {"status_code": 200, "request_id": f"req_{digest}", "body": body}, "error": None}


def error_line(prompt_id: str, code: str, message: str, run_folder: str) -> dict:
    """The error file's line for one prompt without a completion."""
    return {"id": f"batch_req_{request_hash(run_folder, prompt_id)}", "custom_id": prompt_id, "response": None,
            "error": {"code": code, "message": message}}


def write_batch_files(layout: RunLayout) -> BatchFiles:
    """Write ``layout.batch_output`` and ``layout.batch_errors`` from the run's completions, error records and
    rejects; what was written."""
    failures = _failures(layout)  # small: the prompts without a completion once the run is over, and a few more
    folder = layout.root.name
    responses = unreadable = 0
    with write_whole(layout.batch_output) as out:
        for completion in _records(layout.shard_files("completions")):
            if completion is None:
                unreadable += 1
                continue
            failures.pop(completion["id"], None)  # answered after all (an earlier try's error)
            out.write(jsonio.dumps(response_line(completion, folder)) + b"\n")
            responses += 1
    with write_whole(layout.batch_errors) as out:
        for prompt_id, (code, message) in failures.items():
            out.write(jsonio.dumps(error_line(prompt_id, code, message, folder)) + b"\n")
    if unreadable:
        log.warning("%d completion line(s) of %s could not be read (a torn last line): in neither Batch API file",
                    unreadable, layout.kind_dir("completions"))
    return BatchFiles(output=str(layout.batch_output), errors=str(layout.batch_errors), responses=responses,
                      failed=len(failures), unreadable=unreadable)


def _failures(layout: RunLayout) -> dict[str, tuple[str, str]]:
    """``(code, message)`` by prompt id: the scan's rejects in line order, then the generation's error records in
    shard order (a prompt's last record)."""
    failures: dict[str, tuple[str, str]] = {}
    for reject in _records([layout.rejects] if layout.rejects.is_file() else []):
        if reject is not None:
            failures[reject["id"]] = (REJECTED_CODE, f"line {reject['line']} of the prompts file: {reject['error']}")
    for record in _records(layout.shard_files("errors")):
        if record is not None:
            error = record.get("error") if isinstance(record.get("error"), dict) else {}
            failures[record["id"]] = (str(error.get("code")), str(error.get("message")))
    return failures


def _records(paths: list[Path]) -> Iterator[dict | None]:
    """Every line of ``paths`` parsed, None for one that is not a JSON object with an id."""
    for path in paths:
        with path.open("rb") as handle:
            for raw in handle:
                if not raw.strip():
                    continue
                try:
                    record = jsonio.loads(raw)
                except jsonio.JSONDecodeError:
                    yield None
                    continue
                yield record if isinstance(record, dict) and isinstance(record.get("id"), str) else None
