"""Retraction on the real SGLang 0.5.23 server, what the workload mode learns from it, and the simulator under
the same load (docs/sglang-scheduler.md §4, §7, §8).

Per model kind (dense, hybrid) one server with a 512-token KV pool takes one batch ``/generate`` of 12 requests,
32 prompt tokens and exactly 100 output tokens each. At their ends the 12 hold 1,584 tokens, three times the
pool: SGLang admits past the pool on the decaying new-token ratio and retracts when decode runs out.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetgen.nodes import remote
from fleetgen.tuning.workload import RETRACTION_BOUND, next_cap, parse_metrics
from fleetgen.tuning.workload_history import observations
from sglang_sim.engine import BatchEngine, SimClock
from sglang_sim.perf import Timing
from tests.real_sglang import server as real

POOL = 512
REQUESTS = 12
PROMPT_TOKENS = 32
MAX_NEW_TOKENS = 100
HOST = "cpu-node-1"
# A Decode batch line every decode step: the log's peak is then the true one, not a sample every 40 steps.
LOG_EVERY_STEP = ("--decode-log-interval", "1")
KIND_FLAGS = {
    "dense": (),
    # as the real_hybrid_server fixture (conftest.py): SGLang caps the running requests to the Mamba slots
    "hybrid": (*real.HYBRID_FLAGS, "--max-mamba-cache-size", "16", "--max-running-requests", "8"),
}
POOLS_LINE = re.compile(r"max_total_num_tokens=(\d+), .*max_running_requests=(\d+)")
DECODE_TOKENS = re.compile(r"Decode batch, .*?#(?:full )?token: (\d+)")
RETRACTED = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


def _prompt(index: int) -> list[int]:
    # distinct token ids per request (no shared prefix in the radix cache), clear of the special tokens 0-4
    return [(7 * index + position) % 500 + 5 for position in range(PROMPT_TOKENS)]


# Exactly MAX_NEW_TOKENS each. min_new_tokens, not ignore_eos: SGLang reserves an ignore_eos request's whole
# remaining budget at admission (sglang/srt/managers/schedule_policy.py,
# PrefillAdder._get_running_request_total_token_offset), so such a load never outgrows the pool.
SAMPLING = {"max_new_tokens": MAX_NEW_TOKENS, "min_new_tokens": MAX_NEW_TOKENS, "temperature": 0}


@dataclass
class RealRun:
    kind: str
    port: int
    log_dir: Path
    log: str
    outputs: list[dict]           # meta_info per request, in request order
    metrics: dict[str, float]     # /metrics after the load
    peak_used_tokens: float       # largest sglang:num_used_tokens scraped during the load
    peak_token_usage: float       # largest sglang:token_usage scraped during the load
    load_seconds: float

    @property
    def pool(self) -> int:
        return int(POOLS_LINE.search(self.log).group(1))

    @property
    def max_running_requests(self) -> int:
        return int(POOLS_LINE.search(self.log).group(2))

    @property
    def most_running(self) -> int:
        """Requests running at once at most: one decode step grows the KV held by as many tokens."""
        return min(self.max_running_requests, REQUESTS)

    @property
    def log_retracted(self) -> int:
        return sum(int(n) for n in RETRACTED.findall(self.log))

    @property
    def log_peak(self) -> int:
        return max(int(n) for n in DECODE_TOKENS.findall(self.log))

    @property
    def retracted_requests(self) -> list[int]:
        return [index for index, meta in enumerate(self.outputs) if meta.get("num_retractions")]


def _scrape(url: str, done: threading.Event, peaks: dict) -> None:
    """The largest gauges seen until ``done``: SGLang exports no peak (docs/sglang-scheduler.md §5)."""
    while not done.is_set():
        try:
            values = parse_metrics(real.get(f"{url}/metrics", timeout=5)[1].decode())
        except OSError:
            values = {}
        for name in ("sglang:num_used_tokens", "sglang:token_usage"):
            peaks[name] = max(peaks.get(name, 0.0), values.get(name, 0.0))
        done.wait(0.05)


@pytest.fixture(scope="module", params=sorted(KIND_FLAGS))
def real_run(request, tiny_models, tmp_path_factory) -> RealRun:
    """One server per kind, the load, then the server stopped (the tests read what it left)."""
    from devstack.demo import free_port_block

    kind = request.param
    port = free_port_block(1)
    log_dir = tmp_path_factory.mktemp(f"scheduler-{kind}")
    # the log where the product looks for it on a node (remote.log_file)
    server = real.RealServer(model_dir=tiny_models[kind], port=port, log_path=Path(remote.log_file(str(log_dir), port)),
                             kv_tokens=POOL, flags=(*LOG_EVERY_STEP, *KIND_FLAGS[kind])).start()
    peaks: dict[str, float] = {}
    done = threading.Event()
    try:
        server.wait_ready()
        scraper = threading.Thread(target=_scrape, args=(server.url, done, peaks), daemon=True)
        scraper.start()
        started = time.monotonic()
        # one batch reaches the scheduler as one message (BatchTokenizedGenerateReqInput): one admission pass
        status, body = real.post_json(f"{server.url}/generate",
                                      {"input_ids": [_prompt(i) for i in range(REQUESTS)], "sampling_params": SAMPLING},
                                      timeout=600)
        load_seconds = time.monotonic() - started
        done.set()
        scraper.join()
        assert status == 200, body
        metrics = parse_metrics(real.get(f"{server.url}/metrics")[1].decode())
    finally:
        done.set()
        server.stop()
    return RealRun(kind=kind, port=port, log_dir=log_dir, log=server.log_text(),
                   outputs=[item["meta_info"] for item in body], metrics=metrics,
                   peak_used_tokens=peaks.get("sglang:num_used_tokens", 0.0),
                   peak_token_usage=peaks.get("sglang:token_usage", 0.0), load_seconds=load_seconds)


def test_the_real_server_retracts_and_says_so_three_ways(real_run):
    assert (real_run.pool, len(real_run.outputs)) == (POOL, REQUESTS)
    assert [meta["completion_tokens"] for meta in real_run.outputs] == [MAX_NEW_TOKENS] * REQUESTS
    retracted = real_run.log_retracted
    assert retracted > 0, real_run.log[-4000:]
    # the log's sum, the counter and the requests' own count agree
    assert real_run.metrics["sglang:num_retracted_requests_total"] == retracted
    assert sum(meta["num_retractions"] for meta in real_run.outputs) == retracted
    assert real_run.metrics["sglang:num_retracted_input_tokens_total"] == PROMPT_TOKENS * retracted


def test_the_peak_kv_in_use_fills_the_pool(real_run):
    # decode retracts once the next step's token per running request no longer fits
    peak = real_run.log_peak
    assert POOL - real_run.most_running <= peak <= POOL
    # the gauge is sampled between steps, by a poller a busy machine may delay past the peak: never above the
    # log's peak, and well into the pool
    assert POOL / 2 <= real_run.peak_used_tokens <= peak
    # token_usage is rounded to two decimals (scheduler_components/pool_stats_observer.py) and its peak need not
    # fall in the scrape that saw the token count's: 0.99 beside 512 of 512 was seen on the hybrid server
    assert real_run.peak_token_usage == pytest.approx(real_run.peak_used_tokens / POOL, abs=0.02)


def _product_observation(run: RealRun):
    """What the workload mode reads on the node: ``scheduler_log_command``'s output for the server's port,
    turned into a RunObservation with the plan the server ran and its finished requests."""
    output = subprocess.run(["bash", "-c", remote.scheduler_log_command(str(run.log_dir), [run.port])],
                            capture_output=True, text=True, check=True).stdout
    server = f"{HOST}:{run.port}"
    record = {server: {"max_running_requests": run.max_running_requests, "max_total_num_tokens": run.pool,
                       "ceiling": None}}
    return observations(output, HOST, record, {server: len(run.outputs)})[server]


def test_the_workload_mode_steps_back_from_the_real_retractions(real_run):
    seen = _product_observation(real_run)
    assert (seen.retracted_requests, seen.finished_requests) == (real_run.log_retracted, REQUESTS)
    assert seen.retraction_rate > RETRACTION_BOUND
    last = real_run.max_running_requests
    step = next_cap(full_context_cap=1, target_cap=2 * last, previous=seen, ceiling=None,
                    pool_tokens_at=lambda n: POOL)
    assert step.cap < last and step.ceiling == last and "retractions" in step.reason


def test_the_workload_mode_reads_the_real_peak(real_run):
    # a dense server logs `#token: N`, a hybrid one `#full token: N` (sglang/srt/managers/scheduler_components/
    # pool_stats_observer.py::get_decode_usage_msg_parts)
    assert _product_observation(real_run).peak_used_tokens == real_run.log_peak


# The simulator's engine with a flat step time and free prefill: its admission and retraction decisions
# depend on token counts and decode steps, not on time. Its clock runs on the event loop's: a slow time scale
# keeps a late wake-up from counting decode steps the real scheduler does not run.
FLAT = Timing(step_base_s=0.01, expert_stream_s=0.0, step_per_request_s=0.0, accept_length=1.0,
              prefill_s_per_token=0.0)


def _simulate(capacity: int) -> tuple[BatchEngine, list]:
    async def scenario():
        engine = BatchEngine(capacity=capacity, max_total_tokens=POOL, timing=FLAT,
                             clock=SimClock(asyncio.get_running_loop(), 4.0))
        futures = engine.submit_many([(PROMPT_TOKENS, MAX_NEW_TOKENS, MAX_NEW_TOKENS)] * REQUESTS)
        return engine, await asyncio.gather(*futures)

    return asyncio.run(scenario())


def test_the_simulator_retracts_as_the_real_scheduler(real_run):
    """Tolerance (docs/sglang-scheduler.md §8): the same retractions of the same requests; the peak within one
    decode step's growth, a token per running request; the retracted output tokens within one per retraction
    (the overlap scheduler counts a request's output without the step in flight)."""
    engine, results = _simulate(real_run.max_running_requests)
    stats = engine.stats
    real_output = real_run.metrics["sglang:num_retracted_output_tokens_total"]
    figures = {"real": {"retracted": real_run.log_retracted, "which": real_run.retracted_requests,
                        "peak": real_run.log_peak, "retracted_output_tokens": real_output},
               "sim": {"retracted": stats.retracted_requests,
                       "which": [i for i, result in enumerate(results) if result.retractions],
                       "peak": stats.peak_used_tokens, "retracted_output_tokens": stats.retracted_output_tokens}}
    assert figures["sim"]["retracted"] == figures["real"]["retracted"], figures
    assert figures["sim"]["which"] == figures["real"]["which"], figures
    assert abs(stats.peak_used_tokens - real_run.log_peak) <= real_run.most_running, figures
    assert stats.retracted_input_tokens == real_run.metrics["sglang:num_retracted_input_tokens_total"]
    assert 0 <= stats.retracted_output_tokens - real_output <= stats.retracted_requests, figures
    assert [result.completion_tokens for result in results] == [MAX_NEW_TOKENS] * REQUESTS
