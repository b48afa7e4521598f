"""Tokens/s on the simulated 7 x B200 node under three sizings of the same servers.

- auto: SGLang's automatic sizing (the seed's launch options, no memory flags);
- hand: the seed's hand-tuned flags (--max-mamba-cache-size 200 --mem-fraction-static 0.93
  --max-running-requests 64: effective 40 per server);
- plan: fleetgen's plan, derived from the node's own nvidia-smi output and the model directory.

Every arm runs the same prompts through the same client (fleetgen's dispatcher, each server's in-flight
limit from its own /server_info), so only the sizing differs. Ends with
``tune plan_cap=<int> plan/auto=<x.xx> plan/hand=<x.xx>``.
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
import time
from pathlib import Path

from fleetgen.nodes import probe
from fleetgen.nodes import remote
from fleetgen.generate import GenerationSettings, run_shard_async
from fleetgen.tuning.profile import LaunchOptions, profile_model, weights_bytes_from_index
from fleetgen.prompts.scan import plan_shards, scan_prompts
from sglang_sim.local_fleet import SEED_BASE_FLAGS, SEED_HAND_TUNED_FLAGS, LocalSimFleet, get_json
from sglang_sim.synthetic import write_synthetic_prompts
from fleetgen.tuning.planner import TunerBounds, Workload, plan_server

SERVERS = 7
MAX_TOKENS = 4096


def plan_flags(fleet: LocalSimFleet, prompts: Path) -> tuple[list[str], int]:
    """The tuner's flags for GPU 0 of the fleet's node (all 7 are alike), from its nvidia-smi."""
    # The DAG's own probe command, run "on" the node (its PATH holds the fake nvidia-smi).
    command = probe.probe_command(run_dir="~/fleetgen/run", module="sglang_sim.server", ports=fleet.ports)
    output = subprocess.run(["bash", "-c", command], env={**os.environ, **fleet.node.env()}, capture_output=True,
                            text=True, check=True).stdout
    inventory = probe.parse_probe_output(output, host="node0")
    config = json.loads((fleet.model_dir / "config.json").read_text())
    weights = weights_bytes_from_index(json.loads((fleet.model_dir / "model.safetensors.index.json").read_text()))
    options = LaunchOptions.from_args(SEED_BASE_FLAGS)
    scan = scan_prompts(prompts)
    workload = Workload(max_output_tokens=MAX_TOKENS, prompt_tokens_mean=scan.est_prompt_tokens_mean,
                        prompt_tokens_max=scan.est_prompt_tokens_max, prompt_count=scan.count)
    plan = plan_server(host="node0", gpu_ids=[0], port=fleet.ports[0], gpus=probe.select_gpus(inventory, [0]),
                       profile=profile_model(config, weights, options), options=options, workload=workload,
                       bounds=TunerBounds())
    return remote.flags_to_args(plan.flags), plan.expected["max_running_requests"]


def run_arm(name: str, root: Path, prompts: Path, shard: dict, time_scale: float, flags: list[str] | None) -> dict:
    fleet = LocalSimFleet(root / name, SERVERS, sim={"time_scale": time_scale, "load_seconds": 0.5},
                          flags=SEED_BASE_FLAGS)
    expected_cap = None
    if flags is None:  # the plan arm: derive from the node before launching
        flags, expected_cap = plan_flags(fleet, prompts)
    fleet.flags = flags + SEED_BASE_FLAGS
    with fleet:
        endpoints = fleet.endpoints(headroom=1.25, parallel_shards=1)
        effective = [e.max_in_flight for e in endpoints]
        settings = GenerationSettings(model="qwen3.6-27b", max_tokens=MAX_TOKENS)
        started = time.perf_counter()
        result = asyncio.run(run_shard_async(shard, endpoints, root / name / "out", settings,
                                             log=logging.getLogger(f"bench.{name}"), progress_interval_s=30.0))
        seconds = time.perf_counter() - started
        server_info = get_json(fleet.url(0) + "/server_info")
    cap = server_info["internal_states"][0]["effective_max_running_requests_per_dp"]
    tokens_per_s = result["completion_tokens"] / seconds
    print(f"{name:>4}: effective max_running_requests {cap} per server (in-flight limit {effective[0]}), "
          f"{result['done']} completions, {result['completion_tokens']:,} tokens in {seconds:.1f} s = "
          f"{tokens_per_s:,.0f} tok/s ({tokens_per_s / time_scale:,.0f} GPU-equivalent)"
          + (f"; plan expected {expected_cap}" if expected_cap is not None else ""), flush=True)
    return {"cap": cap, "tokens_per_s": tokens_per_s, "done": result["done"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2800)
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per wall second")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fleetgen-tune-") as scratch:
        root = Path(scratch)
        prompts = write_synthetic_prompts(root / "prompts.jsonl", args.prompts)
        (shard,) = plan_shards(prompts, shard_size=args.prompts, scan=scan_prompts(prompts))
        print(f"{SERVERS} simulated B200 servers, {args.prompts} prompts, max_tokens {MAX_TOKENS}, "
              f"time scale {args.time_scale:g}", flush=True)
        arms = {"auto": run_arm("auto", root, prompts, shard, args.time_scale, []),
                "hand": run_arm("hand", root, prompts, shard, args.time_scale, list(SEED_HAND_TUNED_FLAGS)),
                "plan": run_arm("plan", root, prompts, shard, args.time_scale, None)}
    plan = arms["plan"]
    print(f"tune plan_cap={plan['cap']} plan/auto={plan['tokens_per_s'] / arms['auto']['tokens_per_s']:.2f} "
          f"plan/hand={plan['tokens_per_s'] / arms['hand']['tokens_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
