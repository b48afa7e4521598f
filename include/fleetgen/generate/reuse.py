"""Regenerate only what changed: reuse a completion from an earlier successful run when nothing that
shapes it changed (docs/output-formats.md §3.9).

A completion is reused when all three are unchanged:

- the prompt: ``prompt_hash`` covers its id, its messages (or bare prompt) and its own sampling overrides;
- the model: its path and the SHA-256 of its ``config.json`` and ``model.safetensors.index.json`` as read
  on the node (``model_identity``);
- the run's sampling: ``max_tokens``, ``temperature``, ``top_p`` and the extra request body.

The last two make the run's ``generation_key``; an earlier run is a source only when its key is the
same. Each shard writes, beside every completion it records, a row ``{"h": prompt hash, "o": byte
offset, "n": bytes}`` of its completions file (``reuse/shard-NNNNN.jsonl``); once a run's validation
passed, those rows become its compact index (``reuse/index.npy``: 32 bytes per completion, sorted by
hash) without reading a completion's text. Tonight's shard looks its prompts up there, copies each
hit's line into its own completions file with ``"reused_from"`` set to the run it came from, so
tonight's folder is complete on its own, and generates only the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import Prompt

INDEX_DTYPE = np.dtype([("h1", "<u8"), ("h2", "<u8"), ("shard", "<u4"), ("bytes", "<u4"), ("offset", "<u8")])
HASH_BYTES = 16


def prompt_hash(prompt: Prompt) -> bytes:
    """16 bytes that change whenever the prompt's id, text or own sampling overrides change."""
    content = jsonio.dumps([prompt.id, prompt.messages, prompt.prompt, prompt.sampling])
    return hashlib.blake2b(content, digest_size=HASH_BYTES).digest()


def generation_key(model_identity: dict, *, max_tokens: int, temperature: float, top_p: float,
                   extra_body: dict) -> str:
    """What, beside the prompt, decides a completion: the model's identity and the run's sampling."""
    material = {"model": {key: model_identity[key] for key in ("path", "config_sha256", "index_sha256")},
                "sampling": {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p},
                "extra_body": extra_body}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def reuse_enabled(mode: str, run_type: str | None) -> bool:
    """Whether a run reuses (``mode``: the ``reuse_completions`` parameter, ``run_type``: Airflow's);
    ``scheduled``: only runs the schedule started (a person's manual run generates everything)."""
    return mode == "always" or (mode == "scheduled" and run_type == "scheduled")


def _split(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs = digests.view("<u8").reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def write_reuse_index(layout: RunLayout, *, key: str, run_id: str) -> int:
    """Compact the run's ``reuse/shard-*.jsonl`` rows into ``reuse/index.npy`` (+ ``index.json``); the
    number of completions indexed. Call only once the run's validation passed."""
    parts = []
    for path in layout.shard_files("reuse"):
        shard = int(path.stem.rsplit("-", 1)[1])
        rows = []
        with path.open("rb") as handle:
            for line in handle:
                try:
                    row = jsonio.loads(line)
                    rows.append((bytes.fromhex(row["h"]), int(row["o"]), int(row["n"])))
                except (ValueError, KeyError, TypeError, jsonio.JSONDecodeError):
                    continue  # a torn last row: that completion is simply not reusable
        if not rows:
            continue
        part = np.zeros(len(rows), dtype=INDEX_DTYPE)
        h1, h2 = _split(np.frombuffer(b"".join(row[0] for row in rows), dtype=np.uint8))
        part["h1"], part["h2"], part["shard"] = h1, h2, shard
        part["offset"] = [row[1] for row in rows]
        part["bytes"] = [row[2] for row in rows]
        parts.append(part)
    index = np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)
    index.sort(order=("h1", "h2"))
    layout.reuse_index.parent.mkdir(parents=True, exist_ok=True)
    partial = layout.reuse_index.with_name("index.partial.npy")
    np.save(partial, index)
    os.replace(partial, layout.reuse_index)
    layout.reuse_index_meta.write_text(json.dumps({"key": key, "run_id": run_id, "run_folder": layout.root.name,
                                                   "completions": int(len(index)), "written_at": time.time()}))
    return int(len(index))


@dataclass
class ReuseSource:
    """An earlier run's index, memory-mapped; ``find`` looks many prompt hashes up at once."""

    layout: RunLayout
    index: np.ndarray
    run_folder: str

    @classmethod
    def open(cls, run_root: Path) -> ReuseSource:
        layout = RunLayout(run_root)
        return cls(layout, np.load(layout.reuse_index, mmap_mode="r"), run_root.name)

    def find(self, digests: list[bytes]) -> list[tuple[int, int, int] | None]:
        """(shard, offset, bytes) of each digest's completion in this run, or None."""
        if not digests or not len(self.index):
            return [None] * len(digests)
        h1, h2 = _split(np.frombuffer(b"".join(digests), dtype=np.uint8))
        position = np.searchsorted(self.index["h1"], h1)
        found: list[tuple[int, int, int] | None] = []
        for where, first, second in zip(position, h1, h2):
            hit = None
            while where < len(self.index) and self.index["h1"][where] == first:
                entry = self.index[where]
                if entry["h2"] == second:
                    hit = (int(entry["shard"]), int(entry["offset"]), int(entry["bytes"]))
                    break
                where += 1
            found.append(hit)
        return found

    def read_line(self, shard: int, offset: int, length: int) -> bytes:
        with self.layout.shard_file("completions", shard).open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)


def find_reuse_source(output_root: Path, current_run_folder: str, key: str,
                      log: logging.Logger | None = None) -> ReuseSource | None:
    """The newest other run under ``output_root`` whose index was written for the same generation key."""
    newest: tuple[float, Path] | None = None
    for meta_path in Path(output_root).glob(f"*/{RunLayout(Path()).reuse_index_meta}"):
        run_root = meta_path.parent.parent
        if run_root.name == current_run_folder:
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            if log is not None:
                log.warning("ignoring unreadable reuse index %s: %s", meta_path, exc)
            continue
        if meta.get("key") != key:
            continue
        when = float(meta.get("written_at") or meta_path.stat().st_mtime)
        if newest is None or when > newest[0]:
            newest = (when, run_root)
    return ReuseSource.open(newest[1]) if newest else None


def _with_origin(line: bytes, run_folder: str) -> bytes:
    """The completion line with ``"reused_from"`` appended (spliced: the text is not parsed)."""
    body = line.rstrip(b"\n")
    if not body.endswith(b"}"):
        raise ValueError("not a JSON object line")
    return body[:-1] + b',"reused_from":' + jsonio.dumps(run_folder) + b"}\n"


def copy_reused(store, pending: Iterator[tuple[int, int, int, Prompt]], source: ReuseSource,
                batch: int = 4096) -> int:
    """Copy into ``store`` every pending prompt's completion that ``source`` holds; the number copied.

    A line that does not start with the prompt's id (the earlier run's files changed since its index
    was written) is not reused: that prompt is generated instead.
    """
    copied = 0
    chunk: list[Prompt] = []

    def flush() -> int:
        count = 0
        digests = [prompt_hash(prompt) for prompt in chunk]
        for prompt, digest, hit in zip(chunk, digests, source.find(digests)):
            if hit is None:
                continue
            line = source.read_line(*hit)
            if not line.startswith(b'{"id":' + jsonio.dumps(prompt.id) + b","):
                continue
            try:
                copied_line = _with_origin(line, source.run_folder)
                record = jsonio.loads(copied_line)
            except (ValueError, jsonio.JSONDecodeError):
                continue
            store.record_completion(copied_line, jsonio.dumps(stats_record(record)) + b"\n", prompt.id,
                                    prompt_hash=digest)
            count += 1
        chunk.clear()
        return count

    for _, _, _, prompt in pending:
        chunk.append(prompt)
        if len(chunk) >= batch:
            copied += flush()
    return copied + flush()

