"""Continuous batching on a simulated clock, without per-token work.

At most ``capacity`` requests decode at once; the rest wait in FIFO order. Every running request
advances at the same rate (tokens/s for the current batch size, from ``perf.Timing``), so the engine
keeps one shared progress counter and a heap of per-request finish points, and wakes only when the
next request finishes or a new one arrives. Admitting a request stalls decoding for its prefill
(prompt tokens x prefill time per token), as a prefill step interrupts decode batches.

Simulated time runs ``time_scale`` times faster than the wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from dataclasses import dataclass

from sglang_sim.perf import Timing

# requests finishing within this much wall time of each other complete in one wake-up
COALESCE_WALL_S = 0.001


class SimClock:
    def __init__(self, loop: asyncio.AbstractEventLoop, time_scale: float) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.loop = loop
        self.scale = time_scale
        self.origin = loop.time()

    def now(self) -> float:
        return (self.loop.time() - self.origin) * self.scale

    def wall_at(self, sim_time: float) -> float:
        return self.origin + sim_time / self.scale


@dataclass(frozen=True)
class JobResult:
    completion_tokens: int
    queue_seconds: float   # simulated
    e2e_seconds: float     # simulated, arrival to last token
    decode_steps: int


@dataclass
class _Job:
    prompt_tokens: int
    output_tokens: int
    future: asyncio.Future
    arrival: float
    admitted: float = 0.0
    finish_at: float = 0.0  # value of the shared progress counter at which it is done
    seq: int = 0


@dataclass
class EngineStats:
    finished: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0


class BatchEngine:
    def __init__(self, *, capacity: int, max_total_tokens: int, timing: Timing, clock: SimClock) -> None:
        if capacity < 1 or max_total_tokens < 1:
            raise ValueError("capacity and max_total_tokens must be >= 1")
        self.capacity = capacity
        self.max_total_tokens = max_total_tokens
        self.timing = timing
        self.clock = clock
        self.stats = EngineStats()
        self._waiting: deque[_Job] = deque()
        self._running: list[tuple[float, int, _Job]] = []
        self._reserved_tokens = 0
        self._progress = 0.0
        self._last = 0.0
        self._stall_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._seq = itertools.count()
        self._frozen = False
        self._rates = [timing.request_rate(b) for b in range(capacity + 1)]

    # ---- public ----
    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def reserved_tokens(self) -> int:
        """KV tokens held by running requests (prompt + output, reserved on admission)."""
        return self._reserved_tokens

    def rate(self, batch: int) -> float:
        return self._rates[min(batch, self.capacity)]

    def throughput(self) -> float:
        """Output tokens per simulated second right now."""
        if not self._running or self.clock.now() < self._stall_until:
            return 0.0
        return self.rate(len(self._running)) * len(self._running)

    def full_batch_throughput(self) -> float:
        return self.rate(self.capacity) * self.capacity

    def submit(self, prompt_tokens: int, output_tokens: int) -> asyncio.Future:
        future = self.clock.loop.create_future()
        job = _Job(max(1, prompt_tokens), max(1, output_tokens), future, self.clock.now(), seq=next(self._seq))
        self._waiting.append(job)
        if not self._frozen:
            self._update()
        return future

    def freeze(self) -> None:
        """Stop scheduling for good (the hang fault): running requests never finish."""
        self._frozen = True
        if self._timer:
            self._timer.cancel()

    # ---- internals ----
    def _advance(self, now: float) -> None:
        start = max(self._last, self._stall_until)
        if self._running and now > start:
            self._progress += (now - start) * self.rate(len(self._running))
        self._last = max(self._last, now)

    def _update(self) -> None:
        if self._frozen:
            return
        now = self.clock.now()
        self._advance(now)
        if self._running:
            slack = self.rate(len(self._running)) * COALESCE_WALL_S * self.clock.scale
            while self._running and self._running[0][0] <= self._progress + slack and not self._frozen:
                _, _, job = heapq.heappop(self._running)
                self._finish(job, now)
        while self._waiting and len(self._running) < self.capacity:
            job = self._waiting[0]
            need = job.prompt_tokens + job.output_tokens
            if self._running and self._reserved_tokens + need > self.max_total_tokens:
                break
            self._waiting.popleft()
            self._reserved_tokens += need
            self._stall_until = max(self._stall_until, now) + job.prompt_tokens * self.timing.prefill_s_per_token
            job.admitted = now
            job.finish_at = self._progress + job.output_tokens
            heapq.heappush(self._running, (job.finish_at, job.seq, job))
        self._schedule(now)

    def _finish(self, job: _Job, now: float) -> None:
        self._reserved_tokens -= job.prompt_tokens + job.output_tokens
        self.stats.finished += 1
        self.stats.generated_tokens += job.output_tokens
        self.stats.prompt_tokens += job.prompt_tokens
        if not job.future.done():
            steps = max(1, round(job.output_tokens / self.timing.accept_length))
            job.future.set_result(JobResult(job.output_tokens, job.admitted - job.arrival,
                                            max(now, self._stall_until) - job.arrival, steps))

    def _schedule(self, now: float) -> None:
        if self._timer:
            self._timer.cancel()
            self._timer = None
        if not self._running or self._frozen:
            return
        remaining = self._running[0][0] - self._progress
        when = max(now, self._stall_until) + max(0.0, remaining) / self.rate(len(self._running))
        self._timer = self.clock.loop.call_at(self.clock.wall_at(when), self._update)
