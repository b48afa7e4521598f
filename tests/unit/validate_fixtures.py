"""Synthetic run output (stats, errors, completions shards) for the validation and report tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_TOKENS = 1000
SERVERS = ("node-a:30000", "node-a:30001", "node-b:30000")
T0 = 1_764_400_000.0


def good_row(index: int, **overrides) -> dict:
    """A stats row that passes every default expectation; spread over three servers and 100 s."""
    completion_tokens = 100 + (index * 37) % 500
    row = {
        "id": f"p{index:05d}",
        "prompt_tokens": 270,
        "completion_tokens": completion_tokens,
        "finish_reason": "stop",
        "reasoning_chars": completion_tokens * 3,
        "content_chars": 200,
        "server": SERVERS[index % len(SERVERS)],
        "latency_s": 2.0,
        "finished_at": T0 + 2.0 + index * 0.1,
    }
    row.update(overrides)
    return row


def error_row(prompt_id: str, server: str = SERVERS[0]) -> dict:
    return {"id": prompt_id, "status": "failed", "error": {"code": 500, "message": "internal error"},
            "server": server, "at": T0 + 50}


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def write_run(out: Path, rows: list[dict], errors: list[dict] = (), shards: int = 2) -> Path:
    """Write ``rows`` in contiguous blocks over ``shards`` shards, like the client does."""
    per_shard = max(1, -(-len(rows) // shards))
    for shard in range(shards):
        block = rows[shard * per_shard:(shard + 1) * per_shard]
        write_jsonl(out / "stats" / f"shard-{shard:05d}.jsonl", block)
        write_jsonl(out / "completions" / f"shard-{shard:05d}.jsonl",
                    [{"id": row["id"], "reasoning_content": "r" * 50, "content": "answer"} for row in block])
    write_jsonl(out / "errors" / "shard-00000.jsonl", list(errors))
    return out


_watched: list[str] = []
_watching: list[Path] = []


def _audit(event: str, args: tuple) -> None:
    if _watching and event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
        if any(str(folder) in str(args[0]) for folder in _watching):
            _watched.append(f"{event} {args[0]}")


class FileAccessWatch:
    """Records every open/listdir/scandir of a path under ``folder`` while in the ``with`` block.

    An audit hook cannot be removed once added, so one hook serves every watch of the process.
    """

    _installed = False

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.touched: list[str] = []

    def __enter__(self) -> "FileAccessWatch":
        if not FileAccessWatch._installed:
            sys.addaudithook(_audit)
            FileAccessWatch._installed = True
        _watched.clear()
        _watching.append(self.folder)
        return self

    def __exit__(self, *exc) -> None:
        _watching.remove(self.folder)
        self.touched = list(_watched)
