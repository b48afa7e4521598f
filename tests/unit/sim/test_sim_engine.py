"""Continuous batching on the simulated clock: caps, FIFO order, timing."""

import asyncio

import pytest

from sglang_sim.engine import BatchEngine, NewTokenRatio, SimClock
from sglang_sim.perf import Timing

# 100 tokens/s per request whatever the batch, no prefill cost
FLAT = Timing(step_base_s=0.01, expert_stream_s=0.0, step_per_request_s=0.0, accept_length=1.0,
              prefill_s_per_token=0.0)


def test_capacity_queue_and_timing():
    async def scenario():
        clock = SimClock(asyncio.get_running_loop(), 20.0)  # slow enough that a busy loop barely shifts it
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT, clock=clock)
        clock.pause()  # the four arrive at one simulated moment, and the queue is read there
        futures = [engine.submit(10, 1000) for _ in range(4)]
        assert (engine.running, engine.waiting) == (2, 2)
        clock.resume()
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
                             clock=SimClock(asyncio.get_running_loop(), 20.0))
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


def test_a_paused_clock_holds_every_request_where_it_is_until_resumed():
    """At 10^6 x a request of 100 tokens lasts a microsecond of wall time: it can wait out the pause only if the
    pause stops it (the wait passes on the event loop, so no wall time is asserted)."""
    async def scenario():
        loop = asyncio.get_running_loop()
        clock = SimClock(loop, 1e6)
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT, clock=clock)
        clock.pause()
        futures = [engine.submit(10, 100) for _ in range(3)]
        held_at = clock.now()
        await asyncio.sleep(0.05)  # thousands of simulated seconds, were the clock running
        held = (engine.running, engine.waiting, engine.used_tokens, clock.now() - held_at,
                [future.done() for future in futures])
        clock.resume()  # wakes the engine: no timer was armed while paused
        results = await asyncio.wait_for(asyncio.gather(*futures), 60)
        return held, results

    held, results = asyncio.run(scenario())
    assert held == (2, 1, 2 * (10 + 1), 0.0, [False] * 3)  # admitted, prefilled, not one decode step
    assert [r.completion_tokens for r in results] == [100] * 3


def test_hang_freezes_running_requests():
    async def scenario():
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT,
                             clock=SimClock(asyncio.get_running_loop(), 1000.0))
        future = engine.submit(10, 100)
        engine.freeze()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), 0.05)

    asyncio.run(scenario())


# -- admission and retraction (docs/sglang-scheduler.md §3, §4) -----------------------------------------

def _run(pool: int, jobs: list[tuple[int, int, int]], *, capacity: int = 8, page: int = 1, reserve: int = 1):
    # the clock is paused while the jobs arrive: however long a busy machine stalls between two submits, none
    # decodes or finishes before the last is admitted, and the first pass is read before any progress
    async def scenario():
        clock = SimClock(asyncio.get_running_loop(), 200.0)
        engine = BatchEngine(capacity=capacity, max_total_tokens=pool, timing=FLAT, page_size=page,
                             decode_reserve_tokens=reserve, clock=clock)
        clock.pause()
        futures = [engine.submit(*job) for job in jobs]
        first_pass = engine.running
        clock.resume()
        return engine, first_pass, await asyncio.gather(*futures)

    return asyncio.run(scenario())


def test_new_token_ratio_constants_follow_sglang():
    ratio = NewTokenRatio()
    assert (ratio.init, ratio.min) == pytest.approx((0.7, 0.098))
    assert ratio.value(300) == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    assert ratio.value(10_000) == pytest.approx(0.098)
    ratio.set(0.4, 1000)
    assert ratio.value(1000) == 0.4 and ratio.value(1100) == pytest.approx(0.4 - 100 * ratio.decay)
    assert NewTokenRatio(2.0).init == 1.0  # conservativeness scales it, capped at 1


def test_admission_reserves_running_budgets_at_the_ratio_and_the_new_one_in_full():
    # each arrival is a pass needing 100 + 1500 + 1 page = 1601 below free - running x 1500 x 0.7:
    # 3rd: 4000 - 202 - 2100 = 1698 > 1601 admitted; 4th: 4000 - 303 - 3150 = 547 waits
    engine, first_pass, _ = _run(4000, [(100, 1500, 1500)] * 4)
    assert first_pass == 3
    # the three alone outgrow the pool (3 x 1601 > 4000): SGLang retracts
    assert engine.stats.retracted_requests >= 1


def test_pool_too_small_retracts_and_requeued_requests_keep_their_output(capsys):
    engine, _, results = _run(4000, [(100, 1500, 1500)] * 4)
    stats = engine.stats
    assert stats.retracted_requests >= 1 and stats.retracted_output_tokens > 0
    assert stats.retracted_input_tokens == 100 * stats.retracted_requests
    assert sum(r.retractions for r in results) == stats.retracted_requests
    # every request still finishes with its full output, counted once
    assert [r.completion_tokens for r in results] == [1500] * 4
    assert stats.generated_tokens == 6000 and stats.finished == 4
    assert stats.peak_used_tokens <= 4000
    assert "KV cache pool is full. Retract requests. #retracted_reqs: 1" in capsys.readouterr().err
    assert engine.used_tokens == 0 and engine.new_token_ratio == pytest.approx(0.7)  # idle: ratio reset


def test_generous_pool_never_retracts():
    engine, first_pass, results = _run(10**6, [(100, 1500, 1500)] * 4)
    assert first_pass == 4
    assert engine.stats.retracted_requests == 0 and all(r.retractions == 0 for r in results)
    # four requests near their longest (they arrived a few tokens apart): up to 4 x (100 + 1500 + 1 reserve)
    assert 3 * 1601 < engine.stats.peak_used_tokens <= 4 * 1601


def test_held_kv_is_page_rounded_with_the_decode_reserve():
    async def scenario():
        engine = BatchEngine(capacity=4, max_total_tokens=10**6, timing=FLAT, page_size=64, decode_reserve_tokens=8,
                             clock=SimClock(asyncio.get_running_loop(), 1.0))
        engine.submit(100, 1000)
        engine.submit(130, 1000)
        return engine.used_tokens

    # ceil64(100 + 8) + ceil64(130 + 8) = 128 + 192
    assert asyncio.run(scenario()) == 320


class ManualClock(SimClock):
    """Simulated time set by the test; the engine's own timers never fire, the test wakes it."""

    def __init__(self, loop) -> None:
        super().__init__(loop, 1.0)
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def wall_at(self, sim_time: float) -> float:
        return self.origin + 1e9


def _at(engine: BatchEngine, clock: ManualClock, sim_time: float) -> None:
    clock.time = sim_time
    engine._update()  # what the timer would have done at that moment


def test_retraction_takes_the_request_with_the_fewest_generated_tokens(capsys):
    async def scenario():
        clock = ManualClock(asyncio.get_running_loop())
        # two requests of 100 + 1500 outgrow 2900 tokens: the second starts 50 tokens behind
        engine = BatchEngine(capacity=4, max_total_tokens=2900, timing=FLAT, clock=clock)
        early = engine.submit(100, 1500, 1500)
        _at(engine, clock, 0.5)
        late = engine.submit(100, 1500, 1500)   # 2900 - 151 - 0.7 x 1450 = 1734 > 1601: admitted
        assert engine.running == 2
        # at shared progress p: held (101 + p) + (101 + p - 50) > 2900 from p = 1375 (t = 13.75 s)
        _at(engine, clock, 13.7)
        assert engine.stats.retracted_requests == 0
        _at(engine, clock, 14.0)
        assert engine.stats.retracted_requests == 1 and (engine.running, engine.waiting) == (1, 1)
        # the late one, 50 tokens behind: 1325 decode steps and its prefill's token
        assert engine.stats.retracted_output_tokens == 1326
        _at(engine, clock, 16.0)   # the early one finishes at 15 s; the late one resumes with its 1326 tokens
        assert (engine.running, engine.waiting) == (1, 0)
        _at(engine, clock, 20.0)   # 174 tokens left, one of them from its re-prefill
        return await asyncio.gather(early, late)

    early, late = asyncio.run(scenario())
    assert (early.retractions, late.retractions) == (0, 1)
    assert late.completion_tokens == 1500
    assert "#retracted_reqs: 1, #new_tokens_gained: 1426, #new_token_ratio: 0.0980 -> " in capsys.readouterr().err


def test_decode_batch_line_every_forty_decode_steps():
    async def scenario():
        clock = ManualClock(asyncio.get_running_loop())
        engine = BatchEngine(capacity=2, max_total_tokens=10**6, timing=FLAT, clock=clock)
        seen = []
        engine.decode_logger = lambda e: seen.append((round(e.stats.decode_steps), e.running, e.used_tokens))
        engine.submit(10, 400)
        engine.submit(10, 400)
        for step in (0.3, 0.5, 1.0, 2.5):
            _at(engine, clock, step)
        return seen

    # 100 steps/s: at 30 steps nothing, at 50 the first interval, 100 the second, 250 the sixth
    assert asyncio.run(scenario()) == [(50, 2, 2 * (10 + 50 + 1)), (100, 2, 2 * (10 + 100 + 1)),
                                       (250, 2, 2 * (10 + 250 + 1))]


def test_a_batch_arriving_together_is_one_pass_each_reserving_in_full():
    # 16 x (1 + 100 output): one at a time each sees the others at 0.7 x 99 and 13 fit; in one pass each
    # admitted one reserves 1 + 1 + 100 and 9 fit (10th: 1000 - 918 = 82 < 102), then the next pass, with
    # those 9 at the ratio, takes 3 more: 1000 - 18 - 9 x 99 x 0.7 = 358 -> 256 -> 154 -> 52 < 102
    async def scenario(together: bool):
        engine = BatchEngine(capacity=64, max_total_tokens=1000, timing=FLAT,
                             clock=ManualClock(asyncio.get_running_loop()))
        if together:
            engine.submit_many([(1, 100, 100)] * 16)
        else:
            for _ in range(16):
                engine.submit(1, 100, 100)
        return engine.running

    assert asyncio.run(scenario(False)) == 13
    assert asyncio.run(scenario(True)) == 12


def test_a_full_batch_admits_nothing_until_a_request_leaves():
    async def scenario():
        clock = ManualClock(asyncio.get_running_loop())
        engine = BatchEngine(capacity=8, max_total_tokens=4000, timing=FLAT, clock=clock)
        for _ in range(4):
            engine.submit(100, 1500, 1500)
        running = [engine.running]
        # at 500 steps the decayed ratio would take the 4th (4000 - 3 x 600 - 3 x 1000 x 0.198 = 1606 > 1601),
        # but its refusal marked the batch full (Scheduler.get_new_batch_prefill's batch_is_full)
        _at(engine, clock, 5.0)
        running.append(engine.running)
        return running

    assert asyncio.run(scenario()) == [3, 3]


def test_retraction_ties_go_to_the_last_request_to_join_the_batch():
    # both arrive together: the first pass takes the first (2800 - 1601 = 1199 leaves no room for the second),
    # the pass after it the second (2800 - 101 - 1499 x 0.7 = 1650 > 1601). Both run at the same pace and
    # outgrow the pool at 1300 tokens, before either ends: equal keys, and SGLang's stable sort of the batch
    # in order retracts the one that joined last (ScheduleBatch._get_decode_retraction_order), though the
    # second one's shorter output ends first
    async def scenario():
        engine = BatchEngine(capacity=4, max_total_tokens=2800, timing=FLAT,
                             clock=SimClock(asyncio.get_running_loop(), 500.0))
        futures = engine.submit_many([(100, 1500, 1500), (100, 1400, 1500)])
        return await asyncio.gather(*futures)

    first, second = asyncio.run(scenario())
    assert (first.retractions, second.retractions) == (0, 1)
