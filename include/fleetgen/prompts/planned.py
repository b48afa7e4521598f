"""The prompts a run planned, read back: a shard's byte range with its block checks, and validation's ids.

A plan fixes what a run reads (docs/shards.md §5): each shard carries the ``[first, start, end, digest]``
blocks of the scan (:mod:`fleetgen.prompts.scan`) it overlaps and checks them before it yields a prompt,
and again at the end when the file was written to meanwhile; validation reads the expected ids through
every block. A file edited between two tries is refused saying which prompts changed and how to recover.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Container, Iterator
from dataclasses import dataclass

from fleetgen.errors import PromptsError
from fleetgen.prompts.length import LengthLimit
from fleetgen.prompts.lines import Prompt, fast_id, parse_line
from fleetgen.prompts.scan import CHANGED_SINCE_SCAN, DIGEST_HEX_CHARS, PromptScan, accepted

RESTORE_PLANNED = ("a run reads the prompts as they were when it was planned: put the prompts_path file back as it "
                   "was then (same bytes) and clear the task, or start a new run (a new run id) to generate from "
                   "the edited file; add prompts by starting another run on a file of the new prompts")


def _identity(handle) -> tuple[int, int, int]:
    stat = os.fstat(handle.fileno())
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _changed_block(path: str, block: list, handle, *, shard: int | None, scanned_bytes: int | None) -> PromptsError:
    """The error for a block whose bytes are no longer the scan's: which prompts, and how the file differs."""
    first, start, end, _ = block
    stat = os.fstat(handle.fileno())
    size = f"the file is now {stat.st_size:,} bytes" + (
        f", {scanned_bytes:,} when scanned" if scanned_bytes is not None else "")
    return PromptsError(
        f"the prompts file changed after the run was planned: bytes {start:,} to {end:,} (valid prompts from "
        f"{first:,} on) no longer hold what the scan read; {size} (lines inserted, removed or replaced)",
        path=path, shard=shard, hint=RESTORE_PLANNED)


def check_blocks(handle, path: str, blocks: list[list], *, shard: int | None = None,
                 scanned_bytes: int | None = None) -> None:
    """Read each ``[first, start, end, digest]`` block and compare its digest; raise what changed."""
    for block in blocks:
        _, start, end, digest = block
        handle.seek(start)
        hasher = hashlib.sha256()
        left = end - start
        while left > 0 and (data := handle.read(min(left, 1 << 20))):
            hasher.update(data)
            left -= len(data)
        if left or hasher.hexdigest()[:DIGEST_HEX_CHARS] != digest:
            raise _changed_block(path, block, handle, shard=shard, scanned_bytes=scanned_bytes)


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
                         length_limit: LengthLimit | dict | None = None, end: int | None = None,
                         blocks: list[list] | None = None,
                         shard: int | None = None) -> Iterator[tuple[int, int, int, Prompt]]:
    """``iter_shard`` with where each prompt is: ``(index, line start, line end, prompt)``.

    ``index`` counts valid prompts from the shard's start (``first_index`` when ``start`` is a
    point inside the shard), so a reader can later resume from any yielded line.

    With the plan's ``end`` the read stops there: a ``start`` equal to ``end`` (a finished shard, even
    one that ends the file without a newline) reads nothing. With the plan's ``blocks`` they are checked
    before the first prompt is yielded, and the file must stay as it was while the shard reads it: a
    changed file raises ``PromptsError`` saying what changed (``shard`` names the shard in it).
    """
    path = str(input_path)
    seen = 0
    offset = start
    limit = LengthLimit.from_dict(length_limit)
    with open(path, "rb") as handle:
        identity = None
        if blocks:
            check_blocks(handle, path, blocks, shard=shard)
            identity = _identity(handle)
        if end is not None and not start <= end:
            raise PromptsError(f"resume point {start} lies past the shard's end {end}", path=path, shard=shard,
                               hint=RESTORE_PLANNED)
        if end is not None and start == end:
            lines: Iterator[bytes] = iter(())
        else:
            if start > 0:
                handle.seek(start - 1)
                if handle.read(1) != b"\n":
                    raise PromptsError(f"shard start {start} is not at the beginning of a line", path=path,
                                       shard=shard, hint=CHANGED_SINCE_SCAN if blocks is None else RESTORE_PLANNED)
            else:
                handle.seek(0)
            lines = handle
        for raw in lines:
            if seen == count or (end is not None and offset >= end):
                break
            line_start = offset
            offset += len(raw)
            if end is not None and offset > end:  # a last line without newline, appended to since the scan
                raw, offset = raw[:end - line_start], end
            if skip_ids is not None:
                raw_id = fast_id(raw)
                if raw_id is not None and raw_id in skip_ids:
                    seen += 1
                    continue
            if not raw.strip():
                continue
            prompt, structural, _, _ = parse_line(raw)
            if structural:
                raise PromptsError(f"line at byte {line_start}: {structural}", path=path, shard=shard,
                                   hint=CHANGED_SINCE_SCAN if blocks is None else RESTORE_PLANNED)
            if not accepted(prompt, limit):
                continue  # rejected by the scan too
            seen += 1
            if skip_ids is not None and prompt.id.encode() in skip_ids:
                continue
            yield first_index + seen - 1, line_start, offset, prompt
        if identity is not None and _identity(handle) != identity:  # written to meanwhile: still the planned bytes?
            with open(handle.fileno(), "rb", closefd=False) as fresh:  # the same file, not the bytes buffered
                check_blocks(fresh, path, blocks, shard=shard)
    if seen < count:
        raise PromptsError(f"the shard range from byte {start} holds {seen} valid prompts, {count} were planned",
                           path=path, shard=shard, hint=CHANGED_SINCE_SCAN if blocks is None else RESTORE_PLANNED)


def resume_offset_problem(shard: dict, offset: int) -> str | None:
    """Why ``offset`` cannot be where a resume of ``shard`` starts reading, or None: it must lie within
    the planned range and at the start of a line (the range's end is one, with or without a newline)."""
    start, end = int(shard["start"]), shard.get("end")
    if offset < start or (end is not None and offset > int(end)):
        return f"byte {offset} lies outside the shard's planned range {start} to {end if end is not None else 'EOF'}"
    if offset in (start, end):
        return None
    with open(shard["input_path"], "rb") as handle:
        handle.seek(offset - 1)
        if handle.read(1) != b"\n":
            return f"byte {offset} is not the start of a line of the prompts file"
    return None


@dataclass(frozen=True)
class PlannedPrompts:
    """The prompts a run planned, as validation needs them."""

    ids: list[str]  # every accepted prompt's id, in file order
    own_max_tokens: dict[str, int]  # the prompts with their own "sampling.max_tokens", by id


def read_planned_prompts(scan: PromptScan | dict) -> PlannedPrompts:
    """The accepted prompts of ``scan`` read from its file, each block checked against its digest.

    Reads only what the scan read (lines appended since are not the run's); a block that changed
    raises ``PromptsError`` saying which prompts and what to do. A scan without digests (made before
    they existed) reads its byte range unchecked.
    """
    scan = PromptScan.from_dict(scan) if isinstance(scan, dict) else scan
    limit = LengthLimit.from_dict(scan.length_limit)
    ids: list[str] = []
    own: dict[str, int] = {}
    blocks = scan.blocks() or [[0, scan.index[0][1] if scan.index else 0, scan.bytes, None]]
    with open(scan.path, "rb") as handle:
        for block in blocks:
            _, start, end, digest = block
            handle.seek(start)
            hasher = hashlib.sha256()
            offset = start
            for raw in handle:
                if offset >= end:
                    break
                raw = raw[:end - offset]  # a last line without newline may have been appended to since
                offset += len(raw)
                hasher.update(raw)
                prompt = parse_line(raw)[0] if raw.strip() else None
                if accepted(prompt, limit):
                    ids.append(prompt.id)
                    if "max_tokens" in prompt.sampling:
                        own[prompt.id] = prompt.sampling["max_tokens"]
            if digest is not None and (offset != end or hasher.hexdigest()[:DIGEST_HEX_CHARS] != digest):
                raise _changed_block(scan.path, block, handle, shard=None, scanned_bytes=scan.bytes)
    return PlannedPrompts(ids=ids, own_max_tokens=own)
