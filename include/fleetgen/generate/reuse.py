"""Regenerate only what changed: reuse a completion from an earlier successful run when nothing that
shapes it changed (docs/output-formats.md §3.9).

A completion is reused when all three are unchanged:

- the prompt: ``prompt_hash`` covers its id, its messages (or bare prompt) and its own sampling overrides;
- the model: every part of its identity read on the node (``fleetgen.tuning.model_files.model_identity``:
  path, weights, ``config.json``, ``generation_config.json``, tokenizer, chat template, SGLang version);
- the run's sampling: ``max_tokens``, ``temperature``, ``top_p`` and the extra request body.

The last two make the run's ``generation_material`` and its hash, the ``generation_key``; an earlier run is
a source only when its key is the same, and only when the launches its shards accepted completions from match the
model identity its key claims: its ``index.json`` records, per server, the launch ``wait_ready`` read back (model
path, launch identity, SGLang version: ``accepted_launches``), the launch every completion had to name
(nodes/launch_identity.py). A completion it copied from an earlier run was checked the same way when it was
copied.

Each shard writes, beside every completion it records, a row
``{"h": prompt hash, "o": byte offset, "n": bytes, "c": line checksum}`` of its completions file
(``reuse/shard-NNNNN.jsonl``); once a run's validation passed, those rows become its compact index
(``reuse/index.npy``: 40 bytes per completion, sorted by hash; ``reuse/index.json`` holds its checksum)
without reading a completion's text. Tonight's shard looks its prompts up there, copies each hit's line
into its own completions file, so tonight's folder is complete on its own, and generates only the rest.

Reuse can only save work: an earlier run that cannot be read (its index torn or not matching its checksum,
its completions pruned, a line changed since it was indexed) means those prompts are generated again,
logged and counted (``ReuseSource.regenerated``, ``ReuseLookup.skipped``), never a failed shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.nodes import launch_identity
from fleetgen.nodes.remote import as_expanded
from fleetgen.outputs import RunLayout
from fleetgen.prompts.scan import Prompt
from fleetgen.validation.outcome import read_summary, why_not_passed

INDEX_DTYPE = np.dtype([("h1", "<u8"), ("h2", "<u8"), ("shard", "<u4"), ("bytes", "<u4"), ("offset", "<u8"),
                        ("check", "<u8")])
HASH_BYTES = 16
LINE_CHECK_BYTES = 8
# Why a prompt an earlier run held was generated again (the keys of ReuseSource.regenerated).
SOURCE_UNREADABLE = "source completions missing or unreadable"
LINE_CHANGED = "line changed since it was indexed"
# What a run's index records of each launch its shards accepted completions from, as wait_ready read its
# /server_info: the checkpoint (readiness.LAUNCH_FIELDS' model_path), the launch identity every completion had to
# name (launch_identity.FIELD) and SGLang's version (ServerInfo.version); keys as SGLang names the fields.
MODEL_PATH, SGLANG_VERSION = "model_path", "version"
ACCEPTED_LAUNCH_FIELDS = (MODEL_PATH, launch_identity.FIELD, SGLANG_VERSION)
# A reused line ends with the run that generated its text; a line copied again keeps that one.
_ORIGIN_SUFFIX = re.compile(rb',"reused_from":("(?:[^"\\]|\\.)*")\}\Z')


def prompt_hash(prompt: Prompt) -> bytes:
    """16 bytes that change whenever the prompt's id, text or own sampling overrides change."""
    content = jsonio.dumps([prompt.id, prompt.messages, prompt.prompt, prompt.sampling])
    return hashlib.blake2b(content, digest_size=HASH_BYTES).digest()


def line_checksum(line: bytes) -> str:
    """The hex checksum a reuse row keeps of its completion line, checked before the line is copied."""
    return hashlib.blake2b(line, digest_size=LINE_CHECK_BYTES).hexdigest()


def reuse_row(digest: bytes, offset: int, line: bytes) -> bytes:
    """The reuse row of a completion ``line`` at ``offset`` of its shard's completions (docs/output-formats.md §3.9):
    its prompt's hash, where it lies and its checksum."""
    return b'{"h":"%s","o":%d,"n":%d,"c":"%s"}\n' % (digest.hex().encode(), offset, len(line),
                                                      line_checksum(line).encode())


def generation_material(model_identity: dict, *, max_tokens: int, temperature: float, top_p: float,
                        extra_body: dict) -> dict:
    """What, beside the prompt, decides a completion: each part of the model's identity and the run's
    sampling; kept in the run's ``reuse/index.json`` so a later run can say which part changed."""
    return {"model": dict(model_identity["parts"]),
            "sampling": {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p},
            "extra_body": extra_body}


def generation_key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def changed_parts(before: dict | None, now: dict) -> list[str]:
    """The parts of ``now``'s generation material that differ from ``before`` (``model.weights``,
    ``sampling.top_p``, ``extra_body``, ...); every part when ``before`` was not recorded."""
    before = before or {}
    changed = []
    for group in sorted(set(now) | set(before)):
        old, new = before.get(group), now.get(group)
        if isinstance(new, dict) and isinstance(old, dict) and group != "extra_body":
            changed += [f"{group}.{part}" for part in sorted(set(old) | set(new)) if old.get(part) != new.get(part)]
        elif old != new:
            changed.append(group)
    return changed


def _split(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs = digests.view("<u8").reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _replace_atomically(path: Path, write) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def accepted_launches(readiness: list[dict]) -> dict[str, dict]:
    """Per server, the launch the run's shards accepted completions from: ``wait_ready``'s readback of each server
    (its ``launch_fields`` and ``version``), which every shard's endpoints are built from and every completion is
    checked against (generate/settings.py ``shard_endpoints``); a field the server did not report is None."""
    launches = {}
    for ready in readiness:
        read = {**(ready.get("launch_fields") or {}), SGLANG_VERSION: ready.get(SGLANG_VERSION)}
        launches[ready["server"]] = {name: read.get(name) for name in ACCEPTED_LAUNCH_FIELDS}
    return launches


def launch_mismatch(meta: dict) -> str | None:
    """Why the launches an index records do not match the model identity it claims (``material.model``: its path
    and SGLang version), naming the server and each field; None when every launch matches. An index that records
    no launch is refused too: what wrote its completions is not known."""
    launches, model = meta.get("launches"), (meta.get("material") or {}).get("model") or {}
    if not isinstance(launches, dict) or not launches:
        return "its index records no launch its completions were accepted from"
    claimed = {MODEL_PATH: model.get("path"), SGLANG_VERSION: model.get("sglang")}
    for server, launch in sorted(launches.items()):
        read = {name: launch.get(name) if isinstance(launch, dict) else None for name in ACCEPTED_LAUNCH_FIELDS}
        path_matches = (isinstance(read[MODEL_PATH], str) and isinstance(claimed[MODEL_PATH], str)
                        and as_expanded(read[MODEL_PATH], claimed[MODEL_PATH]))  # the launch passes ~/ expandable
        differ = [f"{name} {read[name]!r}, not the identity's {claimed[name]!r}" for name in claimed
                  if not (path_matches if name == MODEL_PATH else read[name] == claimed[name])]
        if differ:
            who = launch_identity.describe(read[launch_identity.FIELD])
            return f"its completions were accepted from {server} ({who}), whose launch read back {'; '.join(differ)}"
    return None


def write_reuse_index(layout: RunLayout, *, material: dict, run_id: str, launches: dict[str, dict]) -> int:
    """Compact the run's ``reuse/shard-*.jsonl`` rows into ``reuse/index.npy`` (+ ``index.json`` with its
    checksum, the generation material and the ``launches`` its shards accepted completions from:
    ``accepted_launches``); the number of completions indexed. Call only once the run's validation passed. Each
    file is replaced whole; a crash between the two leaves a checksum that does not match, so no later run reads a
    torn index."""
    parts = []
    for path in layout.shard_files("reuse"):
        shard = int(path.stem.rsplit("-", 1)[1])
        rows = []
        with path.open("rb") as handle:
            for line in handle:
                try:
                    row = jsonio.loads(line)
                    rows.append((bytes.fromhex(row["h"]), int(row["o"]), int(row["n"]),
                                 int.from_bytes(bytes.fromhex(row["c"]), "little")))
                except (ValueError, KeyError, TypeError, jsonio.JSONDecodeError):
                    continue  # a torn last row, or one without a checksum: that completion is not reusable
        if not rows:
            continue
        part = np.zeros(len(rows), dtype=INDEX_DTYPE)
        h1, h2 = _split(np.frombuffer(b"".join(row[0] for row in rows), dtype=np.uint8))
        part["h1"], part["h2"], part["shard"] = h1, h2, shard
        part["offset"] = [row[1] for row in rows]
        part["bytes"] = [row[2] for row in rows]
        part["check"] = [row[3] for row in rows]
        parts.append(part)
    index = np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)
    index.sort(order=("h1", "h2"))
    layout.reuse_index.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(layout.reuse_index, lambda handle: np.save(handle, index))
    meta = {"key": generation_key(material), "material": material, "launches": launches, "run_id": run_id,
            "run_folder": layout.root.name, "completions": int(len(index)), "written_at": time.time(),
            "index_bytes": layout.reuse_index.stat().st_size, "index_sha256": _file_sha256(layout.reuse_index)}
    _replace_atomically(layout.reuse_index_meta, lambda handle: handle.write(json.dumps(meta).encode()))
    return int(len(index))


class SourceUnusable(Exception):
    """An earlier run's index cannot be used (the message says why); its prompts are generated again."""


@dataclass
class ReuseSource:
    """An earlier run's index, memory-mapped; ``find`` looks many prompt hashes up at once.
    ``regenerated`` counts, by reason, the prompts it held that could not be copied."""

    layout: RunLayout
    index: np.ndarray
    run_folder: str
    log: logging.Logger | None = None
    regenerated: Counter = field(default_factory=Counter)
    _handles: dict = field(default_factory=dict)

    @classmethod
    def open(cls, run_root: Path, meta: dict, log: logging.Logger | None = None) -> ReuseSource:
        """Raises ``SourceUnusable`` unless the index is whole: its size and SHA-256 those of ``meta``."""
        layout = RunLayout(run_root)
        path = layout.reuse_index
        if "index_sha256" not in meta:
            raise SourceUnusable(f"{layout.reuse_index_meta} records no checksum of {path.name}")
        try:
            size = path.stat().st_size
            if size != meta.get("index_bytes"):
                raise SourceUnusable(f"{path} is {size} bytes, its index.json recorded {meta.get('index_bytes')}")
            if _file_sha256(path) != meta["index_sha256"]:
                raise SourceUnusable(f"{path} does not match the SHA-256 its index.json recorded")
            index = np.load(path, mmap_mode="r")
        except OSError as exc:
            raise SourceUnusable(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise SourceUnusable(f"{path} is not a reuse index: {exc}") from None
        if index.dtype != INDEX_DTYPE:
            raise SourceUnusable(f"{path} holds {index.dtype}, not a reuse index of this version")
        return cls(layout, index, run_root.name, log)

    def find(self, digests: list[bytes]) -> list[tuple[int, int, int, int] | None]:
        """(shard, offset, bytes, line checksum) of each digest's completion in this run, or None."""
        if not digests or not len(self.index):
            return [None] * len(digests)
        h1, h2 = _split(np.frombuffer(b"".join(digests), dtype=np.uint8))
        position = np.searchsorted(self.index["h1"], h1)
        found: list[tuple[int, int, int, int] | None] = []
        for where, first, second in zip(position, h1, h2):
            hit = None
            while where < len(self.index) and self.index["h1"][where] == first:
                entry = self.index[where]
                if entry["h2"] == second:
                    hit = (int(entry["shard"]), int(entry["offset"]), int(entry["bytes"]), int(entry["check"]))
                    break
                where += 1
            found.append(hit)
        return found

    def read_line(self, shard: int, offset: int, length: int) -> bytes | None:
        """The bytes at ``offset`` of the source's completions file of ``shard``; None when that file is gone
        or unreadable (logged once per file)."""
        handle = self._handles.get(shard, False)
        if handle is False:
            path = self.layout.shard_file("completions", shard)
            try:
                handle = path.open("rb")
            except OSError as exc:
                handle = None
                if self.log is not None:
                    self.log.warning("reuse: cannot read %s (%s): its completions are generated again",
                                     path, exc.strerror or exc)
            self._handles[shard] = handle
        if handle is None:
            return None
        try:
            handle.seek(offset)
            return handle.read(length)
        except OSError:
            return None

    def close(self) -> None:
        for handle in self._handles.values():
            if handle:
                handle.close()
        self._handles.clear()


@dataclass
class ReuseLookup:
    """Which earlier run tonight reuses from, the runs passed over and why, and, when no earlier run has
    tonight's key, which parts differ from the newest indexed run's."""

    source: ReuseSource | None
    skipped: list[dict] = field(default_factory=list)  # [{"run": folder, "reason": text}]
    changed: dict | None = None  # {"run": folder, "parts": ["model.weights", ...]}

    def summary(self) -> dict:
        """JSON-safe, for the shard's result and the report (``report["reuse"]``)."""
        return {"source": self.source.run_folder if self.source else None, "skipped": self.skipped,
                "changed": self.changed,
                "regenerated": dict(self.source.regenerated) if self.source else {}}


@dataclass(frozen=True)
class Candidate:
    """An earlier run with a reuse index: its folder's name, its ``index.json`` and when that was written."""

    run: str
    meta: dict
    written_at: float


def look_up_reuse(output_root: Path, current_run_folder: str, material: dict,
                  log: logging.Logger | None = None) -> ReuseLookup:
    """The newest other run under ``output_root`` whose index was written for the same generation material
    and can be read; an older one with the same key when the newest cannot."""
    candidates, skipped = [], []
    for meta_path in Path(output_root).glob(f"*/{RunLayout(Path()).reuse_index_meta}"):
        run_root = meta_path.parent.parent
        if run_root.name == current_run_folder:
            continue
        try:
            meta = json.loads(meta_path.read_text())
            candidates.append(Candidate(run_root.name, meta, float(meta.get("written_at") or meta_path.stat().st_mtime)))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            skipped.append({"run": run_root.name, "reason": f"cannot read {meta_path}: {exc}"})

    def not_passed(run: str) -> str | None:
        layout = RunLayout(Path(output_root) / run)
        return why_not_passed(layout, read_summary(layout))

    return choose_source(candidates, material, skipped=skipped, not_passed=not_passed,
                         open_source=lambda run, meta: ReuseSource.open(Path(output_root) / run, meta, log), log=log)


def choose_source(candidates: list[Candidate], material: dict, *, skipped: list[dict], not_passed,
                  open_source, log: logging.Logger | None) -> ReuseLookup:
    """The newest of ``candidates`` indexed for ``material`` that passed its validation (``not_passed(run)`` None),
    was generated by the servers it was indexed under and opens (``open_source(run, meta)``, which raises
    ``SourceUnusable``); the runs passed over and why; what differs from the newest run indexed for other material."""
    key = generation_key(material)
    lookup = ReuseLookup(source=None, skipped=list(skipped))
    same_key = sorted((candidate for candidate in candidates if candidate.meta.get("key") == key),
                      key=lambda candidate: candidate.written_at, reverse=True)
    others = [candidate for candidate in candidates if candidate.meta.get("key") != key]
    for candidate in same_key:
        # Indexed only once validated, but the index may predate that rule or a later failed validate.
        reason = not_passed(candidate.run)
        if reason is None:  # its text came from other servers than the identity it was indexed under
            reason = launch_mismatch(candidate.meta)
        if reason is not None:
            lookup.skipped.append({"run": candidate.run, "reason": reason})
            continue
        try:
            lookup.source = open_source(candidate.run, candidate.meta)
            break
        except SourceUnusable as exc:
            lookup.skipped.append({"run": candidate.run, "reason": str(exc)})
    if not same_key and others:
        newest = max(others, key=lambda candidate: candidate.written_at)
        lookup.changed = {"run": newest.run, "parts": changed_parts(newest.meta.get("material"), material)}
    if log is not None:
        for skipped_run in lookup.skipped:
            log.warning("reuse: passing over run %s: %s", skipped_run["run"], skipped_run["reason"])
        if lookup.changed:
            log.info("reuse: the newest indexed run %s was generated with a different %s", lookup.changed["run"],
                     ", ".join(lookup.changed["parts"]))
    return lookup


def _with_origin(line: bytes, run_folder: str) -> bytes:
    """The completion line ending with one ``"reused_from"``: the run that generated its text (the one it
    already names when it was itself copied, else ``run_folder``). Spliced: the text is not re-encoded."""
    body = line.rstrip(b"\n")
    if not body.endswith(b"}"):
        raise ValueError("not a JSON object line")
    origin = None
    while (match := _ORIGIN_SUFFIX.search(body)) is not None:  # innermost last: the generating run
        origin = match.group(1)
        body = body[:match.start()] + b"}"
    return body[:-1] + b',"reused_from":' + (origin or jsonio.dumps(run_folder)) + b"}\n"


def copy_reused(store, pending: Iterator[tuple[int, int, int, Prompt]], source: ReuseSource,
                batch: int = 4096) -> int:
    """Copy into ``store`` every pending prompt's completion that ``source`` holds; the number copied.

    A line that cannot be read, or no longer has its recorded length, checksum and prompt id (the earlier
    run's files changed since its index was written), is not reused: that prompt is generated instead and
    counted in ``source.regenerated``.
    """
    copied = 0
    chunk: list[Prompt] = []

    def flush() -> int:
        count = 0
        digests = [prompt_hash(prompt) for prompt in chunk]
        for prompt, digest, hit in zip(chunk, digests, source.find(digests)):
            if hit is None:
                continue
            shard, offset, length, check = hit
            line = source.read_line(shard, offset, length)
            if line is None:
                source.regenerated[SOURCE_UNREADABLE] += 1
                continue
            if (len(line) != length or line_checksum(line) != check.to_bytes(LINE_CHECK_BYTES, "little").hex()
                    or not line.startswith(b'{"id":' + jsonio.dumps(prompt.id) + b",")):
                source.regenerated[LINE_CHANGED] += 1
                continue
            try:
                copied_line = _with_origin(line, source.run_folder)
                record = jsonio.loads(copied_line)
            except (ValueError, jsonio.JSONDecodeError):
                source.regenerated[LINE_CHANGED] += 1
                continue
            store.record_completion(copied_line, jsonio.dumps(stats_record(record)) + b"\n", prompt.id,
                                    prompt_hash=digest)
            count += 1
        chunk.clear()
        return count

    try:
        for _, _, _, prompt in pending:
            chunk.append(prompt)
            if len(chunk) >= batch:
                copied += flush()
        copied += flush()
    finally:
        source.close()
    if source.regenerated and source.log is not None:
        source.log.warning("reuse: %d prompt(s) run %s held are generated again: %s",
                           sum(source.regenerated.values()), source.run_folder, dict(source.regenerated))
    return copied
