"""Benchmark: time and peak memory of ``fleetgen.validation.suite.validate_run`` over 1,000,000 completions.

Goal: <= 30 s and <= 1 GiB for 1M completions, whatever the length of the generated texts.

Two cases share the same shape (1M prompt ids in 20 shards, 0.1 % permanent errors, ~5 % truncated
at max_tokens, a few answers empty), and differ in the texts:

- ``short``: ``completions/`` holds a real JSONL line for every prompt, with texts of ~250 characters
  (~0.4 GB); stats say so (``reasoning_chars`` + ``content_chars`` ~250).
- ``long``: stats describe ~10 KB texts per completion (``reasoning_chars`` + ``content_chars`` ~10,000),
  and every shard's completions file has the size 1M x 10 KB implies (~10 GB in all). Writing 10 GB of
  text would take minutes and disk for nothing, so each file holds real ~10 KB JSONL lines for its first
  200 prompts and is then extended to its full size with a sparse hole (zeros that take no disk).

Why this is an honest measure: validation memory could only follow text size by reading the
completions; the suite reads ``stats/`` and ``errors/`` alone. The measured child process installs a
``sys.addaudithook`` that records every ``open``/``os.listdir``/``os.scandir`` touching ``completions/``,
and the benchmark fails if there is even one. Were the files read, the long case would have to read
~10 GB (and parse zeros); equal peak memory in both cases, with zero opens, is the claim shown.

Each case runs in its own Python process (``--child``); its peak RSS is ``getrusage(RUSAGE_SELF)``
read at its end, cross-checked against ``getrusage(RUSAGE_CHILDREN)`` in the parent. ``seconds`` is
the time of the ``validate_run`` call (Great Expectations' ~3 s import included; Data Docs built).
The last line printed is ``validate seconds=<x.xx> peak_mib=<n> rows=<n>`` for the long case.

Usage: ``python bench/validate.py [--rows 1000000] [--workdir DIR] [--keep] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args

SHARDS = 20
SMOKE = {"rows": 2000}
MAX_TOKENS = 4096
LONG_TEXT_CHARS = 10_000
REAL_LONG_LINES_PER_SHARD = 200
SERVERS = [f"node-a:{30000 + port}" for port in range(7)]
T0 = 1_764_400_000.0


def prompt_id(index: int) -> str:
    return f"prompt-{index:08d}"


def write_case(out: Path, rows: int, long_text: bool) -> dict:
    """Write stats/, errors/, completions/ for one case; return sizes written."""
    rng = random.Random(7)
    for folder in ("stats", "errors", "completions"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    per_shard = -(-rows // SHARDS)
    completion_bytes = 0
    errors = 0
    for shard in range(SHARDS):
        name = f"shard-{shard:05d}.jsonl"
        indexes = range(shard * per_shard, min(rows, (shard + 1) * per_shard))
        stats_lines, error_lines, completion_lines = [], [], []
        for index in indexes:
            pid = prompt_id(index)
            server = SERVERS[index % len(SERVERS)]
            if index % 1000 == 999:  # 0.1 % permanent failures
                errors += 1
                error_lines.append(f'{{"id": "{pid}", "status": "failed", "error": {{"code": 500, '
                                   f'"message": "upstream error"}}, "server": "{server}", '
                                   f'"at": {T0 + index * 0.01}}}\n')
                continue
            tokens = min(MAX_TOKENS, max(1, int(rng.gauss(2500, 900))))
            reason = "length" if tokens == MAX_TOKENS else "stop"
            # Same draws in both cases, scaled: ~10,000 characters per completion, or ~250.
            reasoning_chars = rng.randint(7_000, 9_000) if long_text else rng.randint(150, 250)
            content_chars = 0 if index % 200 == 0 else (rng.randint(1_000, 3_000) if long_text else rng.randint(25, 75))
            stats_lines.append(
                f'{{"id": "{pid}", "prompt_tokens": {rng.randint(120, 420)}, "completion_tokens": {tokens}, '
                f'"finish_reason": "{reason}", "reasoning_chars": {reasoning_chars}, '
                f'"content_chars": {content_chars}, "server": "{server}", "latency_s": {tokens / 55.0:.3f}, '
                f'"finished_at": {T0 + index * 0.01:.3f}}}\n')
            if not long_text or len(completion_lines) < REAL_LONG_LINES_PER_SHARD:
                completion_lines.append(json.dumps({
                    "id": pid, "finish_reason": reason, "server": server,
                    "reasoning_content": "r" * reasoning_chars, "content": "a" * content_chars,
                    "usage": {"completion_tokens": tokens}}) + "\n")
        (out / "stats" / name).write_text("".join(stats_lines))
        (out / "errors" / name).write_text("".join(error_lines))
        completions_path = out / "completions" / name
        completions_path.write_text("".join(completion_lines))
        if long_text:  # the size of len(indexes) ~10 KB lines; the rest is a sparse hole
            with completions_path.open("r+b") as handle:
                handle.truncate(len(indexes) * (LONG_TEXT_CHARS + 150))
        completion_bytes += completions_path.stat().st_size
    stats_bytes = sum(path.stat().st_size for path in (out / "stats").iterdir())
    return {"completions_bytes": completion_bytes, "stats_bytes": stats_bytes, "errors": errors}


def child(out: Path, rows: int) -> None:
    """Run validate_run once and print one JSON line of figures."""
    completions_dir = str(out / "completions")
    touched: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args and completions_dir in str(args[0]):
            touched.append(f"{event} {args[0]}")

    sys.addaudithook(audit)
    from fleetgen.validation.suite import ValidationThresholds, validate_run

    thresholds = ValidationThresholds(max_tokens=MAX_TOKENS, min_mean_completion_tokens=1_000,
                                      max_mean_completion_tokens=3_500, min_reasoning_share=0.9)
    started = time.perf_counter()
    summary = validate_run(out, (prompt_id(index) for index in range(rows)), thresholds,
                           build_docs=True, raise_on_failure=False)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    during_validation = len(touched)
    os.listdir(completions_dir)  # control: the hook must see this, or "0 opens" would prove nothing
    hook_works = len(touched) == during_validation + 1
    del touched[during_validation:]
    print(json.dumps({"seconds": seconds, "peak_kib": peak_kib, "rows": summary["rows"],
                      "expected": summary["expected"], "success": summary["success"],
                      "failed_expectations": summary["failed_expectations"],
                      "completions_touched": touched[:5], "completions_touched_count": len(touched),
                      "hook_works": hook_works}))


def run_case(name: str, out: Path, rows: int) -> dict:
    started = time.perf_counter()
    sizes = write_case(out, rows, long_text=(name == "long"))
    write_seconds = time.perf_counter() - started
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", str(out), "--rows", str(rows)],
                          capture_output=True, text=True, check=False)
    process_seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{name}: validation process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    figures.update(sizes, name=name, write_seconds=write_seconds, process_seconds=process_seconds,
                   children_peak_kib=children_peak if children_peak > before else None)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the cases (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated run folders")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, SMOKE)
    if args.child:
        child(args.child, args.rows)
        return
    workdir = Path(tempfile.mkdtemp(prefix="fleetgen-bench-validate-", dir=args.workdir))
    results = []
    try:
        for name in ("short", "long"):
            figures = run_case(name, workdir / name, args.rows)
            results.append(figures)
            print(f"{name:5s}: rows={figures['rows']} expected={figures['expected']} "
                  f"success={figures['success']} failed={figures['failed_expectations']} "
                  f"validate_s={figures['seconds']:.2f} process_s={figures['process_seconds']:.2f} "
                  f"peak_mib={figures['peak_kib'] // 1024} "
                  f"children_peak_mib={(figures['children_peak_kib'] or 0) // 1024 or '-'} "
                  f"stats_mib={figures['stats_bytes'] / 2**20:.0f} "
                  f"completions_mib={figures['completions_bytes'] / 2**20:.0f} "
                  f"completions_opened={figures['completions_touched_count']} (hook checked: {figures['hook_works']}) "
                  f"(cases written in {figures['write_seconds']:.1f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    short, long = results
    if short["completions_touched_count"] or long["completions_touched_count"]:
        sys.exit(f"validation touched completions/: {short['completions_touched'] + long['completions_touched']}")
    if not (short["hook_works"] and long["hook_works"]):
        sys.exit("the audit hook did not see a deliberate listing of completions/: the check is void")
    print(f"ratios: long/short peak_mib={long['peak_kib'] / short['peak_kib']:.2f} "
          f"seconds={long['seconds'] / short['seconds']:.2f} "
          f"completions_bytes={long['completions_bytes'] / short['completions_bytes']:.1f}; "
          f"goal: seconds<=30 ({'met' if long['seconds'] <= 30 else 'MISSED'}), "
          f"peak<=1024 MiB ({'met' if long['peak_kib'] <= 1024 * 1024 else 'MISSED'})")
    print(f"validate seconds={long['seconds']:.2f} peak_mib={long['peak_kib'] // 1024} rows={long['rows']}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
