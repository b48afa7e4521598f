"""Reading, validating and sharding the prompts file.

The prompts file is JSONL, one object a line: ``{"id": str, "messages": [...]}`` (chat, possibly
multi-turn) or ``{"id": str, "prompt": str}``, with an optional ``"sampling"`` object of per-prompt
overrides (keys in ``SAMPLING_OVERRIDES``). Other top-level keys are carried along unread. Parsing
and checking one line lives in :mod:`fleetgen.prompts.lines` (its public names are re-exported
here); this module deals with the file as a whole.

Two kinds of problem are told apart:

- *structural*: the line is not a JSON object, has no usable ``id``, or repeats an id. The file
  cannot be trusted (ids are what resume and validation key on), so ``scan_prompts`` raises
  ``PromptsError`` listing the first ``max_listed`` problems with their line numbers, then a count.
- *per-prompt*: the line names itself (a good id) but its content is unusable (empty messages, a
  message without a role, a sampling override of the wrong type), or, when the scan is given a
  ``LengthLimit``, it is too long for the context (:mod:`fleetgen.prompts.length`). It goes to the
  rejects file and the run proceeds without it. ``iter_shard`` applies the same tests (the limit
  travels in each shard), so shards skip the same lines.

Shards are ``(start byte, count of valid prompts)`` ranges over the file itself; no copy is made.
Token estimates use ~4 characters per token over message contents (chat template tokens are not
counted; see :mod:`fleetgen.prompts.length`): they size the plan's context and set aside prompts too
long for it, never anything that must be exact.
"""

from __future__ import annotations

import math
import os
from collections.abc import Container, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import jsonlines
import orjson

from fleetgen.errors import PromptsError
from fleetgen.prompts.length import CHARS_PER_TOKEN, LengthLimit  # noqa: F401 (CHARS_PER_TOKEN re-exported)
from fleetgen.prompts.lines import (ROLES, SAMPLING_OVERRIDES, Prompt, fast_id,  # noqa: F401 (re-exported)
                                  parse_line, shorten)

_CHANGED = "the prompts file changed after it was scanned; start a new run"
INDEX_STRIDE = 1000  # one (valid prompts before, byte offset) pair per this many valid prompts


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
        data["est_prompt_tokens_mean"] = round(self.est_prompt_tokens_mean, 1)
        data["est_prompt_tokens_max"] = self.est_prompt_tokens_max
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PromptScan":
        """Back from ``to_dict``, e.g. to hand the scan task's result to ``plan_shards``."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["index"] = tuple((int(a), int(b)) for a, b in values.get("index", ()))
        return cls(**values)


def scan_prompts(path: str | os.PathLike, *, rejects_path: str | os.PathLike | None = None,
                 max_listed: int = 20, length_limit: LengthLimit | None = None) -> PromptScan:
    """Validate the whole file in one pass; write per-prompt rejects; raise on structural problems.

    With ``length_limit``, prompts too long for its context are rejected too (``too_long`` counts
    them) and the prompt-length statistics cover the accepted prompts only.

    The rejects file (JSONL ``{"line", "id", "error"}``) appears only when the scan succeeds, so a
    failed scan leaves nothing behind for a later run to trip over.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise PromptsError(f"cannot read the prompts file: {exc.strerror}", path=str(path),
                           hint="check the prompts_path parameter and that the file is readable "
                                "from the worker") from exc
    problems: list[tuple[int, str]] = []
    problem_count = rejected = too_long = count = lines = chars_total = chars_max = offset = 0
    seen_ids: set[str] = set()
    duplicates: dict[str, list[int]] = {}
    index: list[tuple[int, int]] = []
    rejects = Path(rejects_path) if rejects_path is not None else None
    partial = rejects.with_name(rejects.name + ".partial") if rejects is not None else None
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as handle, (partial.open("wb") if partial is not None else open(os.devnull, "wb")) as sink, \
            jsonlines.Writer(sink, dumps=orjson.dumps) as out:
        for lines, raw in enumerate(handle, 1):
            line_offset, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            prompt, structural, per_prompt, prompt_id = parse_line(raw)
            if prompt is not None and length_limit is not None and (per_prompt := length_limit.problem(prompt)):
                too_long += 1
            if prompt_id is not None:
                if prompt_id in seen_ids:
                    duplicates.setdefault(prompt_id, []).append(lines)
                    structural = f"duplicate id {shorten(repr(prompt_id))}"
                else:
                    seen_ids.add(prompt_id)
            if structural:
                problem_count += 1
                if len(problems) < max_listed:
                    problems.append((lines, structural))
            elif per_prompt:
                rejected += 1
                out.write({"line": lines, "id": prompt_id, "error": per_prompt})
            else:
                if count % INDEX_STRIDE == 0:
                    index.append((count, line_offset))
                count += 1
                chars = prompt.content_chars()
                chars_total += chars
                chars_max = max(chars_max, chars)
    if problem_count or count == 0:
        if partial is not None:
            partial.unlink()
        if duplicates:
            problems = _name_first_occurrences(path, duplicates, problems)
    if problem_count:
        listed = "\n".join(f"  line {line}: {message}" for line, message in problems)
        more = f"\n  ... and {problem_count - len(problems)} more" if problem_count > len(problems) else ""
        raise PromptsError(
            f"{problem_count} structural problem(s) in the prompts file:\n{listed}{more}",
            problems=problems, path=str(path), line=problems[0][0],
            hint="fix these lines (each needs valid JSON and a unique string id) and start the run again")
    if count == 0:
        raise PromptsError(f"no valid prompts ({rejected} rejected, {lines} lines)", path=str(path),
                           hint="check the file is the prompts JSONL" + (" and read the rejects" if rejected else ""))
    if partial is not None:
        os.replace(partial, rejects)
    return PromptScan(path=str(path), count=count, rejected=rejected, bytes=offset, mtime_ns=stat.st_mtime_ns,
                      lines=lines, prompt_chars_mean=chars_total / count, prompt_chars_max=chars_max,
                      rejects_path=str(rejects) if rejects is not None else None, index=tuple(index),
                      too_long=too_long, length_limit=length_limit.to_dict() if length_limit is not None else None)


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


def plan_shards(path: str | os.PathLike, *, shard_size: int, scan: PromptScan | None = None) -> list[dict]:
    """Cut the valid prompts into shards of ``shard_size``: ``[{shard_id, input_path, start, first, count}]``.

    ``start`` is the byte offset of the shard's first valid prompt, ``first`` its index among the valid
    prompts (the shard's label in the Airflow UI). Uses the scan's sparse index, so each boundary costs at
    most INDEX_STRIDE lines of reading. When the scan applied a length limit, each shard also carries it as
    ``length_limit`` so that it skips the same prompts.
    """
    if not isinstance(shard_size, int) or shard_size < 1:
        raise PromptsError(f"shard_size must be a positive integer, got {shard_size!r}", path=str(path),
                           hint="set shard_size to the number of prompts one task should generate")
    path = Path(path)
    scan = scan or scan_prompts(path)
    stat = path.stat()
    if stat.st_size != scan.bytes or stat.st_mtime_ns != scan.mtime_ns:
        raise PromptsError("the prompts file changed after it was scanned", path=str(path), hint=_CHANGED)
    shards = []
    cursor = (0, 0)  # (valid prompts before, byte offset) of the last boundary found
    with path.open("rb") as handle:
        for shard_id, first in enumerate(range(0, scan.count, shard_size)):
            cursor = _find_valid(handle, scan, first, cursor)
            shards.append({"shard_id": shard_id, "input_path": str(path), "start": cursor[1],
                           "first": first, "count": min(shard_size, scan.count - first)})
            if scan.length_limit is not None:
                shards[-1]["length_limit"] = dict(scan.length_limit)
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
            if structural is None and _accepted(prompt, limit):
                if valid_before == target:
                    return target, offset
                valid_before += 1
        offset += len(raw)
    raise PromptsError(f"the file ends before valid prompt {target}", path=scan.path, hint=_CHANGED)


def _accepted(prompt: Prompt | None, limit: LengthLimit | None) -> bool:
    """A prompt the scan kept: parsed without a problem and, under a length limit, short enough."""
    return prompt is not None and (limit is None or limit.problem(prompt) is None)


def iter_shard(input_path: str | os.PathLike, start: int, count: int, *,
               skip_ids: Container[bytes] | None = None,
               length_limit: LengthLimit | dict | None = None) -> Iterator[Prompt]:
    """Yield the shard's valid prompts, reading only its byte range.

    Rejected lines are skipped exactly as ``scan_prompts`` rejected them (pass the scan's
    ``length_limit``, as each shard carries it, to skip the prompts it set aside as too long). Lines
    whose id (UTF-8 bytes) is in ``skip_ids`` are counted but not yielded and, when the id leads the
    line, not parsed either: that is what keeps resume cheap.
    """
    for _, _, _, prompt in iter_shard_positions(input_path, start, count, skip_ids=skip_ids,
                                                length_limit=length_limit):
        yield prompt


def iter_shard_positions(input_path: str | os.PathLike, start: int, count: int, *,
                         skip_ids: Container[bytes] | None = None, first_index: int = 0,
                         length_limit: LengthLimit | dict | None = None) -> Iterator[tuple[int, int, int, Prompt]]:
    """``iter_shard`` with where each prompt is: ``(index, line start, line end, prompt)``.

    ``index`` counts valid prompts from the shard's start (``first_index`` when ``start`` is a
    point inside the shard), so a reader can later resume from any yielded line.
    """
    path = str(input_path)
    seen = 0
    offset = start
    limit = LengthLimit.from_dict(length_limit)
    with open(path, "rb") as handle:
        if start > 0:
            handle.seek(start - 1)
            if handle.read(1) != b"\n":
                raise PromptsError(f"shard start {start} is not at the beginning of a line", path=path, hint=_CHANGED)
        for raw in handle:
            if seen == count:
                return
            line_start = offset
            offset += len(raw)
            if skip_ids is not None:
                raw_id = fast_id(raw)
                if raw_id is not None and raw_id in skip_ids:
                    seen += 1
                    continue
            if not raw.strip():
                continue
            prompt, structural, _, _ = parse_line(raw)
            if structural:
                raise PromptsError(f"line at byte {line_start}: {structural}", path=path, hint=_CHANGED)
            if not _accepted(prompt, limit):
                continue  # rejected by the scan too
            seen += 1
            if skip_ids is not None and prompt.id.encode() in skip_ids:
                continue
            yield first_index + seen - 1, line_start, offset, prompt
    if seen < count:
        raise PromptsError(f"the shard range from byte {start} holds {seen} valid prompts, {count} were planned",
                       path=path, hint=_CHANGED)


def iter_prompt_ids(path: str | os.PathLike, *, length_limit: LengthLimit | dict | None = None) -> Iterator[str]:
    """Every valid prompt id in file order (what the output must cover); with the scan's
    ``length_limit``, without the prompts it set aside as too long."""
    limit = LengthLimit.from_dict(length_limit)
    with open(path, "rb") as handle:
        for raw in handle:
            prompt = parse_line(raw)[0] if raw.strip() else None
            if _accepted(prompt, limit):
                yield prompt.id
