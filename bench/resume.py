"""Resume cost: a retried shard with 1,000,000 finished completions, killed between its two writes.

Builds (once per temp dir) a prompts file of 1,002,000 chat prompts of ~1.1 KB and the output a
kill -9 leaves behind: 1,000,000 completion lines, their stats rows but the last one's, a torn
completion line, and a low-water mark 350 prompts (an in-flight window) behind. Then, in a fresh
process, times what a retried task does before its first request: open the shard's store (cut the
torn line, rebuild the missing stats row, load the finished ids) and read the shard's prompts from
the mark on to find the ones still to do. Peak memory is that process's maximum RSS, interpreter
included. The completion text is kept short here: resume reads
only the last chunk of the completions file (tests/unit/generate/test_store.py checks it).

Usage: python bench/resume.py [--finished 1000000] [--keep DIR] [--smoke]
Last line: resume seconds=<x.xx> peak_mib=<n> completions=<n>
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args
from fleetgen.generate import jsonio
from fleetgen.generate.records import stats_record
from fleetgen.generate.store import ShardStore

UNFINISHED = 2000
SMOKE = {"finished": 1000}
IN_FLIGHT = 350  # the low-water mark lags the newest completion by about the fleet's in-flight window
FILLER = ("Please be precise and show your reasoning before the final answer. Assume the reader knows "
          "undergraduate mathematics but nothing specific about the field. ") * 6

MEASURE = r"""
import json, resource, sys, time
started = time.perf_counter()
from fleetgen.generate.store import ShardStore
shard = json.loads(sys.argv[1])
store, report = ShardStore.open(sys.argv[2], shard)
remaining = sum(1 for _ in store.pending_prompts(shard))
seconds = time.perf_counter() - started
store.close()
print(json.dumps({"seconds": seconds, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "finished": report.finished, "restored": report.restored_stats, "torn": report.torn_bytes,
                  "remaining": remaining}))
"""


def prompt_id(number: int) -> str:
    return f"p{number:07d}"


def build(root: Path, finished: int) -> dict:
    prompts = root / "prompts.jsonl"
    total = finished + UNFINISHED
    shard = {"shard_id": 0, "input_path": str(prompts), "start": 0, "count": total}
    marker = root / "built.json"
    if marker.exists() and json.loads(marker.read_text()) == shard:
        return shard
    mark_index = finished - IN_FLIGHT
    with prompts.open("wb") as handle:
        for number in range(total):
            if number == mark_index:
                mark = (number, handle.tell())
            handle.write(json.dumps({"id": prompt_id(number), "messages": [
                {"role": "system", "content": "You are a careful expert tutor."},
                {"role": "user", "content": f"Question {number}: explain one result. {FILLER}"}]}).encode() + b"\n")
    completions_dir, stats_dir = root / "out" / "completions", root / "out" / "stats"
    completions_dir.mkdir(parents=True, exist_ok=True)
    stats_dir.mkdir(parents=True, exist_ok=True)
    (root / "out" / "shards").mkdir(exist_ok=True)
    (root / "out" / "shards" / "shard-00000.json").write_bytes(jsonio.dumps(shard))
    ShardStore(root / "out", shard).save_mark(*mark)
    with (completions_dir / "shard-00000.jsonl").open("wb") as completions, \
            (stats_dir / "shard-00000.jsonl").open("wb") as stats:
        for number in range(finished + 1):
            record = {"id": prompt_id(number), "messages": [{"role": "user", "content": f"Question {number}"}],
                      "reasoning_content": "Let me think. " * 10, "content": "The answer is 42.",
                      "finish_reason": "stop", "usage": {"prompt_tokens": 270, "completion_tokens": 2500},
                      "server": "gpu-node-1:30003", "latency_s": 93.512, "model": "qwen3.6-27b",
                      "sampling": {"max_tokens": 4096, "temperature": 0.6, "top_p": 0.95},
                      "finished_at": 1764400000.123 + number}
            line = jsonio.dumps(record) + b"\n"
            if number == finished:  # killed in the middle of this write
                completions.write(line[: len(line) // 2])
                break
            completions.write(line)
            if number < finished - 1:  # the last complete one was killed before its stats row
                stats.write(jsonio.dumps(stats_record(record)) + b"\n")
    marker.write_text(json.dumps(shard))
    return shard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="build in (and reuse) this directory")
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory(prefix="fleetgen-resume-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        shard = build(root, args.finished)
        print(f"built {args.finished:,} finished completions in {time.perf_counter() - started:.1f} s under {root}")
        # Resume mutates the output (repairs it): measure on a copy so the build can be reused.
        work = root / "work"
        subprocess.run(["rm", "-rf", str(work)], check=True)
        subprocess.run(["cp", "-r", str(root / "out"), str(work)], check=True)
        os.sync()  # a retry finds its files written back long ago, not 700 MB of dirty pages
        result = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(shard), str(work)],
                                check=True, capture_output=True, text=True)
        figures = json.loads(result.stdout)
    expected = {"finished": args.finished, "restored": 1, "remaining": UNFINISHED}
    got = {key: figures[key] for key in expected}
    print(f"repaired: torn bytes {figures['torn']}, stats rows rebuilt {figures['restored']}; "
          f"prompts left {figures['remaining']:,}")
    if got != expected:
        print(f"resume found {got}, expected {expected}", file=sys.stderr)
        return 1
    print(f"resume seconds={figures['seconds']:.2f} peak_mib={figures['peak_kib'] // 1024} "
          f"completions={figures['finished']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
