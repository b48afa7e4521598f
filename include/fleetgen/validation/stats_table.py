"""The stats and errors tables of a run, read fast from their JSONL shards.

``<out>/stats/*.jsonl`` holds one small row per finished prompt and ``<out>/errors/*.jsonl`` one
row per prompt that failed permanently. Both are read in chunks of ``_CHUNK_LINES`` lines with one
C-level ``json.loads`` per chunk, into compact pandas tables (numbers as float64, categoricals for
the repeated strings, ids as one late allocation), so memory tracks the number of prompts, never
the length of the generated texts. A malformed line raises :class:`ValidationFailed` naming the
file and line; a last line torn by a crash is skipped with a warning (``load_stats(...,
with_info=True)`` lists where).
"""

from __future__ import annotations

import json
import logging
from itertools import islice
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from fleetgen.errors import ValidationFailed
from fleetgen.outputs import CATEGORY_COLUMNS, ERROR_COLUMNS, NUMBER_COLUMNS, STATS_COLUMNS, RunLayout

__all__ = ["STATS_COLUMNS", "ERROR_COLUMNS", "load_stats", "load_errors"]

log = logging.getLogger(__name__)

_CHUNK_LINES = 50000  # bounds the transient Python objects of one parse to a few tens of MB


def _parse_lines(path: Path, first_line: int, lines: list[bytes], at_end: bool, torn: list[str]) -> list[dict]:
    """Parse one chunk of JSONL lines; one C-level json.loads per chunk when every line is good.

    A malformed line raises, except a last line without a newline (a write torn by a crash), which
    is skipped and recorded in ``torn``.
    """
    try:
        records = json.loads(b"[" + b",".join(line for line in lines if line.strip()) + b"]")
        if all(isinstance(record, dict) for record in records):
            return records
    except ValueError:
        pass
    records = []
    for offset, line in enumerate(lines):
        if not line.strip():
            continue
        number = first_line + offset
        try:
            record = json.loads(line)
        except ValueError as exc:
            if at_end and offset == len(lines) - 1 and not line.endswith(b"\n"):
                torn.append(f"{path}:{number}")
                log.warning("skipping torn last line %s:%d", path, number)
                continue
            raise ValidationFailed(f"malformed JSON line ({exc})", path=str(path), line=number,
                                   hint="the file was edited or corrupted; regenerate this shard") from exc
        if not isinstance(record, dict):
            raise ValidationFailed("line is not a JSON object", path=str(path), line=number)
        records.append(record)
    return records


def _read_jsonl(path: Path, columns: tuple[str, ...], torn: list[str]) -> Iterable[pd.DataFrame]:
    with path.open("rb") as handle:
        first_line = 1
        lines = list(islice(handle, _CHUNK_LINES))
        while lines:
            following = list(islice(handle, _CHUNK_LINES))
            records = _parse_lines(path, first_line, lines, not following, torn)
            yield pd.DataFrame.from_records(records, columns=list(columns))
            first_line += len(lines)
            lines = following


def _compact_ids(ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Ids of one chunk as a fixed-width numpy string array plus a null mask.

    Keeping the parsed ``str`` objects instead would pin every heap arena of the chunk's freed
    per-row objects (dicts, numbers), and RSS would grow ~5x the size of the table.
    """
    present = ids.map(lambda value: isinstance(value, str) or (value is not None and value == value))
    text = [value if isinstance(value, str) else (str(value) if ok else "") for value, ok in zip(ids, present)]
    # numpy's fixed-width strings drop trailing NULs ("z\x00" would read back as "z", a duplicate of "z"):
    # a chunk holding such an id keeps its str objects.
    compact = np.array(text, dtype=object if any(value.endswith("\x00") for value in text) else str)
    return compact, ~present.to_numpy(dtype=bool)


def load_stats(out_dir: str | Path, *, with_info: bool = False):
    """All shards' stats rows, in shard then line order, with compact dtypes.

    Numbers are float64/int64 (a null or non-number becomes NaN); ``finish_reason`` and ``server``
    are categoricals; ``id`` holds ``str`` (a non-string id is kept as its ``str()``).
    With ``with_info`` also returns ``{"files", "torn_lines"}``.
    """
    out = Path(out_dir)
    files = RunLayout(out).shard_files("stats")
    torn: list[str] = []
    parts, id_parts, null_parts = [], [], []
    for path in files:
        for chunk in _read_jsonl(path, STATS_COLUMNS, torn):
            ids, nulls = _compact_ids(chunk.pop("id"))
            id_parts.append(ids)
            null_parts.append(nulls)
            for column in NUMBER_COLUMNS:
                chunk[column] = pd.to_numeric(chunk[column], errors="coerce")
            for column in CATEGORY_COLUMNS:
                chunk[column] = chunk[column].astype("category")
            parts.append(chunk)
    if parts:
        stats = pd.concat(parts, ignore_index=True)
        for column in CATEGORY_COLUMNS:  # concat of differing categories falls back to object
            stats[column] = stats[column].astype("category")
        # One allocation of all id strings, after every chunk's objects are gone: a compact heap.
        ids = np.concatenate(id_parts).astype(object)
        del id_parts
        ids[np.concatenate(null_parts)] = None
        stats.insert(0, "id", pd.Series(ids, dtype=object, copy=False))
    else:
        stats = pd.DataFrame({column: pd.Series(dtype="float64" if column in NUMBER_COLUMNS else object)
                              for column in STATS_COLUMNS})
    if not files:
        log.warning("no stats files under %s", out / "stats")
    info = {"files": len(files), "torn_lines": torn}
    return (stats, info) if with_info else stats


def load_errors(out_dir: str | Path) -> pd.DataFrame:
    """Permanent failures from ``errors/*.jsonl``: id, code, message, server, at."""
    torn: list[str] = []
    parts = []
    for path in RunLayout(Path(out_dir)).shard_files("errors"):
        for chunk in _read_jsonl(path, ("id", "error", "server", "at"), torn):
            detail = chunk.pop("error").map(lambda value: value if isinstance(value, dict) else {})
            chunk.insert(1, "code", detail.map(lambda value: value.get("code")))
            chunk.insert(2, "message", detail.map(lambda value: value.get("message")))
            parts.append(chunk)
    if not parts:
        return pd.DataFrame({column: pd.Series(dtype=object) for column in ERROR_COLUMNS})
    return pd.concat(parts, ignore_index=True)
