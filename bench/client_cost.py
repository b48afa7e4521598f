"""Client CPU per completed request: run_shard against servers that answer instantly.

A separate process (pinned to the other core) serves 7 ports on loopback and answers every
chat request at once with the same ~10 KB completion (reasoning ~8.3 KB, answer ~1.5 KB), and
every /metrics scrape with the gauges a shard samples. This
process, pinned to one core, runs ``run_shard`` over 20,000 synthetic prompts with 50 in flight
per server, so everything a real shard does per request is counted: building the body, HTTP,
parsing the response, writing the completion and stats lines (the checkpoint). The figure is this
process's user+system CPU time for the whole ``run_shard`` call divided by the completions. For
comparison it then runs a smaller shard through httpx's default connection pool.

Usage: python bench/client_cost.py [--prompts 20000] [--compare 3000] [--smoke]
Last line: client_cost us_per_request=<x.x>
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _common import parse_args
from fleetgen.generate import GenerationSettings, ServerEndpoint, ShardRunOptions, run_shard
from fleetgen.prompts.scan import plan_shards
from sglang_sim.synthetic import write_synthetic_prompts

SERVERS = 7
IN_FLIGHT = 50
SMOKE = {"prompts": 300, "compare": 100}

SERVER = r"""
import asyncio, json, os, sys
words = "the model considers each step of the problem and checks the result again before it answers".split()
text = lambda n: " ".join(words[i % len(words)] for i in range(n))
body = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1764400000, "model": "qwen3.6-27b",
    "choices": [{"index": 0, "finish_reason": "stop", "matched_stop": 151645,
                 "message": {"role": "assistant", "content": text(250), "reasoning_content": text(1390),
                             "tool_calls": None}}],
    "usage": {"prompt_tokens": 271, "completion_tokens": 2480, "total_tokens": 2751,
              "prompt_tokens_details": None, "reasoning_tokens": 2100}}).encode()
head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
# Any GET (the shard's /metrics sampling, as a real shard does it): the gauges it reads, at once.
gauges = "".join(f'sglang:{name}{{model_name="qwen3.6-27b"}} {value}\n' for name, value in (
    ("num_running_reqs", 40), ("num_queue_reqs", 10), ("token_usage", 0.3), ("gen_throughput", 900.0))).encode()
metrics = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(gauges), gauges)
async def handle(reader, writer):
    try:
        while True:
            request = await reader.readuntil(b"\r\n\r\n")
            length = next((int(l.split(b":")[1]) for l in request.split(b"\r\n")
                           if l.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(head + body if request.startswith(b"POST") else metrics)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
async def main():
    servers = [await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024) for _ in range(int(sys.argv[1]))]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def measure(prompts: Path, count: int, out_dir: Path, endpoints: list[ServerEndpoint],
            transport: httpx.AsyncBaseTransport | None = None) -> tuple[float, dict]:
    shard = plan_shards(prompts, shard_size=count)[0]
    settings = GenerationSettings(model="qwen3.6-27b", max_tokens=4096, request_timeout_s=60.0)
    before = resource.getrusage(resource.RUSAGE_SELF)
    summary = run_shard(shard, endpoints, out_dir, settings,
                        options=ShardRunOptions(transport=transport, progress_interval_s=5.0))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu_s / summary["done"] * 1e6, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--compare", type=int, default=3_000, help="prompts through httpx's default pool (0: skip)")
    args = parse_args(parser, SMOKE)
    logging.basicConfig(level=logging.WARNING)
    cores = sorted(os.sched_getaffinity(0))
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(SERVERS)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if len(cores) > 1 else None)
    try:
        ports = json.loads(server.stdout.readline())
        os.sched_setaffinity(0, {cores[0]})
        endpoints = [ServerEndpoint(name=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}", max_in_flight=IN_FLIGHT)
                     for port in ports]
        with tempfile.TemporaryDirectory(prefix="fleetgen-client-cost-") as scratch:
            root = Path(scratch)
            prompts = write_synthetic_prompts(root / "prompts.jsonl", max(args.prompts, args.compare))
            response_bytes = len(httpx.post(endpoints[0].url + "/v1/chat/completions", json={}).content)
            started = time.perf_counter()
            us_per_request, summary = measure(prompts, args.prompts, root / "out", endpoints)
            wall = time.perf_counter() - started
            written = sum(f.stat().st_size for f in (root / "out").rglob("*.jsonl"))
            print(f"{summary['done']:,} requests of {response_bytes:,} B responses, {SERVERS} servers x {IN_FLIGHT} "
                  f"in flight, on core {cores[0]}: {wall:.1f} s wall, {written / 1e6:.0f} MB written")
            if args.compare:
                default_us, _ = measure(prompts, args.compare, root / "out-httpx", endpoints,
                                        transport=httpx.AsyncHTTPTransport(
                                            limits=httpx.Limits(max_connections=SERVERS * IN_FLIGHT)))
                print(f"same path through httpx's default connection pool ({args.compare:,} requests): "
                      f"{default_us:.1f} us per request")
    finally:
        server.terminate()
        server.wait()
    print(f"client_cost us_per_request={us_per_request:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
