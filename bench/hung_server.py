"""What one hung server costs a run: shard health shared through the run folder vs each shard on its own.

Launches 3 real simulated SGLang processes, one of which hangs (fault ``hang_after_requests``: it
stops answering every route, /health included, but keeps connections open) shortly after the run
starts, then generates the same synthetic prompts twice, in shards that run ``--concurrent`` at a
time (the next starts when one finishes, as mapped tasks in a pool do), each shard holding
1/concurrent of every server's limit:

- shared: ``share_server_health`` on (the default): the first shard to find the server hung marks
  it down in ``servers-health.json``; every other shard, running or starting later, skips it;
- isolated: each shard finds out for itself, as before.

Lost capacity: for each shard, the seconds from the hang (or the shard's start, if later) until
the shard marks the hung server down, times the shard's share of that server's limit; summed over
the shards. That is how long the hung server's slots held requests that could have gone to the
healthy servers, in server-seconds. Detection uses the stall watchdog: ``stall_check_s`` of silence,
then a /health probe that fails after ``health_timeout_s`` (the defaults of GenerationSettings,
printed below).

Usage: python bench/hung_server.py [--shards 6] [--concurrent 2] [--prompts-per-shard 120] [--smoke]
Last line: hung_server shared_lost_s=<x.x> isolated_lost_s=<y.y> shards=<n>
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import parse_args
from devstack.local_fleet import LocalSimFleet  # noqa: E402
from sglang_sim.synthetic import write_synthetic_prompts  # noqa: E402

from fleetgen.generate import GenerationSettings, ShardRunOptions, run_shard_async  # noqa: E402
from fleetgen.prompts.scan import plan_shards, scan_prompts  # noqa: E402

SERVERS = 3
HUNG = 2
SMOKE = {"shards": 2}  # the fault needs its default 120 prompts a shard to fire
SETTINGS = dict(model="qwen3.6-27b", max_tokens=1024, request_timeout_s=600.0, recheck_initial_s=1.0,
                recheck_max_s=5.0, retry_backoff_s=0.1)


class MarkDowns(logging.Handler):
    """When each shard marked a given server down (monotonic time of the log record), first only."""

    def __init__(self, server: str) -> None:
        super().__init__(logging.WARNING)
        self.server = server
        self.at: dict[int, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if "marked down at" in record.msg and record.args and record.args[1] == self.server:
            self.at.setdefault(int(record.args[0]), time.monotonic())


class HangWatch(threading.Thread):
    """Polls the faulty server's /health; the first poll left unanswered is when it hung."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.hung_at: float | None = None

    def run(self) -> None:
        while self.hung_at is None:
            started = time.monotonic()
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=0.5).read()
            except OSError:
                self.hung_at = started
                return
            time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))


async def run_arm(fleet: LocalSimFleet, shards: list[dict], out_dir: Path, *, shared: bool,
                  concurrent: int) -> tuple[dict[int, float], MarkDowns, HangWatch]:
    endpoints = fleet.endpoints(parallel_shards=concurrent)
    hung_name = endpoints[HUNG].name
    settings = GenerationSettings(**SETTINGS, share_server_health=shared)
    log = logging.getLogger("fleetgen.generate")
    marks = MarkDowns(hung_name)
    log.addHandler(marks)
    watch = HangWatch(fleet.url(HUNG))
    watch.start()
    started: dict[int, float] = {}
    slots = asyncio.Semaphore(concurrent)

    async def one(shard: dict) -> None:
        async with slots:
            started[shard["shard_id"]] = time.monotonic()
            await run_shard_async(shard, endpoints, out_dir, settings,
                                  options=ShardRunOptions(log=log, progress_interval_s=30.0))

    try:
        await asyncio.gather(*(one(shard) for shard in shards))
    finally:
        log.removeHandler(marks)
    return started, marks, watch


def lost_seconds(started: dict[int, float], marks: MarkDowns, hung_at: float | None, concurrent: int) -> list[float]:
    if hung_at is None:
        raise RuntimeError("the faulty server never hung: raise --prompts-per-shard or lower the fault's count")
    lost = []
    for shard_id, start in sorted(started.items()):
        if shard_id not in marks.at:  # it finished with nothing left on the server when it hung
            lost.append(0.0)
            continue
        lost.append(max(0.0, marks.at[shard_id] - max(start, hung_at)) / concurrent)
    return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--prompts-per-shard", type=int, default=120)
    parser.add_argument("--time-scale", type=float, default=10.0)
    args = parse_args(parser, SMOKE)
    logging.basicConfig(stream=sys.stderr)
    logging.getLogger().handlers[0].setLevel(logging.ERROR)  # the mark-down warnings are counted, not printed
    logging.getLogger("fleetgen.generate").setLevel(logging.WARNING)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="fleetgen-hung-") as tmp:
        root = Path(tmp)
        prompts = write_synthetic_prompts(root / "prompts.jsonl", args.shards * args.prompts_per_shard)
        shards = plan_shards(prompts, shard_size=args.prompts_per_shard, scan=scan_prompts(prompts))
        for arm, shared in (("shared", True), ("isolated", False)):
            with LocalSimFleet(root / f"fleet-{arm}", SERVERS, sim={"time_scale": args.time_scale, "load_seconds": 0.3},
                               faults={HUNG: {"hang_after_requests": 30}}) as fleet:
                began = time.monotonic()
                started, marks, watch = asyncio.run(run_arm(fleet, shards, root / f"out-{arm}", shared=shared,
                                                            concurrent=args.concurrent))
                lost = lost_seconds(started, marks, watch.hung_at, args.concurrent)
            figures[arm] = sum(lost)
            print(f"{arm:>8}: run {time.monotonic() - began:6.1f} s; lost server-seconds per shard "
                  f"{', '.join(f'{x:.1f}' for x in lost)}; total {sum(lost):.1f}")
    print(f"settings: stall_check_s={GenerationSettings.stall_check_s} health_timeout_s={GenerationSettings.health_timeout_s}, "
          f"{args.shards} shards of {args.prompts_per_shard} prompts, {args.concurrent} at a time, "
          f"{SERVERS} servers (one hung)")
    print(f"hung_server shared_lost_s={figures['shared']:.1f} isolated_lost_s={figures['isolated']:.1f} "
          f"shards={args.shards}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
