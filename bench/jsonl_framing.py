"""Why the prompts scan and the shard store frame JSONL themselves instead of using ``jsonlines``.

Reads the same file of chat prompts three ways, side by side in one process: the scan's own framing
(binary lines, byte offsets kept for the sparse shard index, orjson), ``jsonlines.Reader`` with orjson
as its ``loads`` (no byte offsets: it cannot serve the index or torn-tail recovery), and the standard
library's ``json``. Where no offsets are needed (rejects, error records, failure lines) the project
writes with ``jsonlines``.

Usage: python bench/jsonl_framing.py [--prompts 300000] [--smoke]
Last line: jsonl_framing own_s=<x.xx> jsonlines_s=<x.xx> jsonlines/own=<x.xx> prompts=<n>
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jsonlines
import orjson
from _common import parse_args

SMOKE = {"prompts": 20_000}


def write_prompts(path: Path, count: int) -> None:
    text = "Explain the proof step by step and check each claim before the final answer. " * 4
    with path.open("wb") as out:
        for number in range(count):
            out.write(orjson.dumps({"id": f"p{number:07d}", "messages": [{"role": "user", "content": text}]}) + b"\n")


def own_framing(path: Path) -> int:
    offset = count = 0
    with path.open("rb") as handle:
        for raw in handle:
            offset += len(raw)
            if raw.strip():
                orjson.loads(raw)
                count += 1
    return count


def with_jsonlines(path: Path) -> int:
    with path.open("rb") as handle, jsonlines.Reader(handle, loads=orjson.loads) as reader:
        return sum(1 for _ in reader.iter(skip_empty=True))


def with_stdlib(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for raw in handle if raw.strip() and json.loads(raw) is not None)


def timed(read, path: Path) -> float:
    started = time.perf_counter()
    read(path)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=300_000)
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompts.jsonl"
        write_prompts(path, args.prompts)
        assert own_framing(path) == with_jsonlines(path) == with_stdlib(path) == args.prompts
        runs = {name: min(timed(read, path) for _ in range(3))
                for name, read in (("own", own_framing), ("jsonlines", with_jsonlines), ("stdlib", with_stdlib))}
    for name, seconds in runs.items():
        print(f"{name:>10}: {seconds:6.2f} s for {args.prompts:,} prompts")
    print(f"jsonl_framing own_s={runs['own']:.2f} jsonlines_s={runs['jsonlines']:.2f} "
          f"jsonlines/own={runs['jsonlines'] / runs['own']:.2f} prompts={args.prompts}")


if __name__ == "__main__":
    main()
