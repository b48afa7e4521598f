"""Reading, validating and sharding the prompts file.

The prompts file is JSONL, one object a line: ``{"id": str, "messages": [...]}`` (chat, possibly
multi-turn) or ``{"id": str, "prompt": str}``, with an optional ``"sampling"`` object of per-prompt
overrides (keys in ``SAMPLING_OVERRIDES``). Other top-level keys are carried along unread. A file in the
OpenAI Batch API's input format is read the same way (:mod:`fleetgen.prompts.batch_api`); one file holds one
format. Parsing and checking one line lives in :mod:`fleetgen.prompts.lines` (its public names are re-exported
here); this module deals with the file as a whole.

Two kinds of problem are told apart:

- *structural*: the line is not a JSON object, has no usable ``id``, or repeats an id. The file
  cannot be trusted (ids are what resume and validation key on), so ``scan_prompts`` raises
  ``PromptsError`` listing the first ``max_listed`` problems with their line numbers, then a count.
- *per-prompt*: the line names itself (a good id) but its content is unusable (empty messages, a
  message without a role, a sampling override of the wrong type), or, when the scan is given a
  ``LengthLimit``, it is too long for the context (:mod:`fleetgen.prompts.length`). It goes to the
  rejects file and the run proceeds without it. A shard's reader (:mod:`fleetgen.prompts.planned`) applies
  the same tests (the limit travels in each shard), so shards skip the same lines.

Shards are ``(start byte, end byte, count of valid prompts)`` ranges over the file itself; no copy is
made. What a run reads is fixed when it is planned (docs/shards.md §5): the scan keeps a SHA-256 digest of
every block of ``INDEX_STRIDE`` valid prompts (from the block's first valid line to the next block's, the
last one to the end of the file as scanned) and each shard carries the blocks it overlaps; reading them
back, checked, is :mod:`fleetgen.prompts.planned`. A file edited between two tries of a shard is refused
with what changed; lines appended after the scan are never read by the run.

Token estimates use ~4 characters per token over message contents (chat template tokens are not
counted; see :mod:`fleetgen.prompts.length`): they size the plan's context and set aside prompts too
long for it, never anything that must be exact.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import jsonlines
import orjson

from fleetgen.errors import PromptsError
from fleetgen.prompts.length import (CHARS_PER_TOKEN, LengthLimit, cap_cut_limit,  # noqa: F401 (re-exported)
                                     estimated_tokens)
from fleetgen.prompts.lines import (FLEETGEN_FORMAT, ROLES, SAMPLING_OVERRIDES, Prompt,  # noqa: F401 (re-exported)
                                    fast_id, mixed_formats, parse_line, read_fields, shorten)

CHANGED_SINCE_SCAN = "the prompts file changed after it was scanned; start a new run"
# What a compressed file starts with, and the command that decompresses it beside the original: the scan reads
# plain JSONL only (byte ranges of the file itself are the shards).
COMPRESSED_MAGIC = {b"\x1f\x8b": ("gzip", "gunzip -k"), b"BZh": ("bzip2", "bunzip2 -k"),
                    b"\xfd7zXZ\x00": ("xz", "unxz -k"), b"\x28\xb5\x2f\xfd": ("zstd", "unzstd")}
INDEX_STRIDE = 1000  # one (valid prompts before, byte offset) pair per this many valid prompts
DIGEST_HEX_CHARS = 32  # 128 bits of SHA-256 per block: plenty to tell an edit, half the XCom size


@dataclass(frozen=True)
class LongestPrompt:
    """The accepted prompt with the most estimated tokens: the one that sets the context the plan sizes."""

    id: str
    line: int
    prompt_tokens: int  # estimated (CHARS_PER_TOKEN)


@dataclass(frozen=True)
class PromptScan:
    """What one pass over the prompts file found; JSON-safe through ``to_dict``."""

    path: str
    count: int  # valid prompts
    rejected: int
    bytes: int
    mtime_ns: int
    lines: int
    prompt_chars_mean: float
    prompt_chars_max: int
    rejects_path: str | None = None
    too_long: int = 0  # of the rejected: longer than the length limit's context
    length_limit: dict | None = None  # LengthLimit.to_dict() the scan applied; shards apply it too
    # (valid prompts before this line, byte offset of the line) every INDEX_STRIDE valid prompts:
    # enough to find any shard start without keeping an offset per line.
    index: tuple[tuple[int, int], ...] = ()
    # SHA-256 (first DIGEST_HEX_CHARS hex) of each index block's bytes: from its entry's offset to the next
    # entry's, the last to ``bytes``. What fixes the run's prompts at plan time.
    digests: tuple[str, ...] = ()
    # The largest per-prompt "sampling.max_tokens" among the accepted prompts (None: no prompt sets one);
    # the plan's output budget covers it (docs/shards.md §4).
    own_max_tokens_max: int | None = None
    # With a length limit: the largest estimated prompt tokens + that prompt's max_tokens of the accepted.
    request_tokens_max: int | None = None
    # With a length limit: the median of the same (what max_cap_cut_factor measures a request against).
    request_tokens_median: int | None = None
    # The accepted prompt with the most estimated tokens (LongestPrompt as a dict) and the most of the others:
    # what the context, and so every server's cap, is with and without it.
    longest: dict | None = None
    runner_up_prompt_tokens: int | None = None
    # The file's format (lines.FLEETGEN_FORMAT or batch_api.BATCH_FORMAT): its first line naming a prompt decided it.
    format: str = FLEETGEN_FORMAT
    # Accepted Batch API requests whose body.model is not the run's model (generated with the run's: §1.1), and the
    # first of them ({"line", "model"}); counted only when the scan is told the run's model.
    other_model_lines: int = 0
    other_model: dict | None = None

    @property
    def est_prompt_tokens_mean(self) -> float:
        return self.prompt_chars_mean / CHARS_PER_TOKEN

    @property
    def est_prompt_tokens_max(self) -> int:
        return math.ceil(self.prompt_chars_max / CHARS_PER_TOKEN)

    def to_dict(self) -> dict:
        """JSON-safe (the index is ~1,000 pairs for a million prompts: fine for XCom)."""
        data = asdict(self)
        data["index"] = [list(pair) for pair in self.index]
        data["digests"] = list(self.digests)
        data["est_prompt_tokens_mean"] = round(self.est_prompt_tokens_mean, 1)
        data["est_prompt_tokens_max"] = self.est_prompt_tokens_max
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PromptScan":
        """Back from ``to_dict``, e.g. to hand the scan task's result to ``plan_shards``."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["index"] = tuple((int(a), int(b)) for a, b in values.get("index", ()))
        values["digests"] = tuple(str(digest) for digest in values.get("digests", ()))
        return cls(**values)

    def blocks(self) -> list[list]:
        """``[first valid prompt, start byte, end byte, digest]`` per index block (empty without digests)."""
        if len(self.digests) != len(self.index):
            return []
        ends = [offset for _, offset in self.index[1:]] + [self.bytes]
        return [[first, offset, end, digest]
                for (first, offset), end, digest in zip(self.index, ends, self.digests)]

    def output_tokens_max(self, run_max_tokens: int) -> int:
        """The largest output budget any accepted prompt asks for: its own max_tokens or the run's."""
        return max(run_max_tokens, self.own_max_tokens_max or 0)


def compression_of(path: str | os.PathLike) -> tuple[str, str] | None:
    """``(format, command that decompresses it)`` when the file starts like a compressed one, else None (an
    unreadable file too: the scan says why it cannot read it)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(max(len(magic) for magic in COMPRESSED_MAGIC))
    except OSError:
        return None
    return next((found for magic, found in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)


def scan_prompts(path: str | os.PathLike, *, rejects_path: str | os.PathLike | None = None,
                 max_listed: int = 20, length_limit: LengthLimit | None = None,
                 max_cap_cut_factor: float = 0.0, run_model: str | None = None) -> PromptScan:
    """Validate the whole file in one pass; write per-prompt rejects; raise on structural problems.

    With ``length_limit``, prompts too long for its context are rejected too (``too_long`` counts
    them) and the prompt-length statistics cover the accepted prompts only. With ``max_cap_cut_factor``
    too, a prompt whose request needs more than that many times the median request's tokens is set aside
    as well (``cap_cut_limit``): the file is scanned a second time, only when such a prompt is there, under
    that tighter limit, so that the rejects, counts, index and shards all see the same prompts.

    The rejects file (JSONL ``{"line", "id", "error"}``) appears only when the scan finds no structural
    problem, so a file that cannot be trusted leaves nothing behind for a later run to trip over; when
    every prompt was rejected it is kept, and the error names it and lists the first reasons.

    The scan also fixes what the run will read: one digest per index block (``digests``), and the
    largest per-prompt ``max_tokens`` and request (``own_max_tokens_max``, ``request_tokens_max``).

    The file is in one format, fleetgen's or the OpenAI Batch API's (``format``): the first line that names a
    prompt decides, and a line of the other format is a structural problem. With ``run_model``, the accepted Batch
    API requests naming another model are counted (``other_model_lines``).
    """
    if max_cap_cut_factor and length_limit is None:
        raise ValueError("max_cap_cut_factor needs the length_limit that gives each prompt its output budget")
    scan = _scan_once(Path(path), rejects_path, max_listed, length_limit, run_model)
    tighter = cap_cut_limit(length_limit, scan.request_tokens_median, scan.request_tokens_max, max_cap_cut_factor)
    return scan if tighter is None else _scan_once(Path(path), rejects_path, max_listed, tighter, run_model)


def _scan_once(path: Path, rejects_path: str | os.PathLike | None, max_listed: int,
               length_limit: LengthLimit | None, run_model: str | None) -> PromptScan:
    try:
        stat = path.stat()
    except OSError as exc:
        raise PromptsError(f"cannot read the prompts file: {exc.strerror}", path=str(path),
                           hint="check the prompts_path parameter and that the file is readable "
                                "from the worker") from exc
    rejects = Path(rejects_path) if rejects_path is not None else None
    partial = rejects.with_name(rejects.name + ".partial") if rejects is not None else None
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as handle, (partial.open("wb") if partial is not None else open(os.devnull, "wb")) as sink, \
            jsonlines.Writer(sink, dumps=orjson.dumps) as out:
        tally = _Tally(max_listed=max_listed, length_limit=length_limit, rejects=out, run_model=run_model)
        add = tally.add  # bound once: a call per line of a file of millions
        for number, raw in enumerate(handle, 1):
            add(number, raw)
    tally.close_block()
    if tally.problem_count:
        if partial is not None:
            partial.unlink()
        _raise_structural(path, tally)
    if partial is not None:  # kept when every prompt was rejected too: the error below points at it
        os.replace(partial, rejects)
    if tally.count == 0:
        _raise_none_valid(path, tally, rejects)
    return tally.scan(path, stat.st_mtime_ns, rejects, length_limit)


@dataclass
class _Tally:
    """What one pass has found so far, a line at a time (``add``)."""

    max_listed: int
    length_limit: LengthLimit | None
    rejects: jsonlines.Writer
    lines: int = 0
    offset: int = 0
    count: int = 0
    rejected: int = 0
    too_long: int = 0
    problem_count: int = 0
    chars_total: int = 0
    chars_max: int = 0
    own_max_tokens_max: int | None = None
    request_tokens_max: int | None = None
    problems: list[tuple[int, str]] = field(default_factory=list)
    reject_reasons: list[tuple[int, str]] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)
    duplicates: dict[str, list[int]] = field(default_factory=dict)
    index: list[tuple[int, int]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    block: Any = None  # the running digest of the current index block
    # every accepted prompt's request tokens, under a length limit: the median max_cap_cut_factor measures from
    requests: array = field(default_factory=lambda: array("q"))
    longest: tuple[str, int] | None = None  # (id, line) of the accepted prompt with the most characters
    runner_up_chars: int | None = None  # the most characters among the accepted but the longest
    run_model: str | None = None
    file_format: str | None = None  # the format of the first line naming a prompt, at format_line
    format_line: int = 0
    other_model_lines: int = 0
    other_model: dict | None = None

    def add(self, number: int, raw: bytes) -> None:
        line_offset, self.offset, self.lines = self.offset, self.offset + len(raw), number
        if raw.strip():
            self._judge(number, raw, line_offset)
        if self.block is not None:  # every byte from the first valid prompt on, blank and rejected lines too
            self.block.update(raw)

    def _judge(self, number: int, raw: bytes, line_offset: int) -> None:
        prompt, structural, per_prompt, prompt_id, line_format, model = read_fields(raw)
        if prompt is not None and self.length_limit is not None and (per_prompt := self.length_limit.problem(prompt)):
            self.too_long += 1
        if prompt_id is not None:
            if prompt_id in self.seen_ids:
                self.duplicates.setdefault(prompt_id, []).append(number)
                structural = f"duplicate id {shorten(repr(prompt_id))}"
            else:
                self.seen_ids.add(prompt_id)
            if self.file_format is None:
                self.file_format, self.format_line = line_format, number
            elif line_format != self.file_format:
                structural = mixed_formats(line_format, self.file_format, self.format_line)
        if structural:
            self.problem_count += 1
            if len(self.problems) < self.max_listed:
                self.problems.append((number, structural))
        elif per_prompt:
            self.rejected += 1
            self.rejects.write({"line": number, "id": prompt_id, "error": per_prompt})
            if len(self.reject_reasons) < self.max_listed:
                self.reject_reasons.append((number, per_prompt))
        else:
            self._accept(number, prompt, line_offset)
            if model is not None and self.run_model is not None and model != self.run_model:
                self.other_model_lines += 1
                self.other_model = self.other_model or {"line": number, "model": model}

    def _accept(self, number: int, prompt: Prompt, line_offset: int) -> None:
        if self.count % INDEX_STRIDE == 0:
            self.index.append((self.count, line_offset))
            self.close_block()
            self.block = hashlib.sha256()
        self.count += 1
        chars = prompt.content_chars()
        self.chars_total += chars
        if self.longest is None or chars > self.chars_max:
            self.runner_up_chars = self.chars_max if self.longest is not None else None
            self.chars_max, self.longest = chars, (prompt.id, number)
        elif self.runner_up_chars is None or chars > self.runner_up_chars:
            self.runner_up_chars = chars
        own = prompt.sampling.get("max_tokens")
        if own is not None:
            self.own_max_tokens_max = max(own, self.own_max_tokens_max or 0)
        if self.length_limit is not None:
            request = self.length_limit.request_tokens(prompt)
            self.request_tokens_max = max(request, self.request_tokens_max or 0)
            self.requests.append(request)

    def close_block(self) -> None:
        if self.block is not None:
            self.digests.append(self.block.hexdigest()[:DIGEST_HEX_CHARS])
            self.block = None

    def scan(self, path: Path, mtime_ns: int, rejects: Path | None, length_limit: LengthLimit | None) -> PromptScan:
        return PromptScan(
            path=str(path), count=self.count, rejected=self.rejected, bytes=self.offset, mtime_ns=mtime_ns,
            lines=self.lines, prompt_chars_mean=self.chars_total / self.count, prompt_chars_max=self.chars_max,
            rejects_path=str(rejects) if rejects is not None else None, index=tuple(self.index),
            too_long=self.too_long, length_limit=length_limit.to_dict() if length_limit is not None else None,
            digests=tuple(self.digests), own_max_tokens_max=self.own_max_tokens_max,
            request_tokens_max=self.request_tokens_max,
            request_tokens_median=int(statistics.median_low(self.requests)) if self.requests else None,
            longest=asdict(LongestPrompt(*self.longest, prompt_tokens=estimated_tokens(self.chars_max)))
            if self.longest is not None else None,
            runner_up_prompt_tokens=estimated_tokens(self.runner_up_chars) if self.runner_up_chars is not None
            else None, format=self.file_format or FLEETGEN_FORMAT, other_model_lines=self.other_model_lines,
            other_model=self.other_model)


def _raise_structural(path: Path, tally: _Tally) -> None:
    problems = _name_first_occurrences(path, tally.duplicates, tally.problems) if tally.duplicates else tally.problems
    listed = "\n".join(f"  line {line}: {message}" for line, message in problems)
    more = f"\n  ... and {tally.problem_count - len(problems)} more" if tally.problem_count > len(problems) else ""
    raise PromptsError(
        f"{tally.problem_count} structural problem(s) in the prompts file:\n{listed}{more}",
        problems=problems, path=str(path), line=problems[0][0],
        hint="fix these lines (each needs valid JSON and a unique string id: \"custom_id\" in a Batch API file, "
             "all in one format) and start the run again")


def _raise_none_valid(path: Path, tally: _Tally, rejects: Path | None) -> None:
    reasons, rejected = tally.reject_reasons, tally.rejected
    listed = "".join(f"\n  line {line}: {reason}" for line, reason in reasons)
    more = f"\n  ... and {rejected - len(reasons)} more" if rejected > len(reasons) else ""
    where = f"; every reason is in {rejects}" if rejects is not None and rejected else ""
    raise PromptsError(f"no valid prompts ({rejected} rejected, {tally.lines} lines){where}{listed}{more}",
                       path=str(path), line=reasons[0][0] if reasons else None,
                       hint="check that prompts_path is the prompts JSONL" + (
                           " and fix the rejected lines (or raise the context: the context_length param or "
                           "--context-length in the fleet's server.extra_args, when they are too long)"
                           if rejected else ""))


def _name_first_occurrences(path: Path, duplicates: dict[str, list[int]],
                            problems: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Second, cheap pass only when ids repeat: say where each repeated id first appeared."""
    first_line: dict[str, int] = {}
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            raw_id = fast_id(raw)
            candidate = raw_id.decode("utf-8", "replace") if raw_id is not None else None
            if candidate is None and raw.strip():
                _, _, _, candidate = parse_line(raw)
            if candidate in duplicates and candidate not in first_line:
                first_line[candidate] = number
    repeated_at = {line: prompt_id for prompt_id, lines in duplicates.items() for line in lines}
    return [(line, f"{message} (first at line {first_line[repeated_at[line]]})" if line in repeated_at else message)
            for line, message in problems]


def shard_size_within(count: int, shard_size: int, max_shards: int) -> int:
    """The shard size to use so that ``count`` prompts make at most ``max_shards`` shards.

    Airflow refuses to map more tasks than ``[core] max_map_length`` (1,024 by default); rather than
    fail a 900K-prompt run asked for in shards of 500, the shards grow just enough to fit.
    """
    if max_shards < 1:
        raise ValueError(f"max_shards must be >= 1, got {max_shards}")
    return max(shard_size, math.ceil(count / max_shards)) if count else shard_size


def plan_shards(path: str | os.PathLike, *, shard_size: int, scan: PromptScan | None = None,
                head: int = 0) -> list[dict]:
    """Cut the valid prompts into shards of ``shard_size``:
    ``[{shard_id, input_path, start, end, first, count, blocks}]``. With ``head``, the first ``head`` prompts are
    cut on their own (the tuning trial's shards) and the shards of the rest follow them, with the next ids.

    ``start`` is the byte offset of the shard's first valid prompt, ``end`` the next shard's start (the
    last shard's: the end of the file as scanned), ``first`` its index among the valid prompts (the
    shard's label in the Airflow UI), ``blocks`` the scan's digested blocks the range overlaps
    (``PromptScan.blocks``), which the shard checks before reading. Uses the scan's sparse index, so each
    boundary costs at most INDEX_STRIDE lines of reading. When the scan applied a length limit, each shard
    also carries it as ``length_limit`` so that it skips the same prompts.
    """
    if not isinstance(shard_size, int) or shard_size < 1:
        raise PromptsError(f"shard_size must be a positive integer, got {shard_size!r}", path=str(path),
                           hint="set shard_size to the number of prompts one task should generate")
    path = Path(path)
    scan = scan or scan_prompts(path)
    stat = path.stat()
    if stat.st_size != scan.bytes or stat.st_mtime_ns != scan.mtime_ns:
        raise PromptsError("the prompts file changed after it was scanned", path=str(path), hint=CHANGED_SINCE_SCAN)
    head = min(max(0, head), scan.count)
    parts = [(first, min(shard_size, head - first)) for first in range(0, head, shard_size)]
    parts += [(first, min(shard_size, scan.count - first)) for first in range(head, scan.count, shard_size)]
    shards = []
    cursor = (0, 0)  # (valid prompts before, byte offset) of the last boundary found
    with path.open("rb") as handle:
        for shard_id, (first, count) in enumerate(parts):
            cursor = _find_valid(handle, scan, first, cursor)
            shards.append({"shard_id": shard_id, "input_path": str(path), "start": cursor[1],
                           "first": first, "count": count})
            if scan.length_limit is not None:
                shards[-1]["length_limit"] = dict(scan.length_limit)
    blocks = scan.blocks()
    for shard, following in zip(shards, shards[1:] + [None]):
        shard["end"] = following["start"] if following is not None else scan.bytes
        if blocks:
            shard["blocks"] = [block for block in blocks if block[1] < shard["end"] and block[2] > shard["start"]]
    return shards


def _find_valid(handle, scan: PromptScan, target: int, cursor: tuple[int, int]) -> tuple[int, int]:
    """``(target, byte offset of the line holding the target-th valid prompt)``, reading forward
    from the cursor or the nearest index entry before the target, whichever is further on."""
    valid_before, offset = max((pair for pair in scan.index if pair[0] <= target), default=(0, 0))
    if cursor[0] > valid_before:
        valid_before, offset = cursor
    handle.seek(offset)
    limit = LengthLimit.from_dict(scan.length_limit)
    for raw in handle:
        if raw.strip():
            prompt, structural, _, _ = parse_line(raw)
            if structural is None and accepted(prompt, limit):
                if valid_before == target:
                    return target, offset
                valid_before += 1
        offset += len(raw)
    raise PromptsError(f"the file ends before valid prompt {target}", path=scan.path, hint=CHANGED_SINCE_SCAN)


def accepted(prompt: Prompt | None, limit: LengthLimit | None) -> bool:
    """A prompt the scan kept: parsed without a problem and, under a length limit, short enough."""
    return prompt is not None and (limit is None or limit.problem(prompt) is None)


def iter_prompt_ids(path: str | os.PathLike, *, length_limit: LengthLimit | dict | None = None) -> Iterator[str]:
    """Every valid prompt id in file order, as the file is now; with the scan's ``length_limit``,
    without the prompts it set aside as too long. (A run's validation reads
    ``planned.read_planned_prompts``.)"""
    limit = LengthLimit.from_dict(length_limit)
    with open(path, "rb") as handle:
        for raw in handle:
            prompt = parse_line(raw)[0] if raw.strip() else None
            if accepted(prompt, limit):
                yield prompt.id
