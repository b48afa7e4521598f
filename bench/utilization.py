"""Fleet utilisation: fleetgen's dispatcher against the seed's client on 7 simulated servers.

Launches 7 real simulated SGLang processes (the worked case after tuning: effective
max_running_requests 40 each) on a temporary node, one of them 30 % slower (fault ``speed 0.7``),
and generates the same synthetic prompts twice:

- fleetgen: two shards at once (as mapped tasks would run), each server's in-flight limit from
  its /server_info readback x the DAG's default headroom, split between the shards, pull-based;
- seed client: a fixed 96 requests in flight, prompt i sent to server i mod 7 (round robin).
  It uses the same HTTP transport, so the comparison is of the dispatch policy alone.

Utilisation = output tokens/s in steady state / the fleet's simulated capacity. Output tokens/s
is sampled from every server 20 times a second (its instantaneous decode rate, 0 while a prefill
stalls decoding: /metrics' sglang:gen_throughput) and averaged between the 10 %
and the 80 % completion: ramp-up and the tail are excluded (in a real run other shards cover a
shard's tail; the seed client has a tail of its own). Capacity is the most the simulated fleet can
produce for this workload: every server always at its full batch (the simulator's decode tokens/s
at full batch) less the decode time its prompts' prefills take; the decode-only bound is printed
too.

Usage: python bench/utilization.py [--prompts 2800] [--time-scale 10] [--smoke]
Last line: utilization fleetgen=<x.xxx> seed_client=<x.xxx>
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from _common import parse_args
from devstack.local_fleet import LocalSimFleet  # noqa: E402

from fleetgen.airflow.run_config import Generation  # noqa: E402
from fleetgen.generate import GenerationSettings, ShardRunOptions, run_shard_async  # noqa: E402
from fleetgen.generate.chat import CHAT_PATH, parse_chat_response, request_body  # noqa: E402
from fleetgen.generate.transport import PooledTransport  # noqa: E402
from fleetgen.prompts.planned import iter_shard
from fleetgen.prompts.scan import plan_shards, scan_prompts  # noqa: E402
from sglang_sim.synthetic import write_synthetic_prompts  # noqa: E402

SERVERS = 7
SLOW_SERVER = 3
SEED_CONCURRENCY = 96
SETTINGS = GenerationSettings(model="qwen3.6-27b", max_tokens=4096, request_timeout_s=600.0)
# The DAG parameter's own default, as a run without a headroom in its conf gets it.
HEADROOM = dict(Generation.settings())["headroom"].default_value()
SMOKE = {"prompts": 140}


class Sampler(threading.Thread):
    """Polls every server's /metrics 20 times a second while a run goes on."""

    def __init__(self, fleet: LocalSimFleet) -> None:
        super().__init__(daemon=True)
        self.time_scale = fleet.capacity(0)["time_scale"]
        self.connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for port in fleet.ports]
        self.samples: list[tuple[float, float, list[int]]] = []  # (time, fleet tok/s, running per server)
        self.stopped = threading.Event()

    def metrics(self, connection: http.client.HTTPConnection) -> dict[str, float]:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            readings = [self.metrics(connection) for connection in self.connections]
            rate = sum(m["sglang:gen_throughput"] for m in readings) * self.time_scale
            self.samples.append((time.time(), rate, [int(m["sglang:num_running_reqs"]) for m in readings]))
        for connection in self.connections:
            connection.close()

    def steady(self, completions: list[tuple[float, int, int]]) -> tuple[float, list[float]]:
        """(mean fleet tok/s, mean running per server) between the 10 % and the 80 % completion."""
        times = sorted(at for at, _, _ in completions)
        first, last = times[len(times) // 10], times[(len(times) * 8) // 10]
        window = [(rate, running) for at, rate, running in self.samples if first <= at <= last]
        mean_running = [sum(r[1][i] for r in window) / len(window) for i in range(SERVERS)]
        return sum(rate for rate, _ in window) / len(window), mean_running


def capacity(fleet: LocalSimFleet, mean_prompt: float, mean_output: float) -> tuple[float, float]:
    """(workload capacity, decode-only capacity) of the fleet in output tokens per wall second."""
    workload = decode_only = 0.0
    for index in range(SERVERS):
        sim = fleet.capacity(index)
        decode = sim["decode_tokens_per_s_at_full_batch"] * sim["time_scale"]
        prefill = sim["prefill_tokens_per_s"] * sim["time_scale"]
        # Per request: mean_output tokens of decode at full batch, plus its prefill stall.
        workload += mean_output / (mean_output / decode + mean_prompt / prefill)
        decode_only += decode
    return workload, decode_only


async def run_fleetgen(fleet: LocalSimFleet, shards: list[dict], out_dir: Path) -> list[tuple[float, int, int]]:
    endpoints = fleet.endpoints(headroom=HEADROOM, parallel_shards=len(shards))
    log = logging.getLogger("bench.fleetgen")
    await asyncio.gather(*(run_shard_async(shard, endpoints, out_dir, SETTINGS,
                                           options=ShardRunOptions(log=log, progress_interval_s=5.0))
                           for shard in shards))
    rows = []
    for path in (out_dir / "stats").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows.append((row["finished_at"], row["completion_tokens"], row["prompt_tokens"]))
    return rows


async def run_seed_client(fleet: LocalSimFleet, prompts: Path, count: int) -> list[tuple[float, int, int]]:
    urls = [httpx.URL(fleet.url(index) + CHAT_PATH) for index in range(SERVERS)]
    headers = httpx.Headers({"content-type": "application/json"})
    transport = PooledTransport()
    slots = asyncio.Semaphore(SEED_CONCURRENCY)
    timeout = {"timeout": {"connect": 10.0, "read": SETTINGS.effective_request_timeout_s}}
    rows = []

    async def generate(number: int, prompt) -> None:
        async with slots:
            body, _ = request_body(prompt, SETTINGS)
            response = await transport.handle_async_request(
                httpx.Request("POST", urls[number % SERVERS], content=body, headers=headers, extensions=timeout))
            await response.aread()
            usage = parse_chat_response(response.content).usage
            rows.append((time.time(), usage["completion_tokens"], usage["prompt_tokens"]))

    await asyncio.gather(*(generate(n, p) for n, p in enumerate(iter_shard(prompts, 0, count))))
    await transport.aclose()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2800)
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per wall second")
    args = parse_args(parser, SMOKE)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fleetgen-utilization-") as scratch:
        root = Path(scratch)
        prompts = write_synthetic_prompts(root / "prompts.jsonl", args.prompts)
        shards = plan_shards(prompts, shard_size=-(-args.prompts // 2), scan=scan_prompts(prompts))
        started = time.perf_counter()
        with LocalSimFleet(root / "fleet", SERVERS, sim={"time_scale": args.time_scale, "load_seconds": 0.5},
                           faults={SLOW_SERVER: {"speed": 0.7}}, extra_flags=("--enable-metrics",)) as fleet:
            print(f"{SERVERS} simulated servers up in {time.perf_counter() - started:.1f} s "
                  f"(server {SLOW_SERVER} at speed 0.7); {args.prompts} prompts, time scale {args.time_scale}")
            figures = {}
            for name, run in (("fleetgen", lambda: run_fleetgen(fleet, shards, root / "out")),
                              ("seed_client", lambda: run_seed_client(fleet, prompts, args.prompts))):
                started = time.perf_counter()
                sampler = Sampler(fleet)
                sampler.start()
                completions = asyncio.run(run())
                sampler.stopped.set()
                sampler.join()
                rate, running = sampler.steady(completions)
                mean_prompt = sum(c[2] for c in completions) / len(completions)
                mean_output = sum(c[1] for c in completions) / len(completions)
                workload_capacity, decode_capacity = capacity(fleet, mean_prompt, mean_output)
                figures[name] = rate / workload_capacity
                print(f"{name}: {len(completions)} completions in {time.perf_counter() - started:.1f} s; steady "
                      f"{rate:,.0f} output tok/s of {workload_capacity:,.0f} "
                      f"(decode-only bound {decode_capacity:,.0f}: "
                      f"{rate / decode_capacity:.3f}); running per server "
                      f"{' '.join(f'{r:.1f}' for r in running)}; mean {mean_prompt:.0f} prompt / {mean_output:.0f} "
                      f"output tokens")
    print(f"utilization fleetgen={figures['fleetgen']:.3f} seed_client={figures['seed_client']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
