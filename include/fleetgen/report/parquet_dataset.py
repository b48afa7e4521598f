"""A validated run's completions as a Parquet dataset: ``dataset/shard-NNNNN.parquet``, one file per shard.

Loadable as it is by ``pyarrow.dataset.dataset(<run>/dataset)``, ``pandas.read_parquet`` and
``datasets.load_dataset("parquet", data_dir=...)``, so that a training job reads the run without parsing JSONL. The
columns (``SCHEMA``) are the completion record's (docs/output-formats.md §10): the prompt as ``messages`` (a list of
``{role, content}``) or ``prompt``, the answer and its ``reasoning_content``, SGLang's token counts, which server and
model answered, when, and the sampling settings as JSON text. Rows are written ``ROW_GROUP_ROWS`` at a time (one
row group each), so memory holds one group of texts, never the run. Each file is written to a temporary name and
renamed: a reader never sees half of one, and a retry writes the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.errors import ValidationFailed
from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout, write_whole

ROW_GROUP_ROWS = 1000
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("messages", pa.list_(MESSAGE)),
    pa.field("prompt", pa.string()),
    pa.field("reasoning_content", pa.string()),
    pa.field("content", pa.string()),
    pa.field("finish_reason", pa.string()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("model", pa.string()),
    pa.field("server", pa.string()),
    pa.field("latency_s", pa.float64()),
    pa.field("finished_at", pa.float64()),
    pa.field("sampling", pa.string()),
    pa.field("reused_from", pa.string()),
])


@dataclass(frozen=True)
class ParquetDataset:
    """What ``write_parquet_dataset`` wrote; JSON-safe through ``to_dict``."""

    folder: str
    files: int
    rows: int

    def to_dict(self) -> dict:
        return asdict(self)


def row(completion: dict) -> dict:
    """The dataset's row for one completion record (a message's non-text content kept as its JSON)."""
    usage = completion.get("usage") or {}
    messages = completion.get("messages")
    return {
        "id": completion["id"],
        "messages": None if messages is None else [
            {"role": message.get("role"), "content": content if isinstance(content := message.get("content"), str)
             or content is None else jsonio.dumps(content).decode()} for message in messages],
        "prompt": completion.get("prompt"),
        "reasoning_content": completion.get("reasoning_content"),
        "content": completion.get("content"),
        "finish_reason": completion.get("finish_reason"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "model": completion.get("model"),
        "server": completion.get("server"),
        "latency_s": completion.get("latency_s"),
        "finished_at": completion.get("finished_at"),
        "sampling": None if completion.get("sampling") is None else jsonio.dumps(completion["sampling"]).decode(),
        "reused_from": completion.get("reused_from"),
    }


def write_parquet_dataset(layout: RunLayout) -> ParquetDataset:
    """Write ``layout.dataset_dir`` from the run's completions (after validation passed: every prompt once)."""
    rows = files = 0
    for source in layout.shard_files("completions"):
        target = layout.dataset_dir / (source.name.removesuffix(".jsonl") + ".parquet")
        rows += _write_shard(source, target)
        files += 1
    return ParquetDataset(folder=str(layout.dataset_dir), files=files, rows=rows)


def _write_shard(source: Path, target: Path) -> int:
    written = 0
    with write_whole(target) as handle, pq.ParquetWriter(handle, SCHEMA, compression="zstd") as writer:
        for group in _groups(source):
            writer.write_table(pa.Table.from_pylist(group, schema=SCHEMA), row_group_size=ROW_GROUP_ROWS)
            written += len(group)
    return written


def _groups(source: Path) -> Iterator[list[dict]]:
    group: list[dict] = []
    with source.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                group.append(row(jsonio.loads(raw)))
            except (jsonio.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
                raise ValidationFailed(f"a completion line cannot go into the dataset ({error})", path=str(source),
                                       line=number, hint="the file was edited or corrupted after validation; "
                                                         "regenerate this shard") from error
            if len(group) == ROW_GROUP_ROWS:
                yield group
                group = []
    if group:
        yield group
