"""Fixing a run's prompts at plan time: block digests in the scan against a snapshot in the run's folder.

Builds (once per directory) a prompts file of chat prompts of ~1.1 KB, either ``--prompts`` of them or
as many as fill ``--gigabytes``, then measures, one after the other on the same file:

- the scan as the run does it (parse and check every line, write the rejects, one SHA-256 digest per
  index block of valid prompts): ``scan_s``, and the bytes it leaves (``rejects.jsonl`` plus the scan's
  JSON, which travels through XCom): ``scan_disk_bytes``, ``scan_json_bytes``;
- the hashing alone, one SHA-256 pass over the file: ``hash_pass_s`` (what the digests add to the scan);
- the alternative, a copy of the scanned bytes into the run's folder: ``snapshot_s``, ``snapshot_bytes``;
- planning shards of 1,000 from the scan (``plan_s``), one shard's check of its blocks before it reads
  (``shard_check_s``), and validation's read of the planned ids with every block checked
  (``planned_read_s``).

The page cache is dropped neither before nor between steps: on a file larger than memory each pass
reads from the disk anyway, and a smaller file is read warm by every step alike.

Usage: python bench/prompt_plan.py (--prompts 1000000 | --gigabytes 10) [--keep DIR] [--smoke]
Last line: prompt_plan prompts=<n> file_bytes=<n> scan_s=<x> hash_pass_s=<x> snapshot_s=<x> ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args
from fleetgen.prompts.planned import iter_shard_positions, read_planned_prompts
from fleetgen.prompts.scan import plan_shards, scan_prompts

FILLER = ("Please be precise and show your reasoning before the final answer. Assume the reader knows "
          "undergraduate mathematics but nothing specific about the field. ") * 6
BLOCK = 1 << 20
SHARD_SIZE = 1000
SMOKE = {"prompts": 3 * SHARD_SIZE}


def build(path: Path, *, prompts: int | None, gigabytes: float | None) -> dict:
    wanted = {"prompts": prompts, "gigabytes": gigabytes}
    marker = path.with_suffix(".built.json")
    if marker.exists() and json.loads(marker.read_text()).get("wanted") == wanted and path.exists():
        return json.loads(marker.read_text())
    limit_bytes = int(gigabytes * 1e9) if gigabytes else None
    written = number = 0
    with path.open("wb") as handle:
        batch = []
        while (prompts is None or number < prompts) and (limit_bytes is None or written < limit_bytes):
            line = json.dumps({"id": f"p{number:09d}", "messages": [
                {"role": "system", "content": "You are a careful expert tutor."},
                {"role": "user", "content": f"Question {number}: explain one result. {FILLER}"}]}).encode() + b"\n"
            batch.append(line)
            written += len(line)
            number += 1
            if len(batch) == 10000:
                handle.write(b"".join(batch))
                batch.clear()
        handle.write(b"".join(batch))
    built = {"wanted": wanted, "prompts": number, "bytes": written}
    marker.write_text(json.dumps(built))
    return built


def timed(function):
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started


def hash_pass(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def snapshot(path: Path, start: int, end: int, target: Path) -> int:
    """Copy ``[start, end)`` of the prompts file into the run's folder (the kernel copies; no Python loop)."""
    with path.open("rb") as source, target.open("wb") as sink:
        copied = 0
        while copied < end - start:
            sent = os.sendfile(sink.fileno(), source.fileno(), start + copied, min(1 << 30, end - start - copied))
            if sent == 0:
                break
            copied += sent
        os.fsync(sink.fileno())
    return copied


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--prompts", type=int, help="the prompts file's size in prompts (default: 1,000,000)")
    size.add_argument("--gigabytes", type=float, help="the prompts file's size in GB instead")
    parser.add_argument("--keep", type=Path, help="build in (and reuse) this directory")
    args = parse_args(parser, SMOKE)
    if args.prompts is None and args.gigabytes is None:  # `make bench` runs every script without arguments
        args.prompts = 1_000_000
    with tempfile.TemporaryDirectory(prefix="fleetgen-prompt-plan-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        prompts = root / "prompts.jsonl"
        built, seconds = timed(lambda: build(prompts, prompts=args.prompts, gigabytes=args.gigabytes))
        print(f"prompts file: {built['prompts']:,} prompts, {built['bytes'] / 1e9:.2f} GB ({seconds:.0f} s) "
              f"at {prompts}", flush=True)
        run = root / "run"
        run.mkdir(exist_ok=True)
        scan, scan_s = timed(lambda: scan_prompts(prompts, rejects_path=run / "rejects.jsonl"))
        scan_json = json.dumps(scan.to_dict()).encode()
        print(f"scan: {scan_s:.1f} s for {scan.count:,} prompts, {len(scan.digests)} block digests, "
              f"scan JSON {len(scan_json):,} bytes", flush=True)
        _, hash_s = timed(lambda: hash_pass(prompts))
        print(f"one SHA-256 pass over the file: {hash_s:.1f} s", flush=True)
        snapshot_path = run / "prompts.snapshot.jsonl"
        copied, snapshot_s = timed(lambda: snapshot(prompts, scan.index[0][1], scan.bytes, snapshot_path))
        snapshot_bytes = snapshot_path.stat().st_blocks * 512
        snapshot_path.unlink()
        print(f"snapshot: {snapshot_s:.1f} s to copy {copied:,} bytes; {snapshot_bytes:,} bytes on disk", flush=True)
        shards, plan_s = timed(lambda: plan_shards(prompts, shard_size=SHARD_SIZE, scan=scan))
        middle = shards[len(shards) // 2]
        read, check_s = timed(lambda: next(iter_shard_positions(
            middle["input_path"], middle["start"], middle["count"], end=middle["end"], blocks=middle["blocks"])))
        planned, planned_s = timed(lambda: read_planned_prompts(scan))
        print(f"plan: {len(shards)} shards in {plan_s:.2f} s; one shard's check before its first prompt "
              f"{check_s:.3f} s; validation's read of {len(planned.ids):,} planned ids {planned_s:.1f} s", flush=True)
        rejects_bytes = (run / "rejects.jsonl").stat().st_size
        if len(planned.ids) != scan.count or read[3].id != f"p{middle['first']:09d}":
            print("the planned prompts read back differ from the scan", file=sys.stderr)
            return 1
    print(f"prompt_plan prompts={scan.count} file_bytes={scan.bytes} scan_s={scan_s:.2f} hash_pass_s={hash_s:.2f} "
          f"snapshot_s={snapshot_s:.2f} snapshot_bytes={snapshot_bytes} scan_disk_bytes={rejects_bytes} "
          f"scan_json_bytes={len(scan_json)} plan_s={plan_s:.3f} shard_check_s={check_s:.3f} "
          f"planned_read_s={planned_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
