"""Continuous batching on the simulated clock: caps, FIFO order, timing."""

import asyncio

import pytest

from sglang_sim.engine import BatchEngine, SimClock
from sglang_sim.perf import Timing

# 100 tokens/s per request whatever the batch, no prefill cost
FLAT = Timing(step_base_s=0.01, expert_stream_s=0.0, step_per_request_s=0.0, accept_length=1.0,
              prefill_s_per_token=0.0)


def test_capacity_queue_and_timing():
    async def scenario():
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT,
                             clock=SimClock(asyncio.get_running_loop(), 200.0))
        futures = [engine.submit(10, 1000) for _ in range(4)]
        assert (engine.running, engine.waiting) == (2, 2)
        assert engine.throughput() == pytest.approx(200.0)
        results = await asyncio.gather(*futures)
        return engine, results

    engine, results = asyncio.run(scenario())
    # 1000 tokens at 100 tok/s: the first pair ends at 10 s, the queued pair waits 10 s and ends at 20 s
    # The simulated clock runs on the event loop's time: a loaded machine delays every step alike, so
    # check the shape (pairs finish together, the queued pair one batch later) rather than absolute times.
    ends = [r.e2e_seconds for r in results]
    assert ends[0] == pytest.approx(ends[1], abs=0.5) and ends[2] == pytest.approx(ends[3], abs=0.5)
    assert ends[0] >= 9.5 and ends[2] - ends[0] == pytest.approx(10, abs=1.0)
    queued = [r.queue_seconds for r in results]
    assert queued[:2] == pytest.approx([0, 0], abs=0.5) and queued[2:] == pytest.approx([ends[0]] * 2, abs=0.5)
    assert engine.stats.finished == 4 and engine.stats.generated_tokens == 4000
    assert (engine.running, engine.waiting) == (0, 0)


def test_prefill_stalls_decoding():
    timing = Timing(step_base_s=0.01, expert_stream_s=0.0, step_per_request_s=0.0, accept_length=1.0,
                    prefill_s_per_token=0.001)

    async def scenario():
        engine = BatchEngine(capacity=4, max_total_tokens=10**6, timing=timing,
                             clock=SimClock(asyncio.get_running_loop(), 200.0))
        return await engine.submit(5000, 500)

    result = asyncio.run(scenario())
    assert result.e2e_seconds == pytest.approx(5 + 5, abs=1.0)  # 5 s prefill, then 500 tokens at 100/s


def test_step_time_grows_with_batch_and_moe_touches_more_experts():
    dense = Timing(step_base_s=0.012, expert_stream_s=0.0, step_per_request_s=0.0003, accept_length=3.2,
                   prefill_s_per_token=0.0)
    assert dense.step_seconds(40) == pytest.approx(0.012 + 40 * 0.0003)
    assert dense.request_rate(40) == pytest.approx(3.2 / 0.024)
    moe = Timing(step_base_s=0.001, expert_stream_s=0.01, step_per_request_s=0.0, accept_length=1.0,
                 prefill_s_per_token=0.0, experts=512, experts_per_token=10)
    assert moe.step_seconds(1) < moe.step_seconds(16) < moe.step_seconds(256) < 0.011


def test_hang_freezes_running_requests():
    async def scenario():
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT,
                             clock=SimClock(asyncio.get_running_loop(), 1000.0))
        future = engine.submit(10, 100)
        engine.freeze()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), 0.05)

    asyncio.run(scenario())
