"""Tokens/s on the simulated 7 x B200 node under the sizings of the same servers, and the workload plan
learning night by night.

- auto: SGLang's automatic sizing (the seed's launch options, no memory flags);
- hand: the seed's hand-tuned flags (--max-mamba-cache-size 200 --mem-fraction-static 0.93
  --max-running-requests 64: effective 40 per server);
- plan: fleetgen's full-context plan, derived from the node's own nvidia-smi output and the model;
- night N: the workload plan (fleetgen.tuning.workload), learning from the run before it: the
  prompt and output lengths of its stats, each server's peak KV held (``sglang:num_used_tokens``
  sampled from /metrics) and its retractions (``sglang:num_retracted_requests_total``). Nights run
  until the next plan would not change (settled) or ``--max-nights``.

Every arm runs the same prompts through the same client (fleetgen's dispatcher, each server's in-flight
limit from its own /server_info), so only the sizing differs. Ends with
``tune plan_cap=<int> workload_cap=<int> plan/hand=<x.xx> workload/hand=<x.xx> retracted=<n> nights=<n>``
(the settled night's figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import parse_args
from utilization import HEADROOM
from fleetgen.generate import GenerationSettings, ShardRunOptions, run_shard_async
from fleetgen.nodes import probe, remote
from fleetgen.prompts.scan import plan_shards, scan_prompts
from fleetgen.tuning.planner import TunerBounds, Workload, plan_server, render_budget_table, resolved_page_size
from fleetgen.tuning.profile import LaunchOptions, profile_model, weights_bytes_from_index
from fleetgen.tuning.workload import (KvDemand, RunObservation, decode_reserve_tokens, parse_metrics,
                                      plan_workload_server)
from fleetgen.validation.stats_table import load_stats
from devstack.local_fleet import SEED_BASE_FLAGS, SEED_HAND_TUNED_FLAGS, LocalSimFleet, get_json
from sglang_sim.synthetic import write_synthetic_prompts

SERVERS = 7
MAX_TOKENS = 4096
METRICS_FLAGS = ["--enable-metrics"]
SAMPLE_WALL_S = 0.2
SMOKE = {"prompts": 280, "max_nights": 1}


def node_planner(fleet: LocalSimFleet, prompts: Path):
    """``plan_with(bounds)`` for GPU 0 of the fleet's node (all 7 are alike), from its nvidia-smi, and the
    launch options (for the decode reserve)."""
    # The DAG's own probe command, run "on" the node (its PATH holds the fake nvidia-smi).
    command = probe.probe_command(run_dir="~/fleetgen/run", module="sglang_sim.server", ports=fleet.ports)
    output = subprocess.run(["bash", "-c", command], env={**os.environ, **fleet.node.env()}, capture_output=True,
                            text=True, check=True).stdout
    inventory = probe.parse_probe_output(output, host="node0")
    config = json.loads((fleet.model_dir / "config.json").read_text())
    weights = weights_bytes_from_index(json.loads((fleet.model_dir / "model.safetensors.index.json").read_text()))
    options = LaunchOptions.from_args(SEED_BASE_FLAGS)
    profile = profile_model(config, weights, options)
    scan = scan_prompts(prompts)
    workload = Workload(max_output_tokens=MAX_TOKENS, prompt_tokens_mean=scan.est_prompt_tokens_mean,
                        prompt_tokens_max=scan.est_prompt_tokens_max, prompt_count=scan.count)

    def plan_with(bounds: TunerBounds):
        return plan_server(host="node0", gpu_ids=[0], port=fleet.ports[0], gpus=probe.select_gpus(inventory, [0]),
                           profile=profile, options=options, workload=workload, bounds=bounds)

    page_size = resolved_page_size(profile, options, probe.select_gpus(inventory, [0]), TunerBounds())
    reserve = decode_reserve_tokens(profile.spec_steps, profile.spec_topk, profile.draft_tokens, page_size)
    return plan_with, page_size, reserve


class PeakSampler(threading.Thread):
    """Samples every server's ``sglang:num_used_tokens`` (SGLang has no peak gauge) until stopped."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.peaks, self.stop = urls, [0.0] * len(urls), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_WALL_S):
            for index, url in enumerate(self.urls):
                try:
                    with urllib.request.urlopen(url + "/metrics", timeout=2) as response:
                        used = parse_metrics(response.read().decode()).get("sglang:num_used_tokens", 0.0)
                except OSError:
                    continue
                self.peaks[index] = max(self.peaks[index], used)


def run_arm(name: str, root: Path, shard: dict, time_scale: float, flags: list[str]) -> dict:
    fleet = LocalSimFleet(root / name, SERVERS, sim={"time_scale": time_scale, "load_seconds": 0.5},
                          flags=flags + SEED_BASE_FLAGS + METRICS_FLAGS)
    with fleet:
        endpoints = fleet.endpoints(headroom=HEADROOM, parallel_shards=1)
        urls = [fleet.url(i) for i in range(SERVERS)]
        sampler = PeakSampler(urls)
        sampler.start()
        settings = GenerationSettings(model="qwen3.6-27b", max_tokens=MAX_TOKENS)
        started = time.perf_counter()
        result = asyncio.run(run_shard_async(shard, endpoints, root / name / "out", settings,
                                             options=ShardRunOptions(log=logging.getLogger(f"bench.{name}"),
                                                                     progress_interval_s=30.0)))
        seconds = time.perf_counter() - started
        sampler.stop.set()
        sampler.join()
        server_info = get_json(urls[0] + "/server_info")
        metrics = [parse_metrics(urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()) for url in urls]
    state = server_info["internal_states"][0]
    cap = state["effective_max_running_requests_per_dp"]
    step_ms = state["sim"]["step_ms_at_full_batch"]
    retracted = int(sum(m.get("sglang:num_retracted_requests_total", 0) for m in metrics))
    finished = result["done"]
    observation = RunObservation(max_running_requests=cap, max_total_num_tokens=server_info["max_total_num_tokens"],
                                 peak_used_tokens=int(max(sampler.peaks)), retracted_requests=retracted,
                                 finished_requests=finished)
    tokens_per_s = result["completion_tokens"] / seconds
    print(f"{name:>7}: effective max_running_requests {cap} per server (in-flight limit {endpoints[0].max_in_flight}), "
          f"KV pool {observation.max_total_num_tokens:,} tokens, peak held {observation.peak_used_tokens:,}, "
          f"{retracted} retractions ({observation.retraction_rate:.2%}), {finished} completions, "
          f"{result['completion_tokens']:,} tokens in {seconds:.1f} s = {tokens_per_s:,.0f} tok/s "
          f"({tokens_per_s / time_scale:,.0f} GPU-equivalent)", flush=True)
    return {"cap": cap, "tokens_per_s": tokens_per_s, "done": finished, "retracted": retracted, "step_ms": step_ms,
            "observation": observation, "stats": load_stats(root / name / "out")}


def print_bounds(plan, demand: KvDemand, hand: dict, settled: dict) -> None:
    """What bounds the workload plan: memory per running request, and decode step time growth."""
    profile = plan.inputs["resolved_profile"]
    slot = profile["state_bytes_per_slot"]
    state = slot * profile["state_slots_per_request"]
    spec = slot * profile["draft_tokens"]
    kv = demand.mean * profile["kv_bytes_per_token"]
    rows = {row["item"].strip(): row["bytes"] for row in plan.budget}
    pools = rows["state slots"] + rows.get("speculative buffers", 0) + rows["KV pool"]
    mib = 1 << 20
    print(f"bounds: per running request {state / mib:,.0f} MiB Mamba slots + {spec / mib:,.0f} MiB speculative "
          f"buffers + {kv / mib:,.0f} MiB KV at the workload mean ({demand.mean:,.0f} tokens); with no KV at all "
          f"the pools ({pools / mib:,.0f} MiB) would hold {int(pools // (state + spec))} requests", flush=True)
    ideal = (settled["cap"] / settled["step_ms"]) / (hand["cap"] / hand["step_ms"])
    print(f"bounds: decode step {hand['step_ms']:.1f} ms at {hand['cap']} requests, {settled['step_ms']:.1f} ms at "
          f"{settled['cap']}: at most {ideal:.2f} x hand's tokens/s with full batches", flush=True)


def learn_nights(root: Path, shard: dict, time_scale: float, planner, first: dict, max_nights: int) -> tuple[dict, int]:
    """Workload plans, each from the run before, until the next plan would repeat the last one."""
    plan_with, page_size, reserve = planner
    previous, ceiling, night_arm = first, None, first
    for night in range(1, max_nights + 1):
        demand = KvDemand.from_stats(previous["stats"], page_size=page_size, reserve_tokens=reserve)
        plan = plan_workload_server(plan_with, TunerBounds(), demand=demand, previous=previous["observation"],
                                    ceiling=ceiling)
        ceiling = plan.inputs["workload_mode"]["step"]["ceiling"]
        print(f"night {night}:\n{render_budget_table(plan)}", flush=True)
        night_arm = run_arm(f"night{night}", root, shard, time_scale, remote.flags_to_args(plan.flags))
        demand = KvDemand.from_stats(night_arm["stats"], page_size=page_size, reserve_tokens=reserve)
        following = plan_workload_server(plan_with, TunerBounds(), demand=demand,
                                         previous=night_arm["observation"], ceiling=ceiling)
        step = following.inputs["workload_mode"]["step"]
        print(f"after night {night}: next cap {step['cap']} ({step['reason']})", flush=True)
        if step["cap"] == night_arm["cap"]:
            return night_arm, night, plan, demand
        previous = night_arm
    return night_arm, max_nights, plan, demand


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 1,600 prompts per server: enough batches that the start (the ratio decaying) and the tail (the last
    # long answers) do not dominate; with 400 per server the workload plan's gain disappears in them
    parser.add_argument("--prompts", type=int, default=11200)
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per wall second")
    parser.add_argument("--max-nights", type=int, default=6)
    args = parse_args(parser, SMOKE)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fleetgen-tune-") as scratch:
        root = Path(scratch)
        prompts = write_synthetic_prompts(root / "prompts.jsonl", args.prompts)
        (shard,) = plan_shards(prompts, shard_size=args.prompts, scan=scan_prompts(prompts))
        print(f"{SERVERS} simulated B200 servers, {args.prompts} prompts, max_tokens {MAX_TOKENS}, "
              f"time scale {args.time_scale:g}", flush=True)
        planner = node_planner(LocalSimFleet(root / "probe", SERVERS, sim={"time_scale": args.time_scale}), prompts)
        full = planner[0](TunerBounds())
        print(f"full-context plan:\n{render_budget_table(full)}", flush=True)
        arms = {"auto": run_arm("auto", root, shard, args.time_scale, []),
                "hand": run_arm("hand", root, shard, args.time_scale, list(SEED_HAND_TUNED_FLAGS)),
                "plan": run_arm("plan", root, shard, args.time_scale, remote.flags_to_args(full.flags))}
        settled, nights, plan, demand = learn_nights(root, shard, args.time_scale, planner, arms["plan"],
                                                     args.max_nights)
    print_bounds(plan, demand, arms["hand"], settled)
    hand = arms["hand"]["tokens_per_s"]
    print(f"auto/hand={arms['auto']['tokens_per_s'] / hand:.2f}")
    print(f"tune plan_cap={arms['plan']['cap']} workload_cap={settled['cap']} "
          f"plan/hand={arms['plan']['tokens_per_s'] / hand:.2f} workload/hand={settled['tokens_per_s'] / hand:.2f} "
          f"retracted={settled['retracted']} nights={nights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
