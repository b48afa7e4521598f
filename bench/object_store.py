"""Output on an object store: what committing to SeaweedFS costs the dispatcher, a resume of 1,000,000 committed
completions, and the objects and bytes the commit log writes beside the data.

Starts a real S3-compatible store (SeaweedFS, devstack/seaweedfs.py) and 7 simulated SGLang servers, then:

- utilisation: the same prompts generated twice as two shards at once (as mapped tasks run), once with the output
  in a local folder and once committed to the store (``ShardRunOptions.output``), in alternating order over
  ``--rounds`` rounds. Each run's steady output tokens/s (bench/utilization.py's sampler: every server's
  /metrics 20 times a second, between the 10 % and the 80 % completion) over the fleet's capacity; the ratio is
  store / local of the medians.
- objects per 1,000 completions, and the bytes beyond the data (commit records and the plan), from the store runs.
- resume: ``--completions`` (1,000,000) committed through ``ObjectShardStore`` with its default bounds, then, in a
  fresh process, the open of a retry: list and read the log, read every stats part, fence. Peak memory is that
  process's maximum RSS (VmHWM), interpreter and Airflow's Amazon provider included. The completion text is kept short:
  a resume reads the stats parts only.

- validation: the same ``--completions`` validated (Great Expectations over the stats, validation/suite.py) from a
  local run folder, and from the store as the ``validate`` task does it (airflow/run_storage.py): the run's copy
  opened and every shard's committed stats and errors read into it, then the same suite; alternating order over
  ``--rounds`` rounds, the ratio is store / local of the medians.

Usage: python bench/object_store.py [--prompts 1400] [--rounds 2] [--completions 1000000] [--smoke]
Last line: object_store utilization_ratio=<x> resume_1m_s=<s> resume_1m_mb=<mb> validate_ratio=<x>
           objects_per_1k=<n> beyond_data_pct=<x>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args
from utilization import HEADROOM, SETTINGS, SLOW_SERVER, SERVERS, Sampler, capacity

from devstack.local_fleet import LocalSimFleet
from devstack.seaweedfs import start_seaweedfs
from fleetgen.generate import ShardRunOptions, jsonio, run_shard_async
from fleetgen.generate.commit_log import committed_lines
from fleetgen.generate.object_store import ObjectShardStore
from fleetgen.generate.records import stats_record
from fleetgen.prompts.scan import plan_shards, scan_prompts
from fleetgen.storage.location import parse_location
from fleetgen.storage.objects import ObjectStore
from sglang_sim.synthetic import write_synthetic_prompts

CONN_ID = "fleetgen_bench_store"
SMOKE = {"prompts": 140, "rounds": 1, "completions": 20_000}

MEASURE = r"""
import json, sys, time
started = time.perf_counter()
from fleetgen.generate.object_store import CommitBounds, ObjectShardStore
from fleetgen.storage.location import parse_location
from fleetgen.storage.objects import ObjectStore
imported = time.perf_counter()
store = ObjectStore.connect(parse_location(sys.argv[1], parameter="output_root"), conn_id=sys.argv[2],
                            parameter="output_root")
shard = json.loads(sys.argv[3])
opened_at = time.perf_counter()
writer, report = ObjectShardStore.open(store, shard, try_number=2)
seconds = time.perf_counter() - opened_at
writer.close()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent at fork, and the parent built the 1M commits.
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "imports_s": imported - started, "peak_kib": peak_kib,
                  "finished": report.finished}))
"""


def store_at(url: str) -> ObjectStore:
    return ObjectStore.connect(parse_location(url, parameter="output_root"), conn_id=CONN_ID, parameter="output_root")


async def generate(fleet: LocalSimFleet, shards: list[dict], scratch: Path, output: ObjectStore | None) -> None:
    endpoints = fleet.endpoints(headroom=HEADROOM, parallel_shards=len(shards))
    log = logging.getLogger("bench.object_store")
    await asyncio.gather(*(run_shard_async(shard, endpoints, scratch, SETTINGS,
                                           options=ShardRunOptions(log=log, progress_interval_s=5.0, output=output))
                           for shard in shards))


def completions_of(shards: list[dict], scratch: Path, output: ObjectStore | None) -> list[tuple[float, int, int]]:
    lines = []
    for shard in shards:
        if output is None:
            lines.extend((scratch / "stats" / f"shard-{shard['shard_id']:05d}.jsonl").read_bytes().splitlines())
        else:
            lines.extend(committed_lines(output, shard["shard_id"], "stats"))
    rows = [json.loads(line) for line in lines]
    return [(row["finished_at"], row["completion_tokens"], row["prompt_tokens"]) for row in rows]


def utilisation(fleet: LocalSimFleet, shards: list[dict], scratch: Path, output: ObjectStore | None) -> float:
    sampler = Sampler(fleet)
    sampler.start()
    asyncio.run(generate(fleet, shards, scratch, output))
    sampler.stopped.set()
    sampler.join()
    completions = completions_of(shards, scratch, output)
    rate, _ = sampler.steady(completions)
    mean_prompt = sum(c[2] for c in completions) / len(completions)
    mean_output = sum(c[1] for c in completions) / len(completions)
    return rate / capacity(fleet, mean_prompt, mean_output)[0]


def written(output: ObjectStore) -> tuple[int, int, int]:
    """(objects, bytes of parts, bytes of everything else) under ``output``."""
    objects = data = other = 0
    for info in output.iter_objects():
        objects += 1
        if "/parts/" in info.name:
            data += info.size
        else:
            other += info.size
    return objects, data, other


def build_committed(output: ObjectStore, count: int) -> dict:
    shard = {"shard_id": 0, "input_path": "/bench/prompts.jsonl", "start": 0, "count": count + 2000}
    writer, _ = ObjectShardStore.open(output, shard, try_number=1)
    for number in range(count):
        record = {"id": f"p{number:07d}", "messages": [{"role": "user", "content": f"Question {number}"}],
                  "reasoning_content": "Let me think. " * 10, "content": "The answer is 42.",
                  "finish_reason": "stop", "usage": {"prompt_tokens": 270, "completion_tokens": 2500},
                  "server": "gpu-node-1:30003", "latency_s": 93.512, "model": "qwen3.6-27b",
                  "sampling": {"max_tokens": 4096, "temperature": 0.6, "top_p": 0.95},
                  "finished_at": 1764400000.123 + number}
        writer.record_completion(jsonio.dumps(record) + b"\n", jsonio.dumps(stats_record(record)) + b"\n",
                                 record["id"])
    writer.close()
    return shard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1400)
    parser.add_argument("--rounds", type=int, default=2, help="local/store pairs, alternating which goes first")
    parser.add_argument("--completions", type=int, default=1_000_000, help="committed before the resume is timed")
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per wall second")
    args = parse_args(parser, SMOKE)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fleetgen-object-store-") as scratch_dir:
        root = Path(scratch_dir)
        seaweed = start_seaweedfs(root / "seaweedfs")
        os.environ.update(seaweed.connection_env(CONN_ID))
        try:
            return measure(args, root, seaweed)
        finally:
            seaweed.stop()


def measure(args: argparse.Namespace, root: Path, seaweed) -> int:
    prompts = write_synthetic_prompts(root / "prompts.jsonl", args.prompts)
    shards = plan_shards(prompts, shard_size=-(-args.prompts // 2), scan=scan_prompts(prompts))
    figures: dict[str, list[float]] = {"local": [], "store": []}
    objects = completions = data = other = 0
    with LocalSimFleet(root / "fleet", SERVERS, sim={"time_scale": args.time_scale, "load_seconds": 0.5},
                       faults={SLOW_SERVER: {"speed": 0.7}}, extra_flags=("--enable-metrics",)) as fleet:
        print(f"{SERVERS} simulated servers (server {SLOW_SERVER} at speed 0.7), {args.prompts} prompts in 2 shards, "
              f"time scale {args.time_scale}; SeaweedFS at {seaweed.endpoint_url}")
        for round_number in range(args.rounds):
            order = ("local", "store") if round_number % 2 == 0 else ("store", "local")
            for where in order:
                scratch = root / f"run-{round_number}-{where}"
                output = store_at(f"s3://{seaweed.bucket}/run-{round_number}") if where == "store" else None
                started = time.perf_counter()
                figures[where].append(utilisation(fleet, shards, scratch, output))
                print(f"round {round_number + 1} {where}: utilisation {figures[where][-1]:.3f} "
                      f"({time.perf_counter() - started:.1f} s)")
                if output is not None:
                    counted = written(output)
                    objects, data, other = objects + counted[0], data + counted[1], other + counted[2]
                    completions += args.prompts
    ratio = statistics.median(figures["store"]) / statistics.median(figures["local"])
    per_1k = objects / completions * 1000
    beyond = other / data * 100
    print(f"utilisation local {' '.join(f'{x:.3f}' for x in figures['local'])}, store "
          f"{' '.join(f'{x:.3f}' for x in figures['store'])}: ratio {ratio:.3f}; {objects} objects for {completions} "
          f"completions ({per_1k:.1f} per 1,000), {other:,} bytes of commits and plans beside {data:,} of parts "
          f"({beyond:.2f} %)")
    output = store_at(f"s3://{seaweed.bucket}/resume")
    started = time.perf_counter()
    shard = build_committed(output, args.completions)
    objects_1m, data_1m, other_1m = written(output)
    print(f"committed {args.completions:,} completions in {time.perf_counter() - started:.1f} s: {objects_1m} objects, "
          f"{data_1m / 2**20:,.0f} MiB of parts")
    result = subprocess.run([sys.executable, "-c", MEASURE, output.url(), CONN_ID, json.dumps(shard)],
                            check=True, capture_output=True, text=True, env=os.environ)
    resume = json.loads(result.stdout.strip().splitlines()[-1])
    if resume["finished"] != args.completions:
        print(f"resume found {resume['finished']} completions, expected {args.completions}", file=sys.stderr)
        return 1
    print(f"resume of {resume['finished']:,} committed completions: {resume['seconds']:.2f} s "
          f"(imports {resume['imports_s']:.1f} s before it), peak RSS {resume['peak_kib'] // 1024} MiB")
    validate_ratio = validation_ratio(seaweed, root, args.rounds)
    print(f"object_store utilization_ratio={ratio:.3f} resume_1m_s={resume['seconds']:.2f} "
          f"resume_1m_mb={resume['peak_kib'] // 1024} validate_ratio={validate_ratio:.2f} "
          f"objects_per_1k={per_1k:.1f} beyond_data_pct={beyond:.2f}")
    return 0


def validation_ratio(seaweed, root: Path, rounds: int) -> float:
    """Validation of the run committed under ``resume`` read from the store, over the same from a local folder."""
    from fleetgen.airflow.run_storage import read_committed
    from fleetgen.outputs import RunLayout
    from fleetgen.storage.mirror import RunMirror
    from fleetgen.validation.suite import validate_run
    from fleetgen.validation.thresholds import ValidationThresholds

    bucket = store_at(f"s3://{seaweed.bucket}")
    run_store = bucket.below("resume")
    local = RunLayout(root / "validate-local" / "resume")
    local.kind_dir("stats").mkdir(parents=True)
    with local.shard_file("stats", 0).open("wb") as handle:
        ids = []
        for line in committed_lines(run_store, 0, "stats"):
            handle.write(line)
            ids.append(json.loads(line)["id"])
    thresholds = ValidationThresholds(max_tokens=4096)

    def on_disk() -> None:
        validate_run(local.root, ids, thresholds, build_docs=False)

    def from_store() -> None:
        mirror = RunMirror.open(bucket, "resume", root / "validate-store")
        try:
            for kind in ("stats", "errors"):
                read_committed(mirror, run_store, kind)
            validate_run(mirror.run_root, ids, thresholds, build_docs=False)
        finally:
            mirror.close()

    times: dict[str, list[float]] = {"local": [], "store": []}
    for round_number in range(rounds):
        for where, run in (("local", on_disk), ("store", from_store))[::1 if round_number % 2 == 0 else -1]:
            started = time.perf_counter()
            run()
            times[where].append(time.perf_counter() - started)
            print(f"validation of {len(ids):,} completions, round {round_number + 1} {where}: "
                  f"{times[where][-1]:.1f} s")
    return statistics.median(times["store"]) / statistics.median(times["local"])


if __name__ == "__main__":
    sys.exit(main())
