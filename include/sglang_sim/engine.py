"""Continuous batching on a simulated clock, with SGLang 0.5.23's admission and retraction.

Every running request advances at the same rate (tokens/s for the current batch size, from
``perf.Timing``), so the engine keeps one shared progress counter and wakes only for events: a
request finishes, the KV pool runs out, a new request arrives, or the admission check is due again
(every ``ADMISSION_CHECK_STEPS`` decode steps while requests wait). Admitting a request stalls
decoding for its prefill (extend tokens x prefill time per token), as a prefill step interrupts
decode batches. The scheduling rules are SGLang's (docs/sglang-scheduler.md §2-§4):

- a (re-)prefill samples the request's next token, each decode step one more; a running request with
  ``generated`` output tokens holds ``ceil_page(prompt + generated - 1 + decode reserve)`` KV tokens (the
  newest token's KV is written by the next step: ``ScheduleBatch.new_tokens_required_next_decode``);
- admission (``PrefillAdder.add_one_req``): ``extend + min(max_new - generated, 4096) + page`` must be
  below ``free - sum(running remaining budget x new_token_ratio) - this pass's admissions``; a pass that
  stops there with requests running marks the batch full, and no pass runs until a request leaves it
  (``batch_is_full`` in ``Scheduler.get_new_batch_prefill``);
- ``new_token_ratio`` starts at 0.7 x conservativeness, decays by ``(init - 0.14 x init) / 600`` per
  decode step, is re-estimated after a retraction and reset when idle (``NewTokenRatioTracker``);
- when the next decode step does not fit, ``retract_decode`` removes the requests with the fewest
  generated tokens (ties: the longest prompt, then the last to join the batch) until it fits; the step
  that retracts does not decay the re-estimated ratio; a retracted request keeps its output
  tokens, loses its KV, goes to the back of the queue and re-prefills prompt + output when admitted.

Simulated time runs ``time_scale`` times faster than the wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from sglang_sim.perf import Timing
from sglang_sim.simlog import log

# requests finishing within this much wall time of each other complete in one wake-up
COALESCE_WALL_S = 0.001
# SGLang re-runs admission every scheduler iteration; the simulation does it every few decode steps
# (the ratio moves by 0.001 per step, so the admitted count differs by at most one request). Only a pass
# cut short by --max-prefill-tokens waits for it: one refused for KV marks the batch full.
ADMISSION_CHECK_STEPS = 8
# A step reads the KV the running requests hold (perf.Timing), which grows by a token a request a step: the
# rate is re-read from it at every event and at least every this many decode steps (the context grows by well
# under 1 % between reads at SGLang's usual context lengths).
CONTEXT_REFRESH_STEPS = 32

# --decode-log-interval: a "Decode batch" line every this many decode steps (logged at the first event after)
DECODE_LOG_INTERVAL = 40
# environ.py defaults (SGLang 0.5.23)
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
MAX_PREFILL_TOKENS = 16384


class SimClock:
    """Simulated time: the loop's clock times ``time_scale``. ``pause`` stops it (requests still arrive and are
    admitted, nothing decodes or finishes) until ``resume``, so a test can read a state the load would pass by."""

    def __init__(self, loop: asyncio.AbstractEventLoop, time_scale: float) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.loop = loop
        self.scale = time_scale
        self.origin = loop.time()
        self._paused_at: float | None = None
        self._on_resume: list[Callable[[], None]] = []

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def now(self) -> float:
        if self._paused_at is not None:
            return self._paused_at
        return (self.loop.time() - self.origin) * self.scale

    def wall_at(self, sim_time: float) -> float:
        return self.origin + sim_time / self.scale

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = self.now()

    def resume(self) -> None:
        """Simulated time goes on from where it stopped; every engine on this clock wakes up."""
        if self._paused_at is None:
            return
        self.origin = self.loop.time() - self._paused_at / self.scale
        self._paused_at = None
        for wake in list(self._on_resume):
            wake()

    def on_resume(self, wake: Callable[[], None]) -> None:
        self._on_resume.append(wake)


@dataclass(frozen=True)
class JobResult:
    completion_tokens: int
    queue_seconds: float   # simulated
    e2e_seconds: float     # simulated, arrival to last token
    decode_steps: int
    retractions: int = 0


class NewTokenRatio:
    """``NewTokenRatioTracker``, decayed lazily from a decode-step counter."""

    def __init__(self, conservativeness: float = 1.0) -> None:
        self.init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._base = self.init
        self._base_step = 0.0

    def value(self, decode_steps: float) -> float:
        return max(self._base - self.decay * int(decode_steps - self._base_step), self.min)

    def set(self, value: float, decode_steps: float) -> None:
        self._base, self._base_step = value, decode_steps

    def reset(self, decode_steps: float) -> None:
        self.set(self.init, decode_steps)


@dataclass
class _Job:
    prompt_tokens: int
    output_tokens: int       # what this request will generate (its natural length, within max_new)
    max_new_tokens: int
    future: asyncio.Future
    arrival: float
    admitted: float = 0.0
    generated: int = 0       # output tokens at the current admission, its prefill's own token included
                             # (kept across retractions, as Req.output_ids is)
    start: float = 0.0       # shared progress at the current admission
    finish_at: float = 0.0   # shared progress at which it is done
    retractions: int = 0
    seq: int = 0
    joined: int = 0          # when it last joined the running batch: its place in ScheduleBatch.reqs
    metered: bool = True     # counted in the stats (a health check's generation is not: log_metrics=False)

    def generated_at(self, progress: float) -> int:
        return min(self.output_tokens, self.generated + int(progress - self.start))


@dataclass
class EngineStats:
    finished: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    last_retracted: int = 0
    peak_used_tokens: int = 0
    decode_steps: float = 0.0
    # Scheduler.decode_moment_totals: steps, sum of batch sizes, of step microseconds, of squared batch sizes,
    # of batch x step microseconds, generated tokens (simulated time)
    decode_moments: list = field(default_factory=lambda: [0.0] * 6)
    prefill_busy_us: float = 0.0  # Scheduler.total_prefill_busy_us, simulated


class BatchEngine:
    def __init__(self, *, capacity: int, max_total_tokens: int, timing: Timing, clock: SimClock,
                 page_size: int = 1, decode_reserve_tokens: int = 1, conservativeness: float = 1.0,
                 max_prefill_tokens: int = MAX_PREFILL_TOKENS) -> None:
        if capacity < 1 or max_total_tokens < 1 or page_size < 1 or decode_reserve_tokens < 1:
            raise ValueError("capacity, max_total_tokens, page_size and decode_reserve_tokens must be >= 1")
        self.capacity = capacity
        self.max_total_tokens = max_total_tokens
        self.page_size = page_size
        self.decode_reserve_tokens = decode_reserve_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.timing = timing
        self.clock = clock
        self.stats = EngineStats()
        self.ratio = NewTokenRatio(conservativeness)
        self._waiting: deque[_Job] = deque()
        self._running: list[tuple[float, int, _Job]] = []
        self._progress = 0.0
        self._last = 0.0
        self._stall_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._seq = itertools.count()
        self._frozen = False
        # ScheduleBatch.batch_is_full: a pass refused a request for KV while requests ran; cleared when one
        # leaves the batch (finish or retraction)
        self._batch_full = False
        self._context = 0  # KV tokens the running requests held at the last event: what a step reads
        self._logged_interval = 0
        # called with the engine every DECODE_LOG_INTERVAL decode steps (the server formats the line)
        self.decode_logger: Callable[["BatchEngine"], None] | None = None
        # called with (engine, new requests, their extend tokens, requests running before) for each prefill batch
        self.prefill_logger: Callable[["BatchEngine", int, int, int], None] | None = None
        self.dp_rank: int | None = None  # the DP rank this engine is, for its log lines' prefix
        self.mamba_slots_per_request: int | None = None  # hybrid models: Mamba slots a running request holds
        clock.on_resume(self._update)

    # ---- public ----
    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def used_tokens(self) -> int:
        """KV tokens the running requests hold now (page-rounded, with the next step's reserve)."""
        return self._held(self._progress)

    @property
    def new_token_ratio(self) -> float:
        return self.ratio.value(self.stats.decode_steps)

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the waiting requests (SGLang's num_total_tokens adds them to the used ones)."""
        return sum(job.prompt_tokens for job in self._waiting)

    def prefilling(self) -> bool:
        """True while a prefill holds the GPU (decoding waits for it)."""
        return self.clock.now() < self._stall_until

    def rate(self, batch: int) -> float:
        """Tokens per second each request of the running batch receives (``batch`` of them, holding the KV
        they held at the last event)."""
        return self.timing.request_rate(min(batch, self.capacity), self._context)

    def step_seconds(self, batch: int) -> float:
        return self.timing.step_seconds(batch, self._context)

    def throughput(self) -> float:
        """Output tokens per simulated second right now."""
        if not self._running or self.clock.now() < self._stall_until:
            return 0.0
        return self.rate(len(self._running)) * len(self._running)

    def full_batch_context(self) -> float:
        """KV tokens ``capacity`` running requests would hold, each as many as the running ones do on average
        now (none when idle)."""
        return self._context / len(self._running) * self.capacity if self._running else 0.0

    def full_batch_throughput(self) -> float:
        """Output tokens per simulated second at ``capacity`` running requests (``full_batch_context``)."""
        return self.timing.request_rate(self.capacity, self.full_batch_context()) * self.capacity

    def submit(self, prompt_tokens: int, output_tokens: int, max_new_tokens: int | None = None, *,
               metered: bool = True) -> asyncio.Future:
        """Queue a request that will generate ``output_tokens`` of at most ``max_new_tokens`` (the
        sampling budget SGLang reserves for; defaults to ``output_tokens``); an unmetered one (a health
        check) is left out of the stats."""
        future = self._queue(prompt_tokens, output_tokens, max_new_tokens, metered=metered)
        if not self._frozen:
            self._update()
        return future

    def submit_many(self, requests: list[tuple[int, int, int | None]]) -> list[asyncio.Future]:
        """Queue ``(prompt_tokens, output_tokens, max_new_tokens)`` requests that reach the scheduler
        together, as a batch ``/generate`` does (one ``BatchTokenizedGenerateReqInput``): one admission
        pass sees them all, each one admitted reserving its whole budget against the next."""
        futures = [self._queue(*request) for request in requests]
        if not self._frozen:
            self._update()
        return futures

    def _queue(self, prompt_tokens: int, output_tokens: int, max_new_tokens: int | None, *,
               metered: bool = True) -> asyncio.Future:
        future = self.clock.loop.create_future()
        output = max(1, output_tokens)
        job = _Job(max(1, prompt_tokens), output, max(output, max_new_tokens or output), future,
                   self.clock.now(), seq=next(self._seq), metered=metered)
        self._waiting.append(job)
        return future

    def freeze(self) -> None:
        """Stop scheduling for good (the hang fault): running requests never finish."""
        self._frozen = True
        if self._timer:
            self._timer.cancel()

    # ---- KV accounting ----
    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def _held_by(self, job: _Job, progress: float) -> int:
        return self._pages(job.prompt_tokens + job.generated_at(progress) - 1 + self.decode_reserve_tokens)

    def _held(self, progress: float) -> int:
        return sum(self._held_by(job, progress) for _, _, job in self._running)

    # ---- internals ----
    def _advance(self, now: float) -> None:
        start = max(self._last, self._stall_until)
        if self._running and now > start:
            batch = len(self._running)
            step_us = self.step_seconds(batch) * 1e6
            steps = (now - start) / self.step_seconds(batch)
            self._progress += (now - start) * self.rate(batch)
            self.stats.decode_steps += steps
            for index, value in enumerate((1, batch, step_us, batch * batch, batch * step_us,
                                           (now - start) * self.rate(batch) * batch)):
                self.stats.decode_moments[index] += steps * value if index < 5 else value
        self._last = max(self._last, now)

    def _update(self) -> None:
        if self._frozen:
            return
        now = self.clock.now()
        base = self._progress
        self._advance(now)
        self._process_events(base, now)
        interval = int(self.stats.decode_steps // DECODE_LOG_INTERVAL)
        if interval > self._logged_interval and self._running and self.decode_logger is not None:
            self._logged_interval = interval
            self.decode_logger(self)
        if not self._running and not self._waiting:
            self.ratio.reset(self.stats.decode_steps)
        self._admit(now)
        self._context = self._held(self._progress) if self._running else 0
        self._schedule(now)

    def _process_events(self, base: float, now: float) -> None:
        """Finishes and pool exhaustions since ``base``, in progress order (a late wake-up must not
        skip a retraction that happened before a finish)."""
        target = self._progress
        slack = self.rate(max(1, len(self._running))) * COALESCE_WALL_S * self.clock.scale
        # a paused clock finishes nothing, not even what the coalescing slack would take early
        while self._running and not self._frozen and not self.clock.paused:
            finish = self._running[0][0]
            exhausted = self._exhaustion_at(base)
            if exhausted is not None and exhausted <= target and exhausted < finish:
                self._note_peak(exhausted - 1)
                self._retract(exhausted)
                base = exhausted
                continue
            if finish > target + slack:
                break
            self._note_peak(min(finish, target))
            _, _, job = heapq.heappop(self._running)
            self._finish(job, now)
        if self._running:
            self._note_peak(target)

    def _note_peak(self, progress: float) -> None:
        self.stats.peak_used_tokens = max(self.stats.peak_used_tokens,
                                          min(self._held(progress), self.max_total_tokens))

    def _admit(self, now: float) -> None:
        """``Scheduler.get_new_batch_prefill``: a ``PrefillAdder`` pass over the FCFS queue unless the batch
        is full. A pass into an empty batch is followed by another before any decode step: the admitted
        prefill batch becomes the running batch, which starts without the flag, and SGLang's next iteration
        tries the queue again with them counted at the ratio."""
        if not self._running:
            self._batch_full = False  # an empty batch has no request left to leave
        if self._batch_full or not self._waiting or len(self._running) >= self.capacity:
            return
        was_empty = not self._running
        if self._admit_pass(now) and was_empty and self._running:
            self._admit_pass(now)

    def _admit_pass(self, now: float) -> bool:
        """One prefill pass; True when it stopped at a request the KV could not take (``NO_TOKEN``)."""
        running_before = bool(self._running)
        ratio = self.new_token_ratio
        free = self.max_total_tokens - self.used_tokens
        offset = sum(min(job.max_new_tokens - job.generated_at(self._progress), CLIP_MAX_NEW_TOKENS) * ratio
                     for _, _, job in self._running)
        input_budget = self.max_prefill_tokens
        admitted = new_tokens = 0
        while self._waiting and len(self._running) < self.capacity:
            job = self._waiting[0]
            extend = job.prompt_tokens + job.generated
            max_new = min(max(job.max_new_tokens - job.generated, 0), CLIP_MAX_NEW_TOKENS)
            if not extend + max_new + self.page_size < free - offset:
                # NO_TOKEN: the flag lands on the running batch; into an empty one it is lost with it
                self._batch_full = running_before
                self._log_prefill(admitted, new_tokens)
                return True
            if admitted and self._pages(extend) >= input_budget:
                break  # the pass's --max-prefill-tokens are spent; the next pass takes it
            self._waiting.popleft()
            offset += self._pages(extend) + self.page_size + max_new
            input_budget -= self._pages(extend)
            admitted += 1
            self._stall_until = max(self._stall_until, now) + extend * self.timing.prefill_s_per_token
            job.admitted = now if not job.retractions else job.admitted
            job.generated += 1  # the prefill's logits sample a token
            job.start = self._progress
            job.finish_at = self._progress + (job.output_tokens - job.generated)
            job.joined = next(self._seq)
            heapq.heappush(self._running, (job.finish_at, job.seq, job))
            new_tokens += extend
        self._log_prefill(admitted, new_tokens)
        return False

    def _log_prefill(self, admitted: int, new_tokens: int) -> None:
        """A prefill batch ran: its busy time, and its log line."""
        if not admitted:
            return
        self.stats.prefill_busy_us += new_tokens * self.timing.prefill_s_per_token * 1e6
        if self.prefill_logger is not None:
            self.prefill_logger(self, admitted, new_tokens, len(self._running) - admitted)

    def _retract(self, progress: float) -> None:
        """``retract_decode`` at shared progress ``progress``: fewest generated tokens first (ties: the
        longest prompt), until the next step fits; keeps at least one request."""
        # the decode steps at ``progress`` (a late wake-up has counted steps past it): a token per step a request
        steps = self.stats.decode_steps - (self._progress - progress) / self.timing.accept_length
        old_ratio = self.ratio.value(steps)
        before = self._held(progress)
        # a stable sort of the batch in its order: among equal keys the last to join goes first
        batch = sorted((job for _, _, job in self._running), key=lambda j: j.joined)
        order = sorted(batch, key=lambda j: (j.generated_at(progress), -j.prompt_tokens), reverse=True)
        retracted: list[_Job] = []
        held = before
        while held > self.max_total_tokens and len(order) > 1:
            job = order.pop()
            held -= self._held_by(job, progress)
            job.generated = job.generated_at(progress)
            job.retractions += 1
            retracted.append(job)
        aborted = None
        if held > self.max_total_tokens:
            aborted = order.pop()
            held -= self._held_by(aborted, progress)
        self._running = [(job.finish_at, job.seq, job) for job in order]
        heapq.heapify(self._running)
        self._batch_full = False
        stats = self.stats
        stats.last_retracted = len(retracted)
        stats.retracted_requests += len(retracted)
        stats.retracted_input_tokens += sum(job.prompt_tokens for job in retracted)
        stats.retracted_output_tokens += sum(job.generated for job in retracted)
        running = [job for _, _, job in self._running]
        new_ratio = min(1.0, (sum(j.generated_at(progress) for j in running) + RETRACT_DECODE_STEPS * len(running))
                        / (sum(j.max_new_tokens for j in running) + 1))
        # the step that retracts does not decay it: Scheduler.update_running_batch decays only without a
        # retraction (sglang/srt/managers/scheduler.py)
        self.ratio.set(new_ratio, steps + 1)
        # Scheduler.update_running_batch's line (sglang/srt/managers/scheduler.py); a hybrid pool adds the
        # Mamba slots the retraction freed
        mamba = "" if self.mamba_slots_per_request is None else \
            f", #mamba_num_gained: {(len(retracted) + (aborted is not None)) * self.mamba_slots_per_request}"
        log(f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
            f"#new_tokens_gained: {before - held}{mamba}, #new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
            rank=0, dp_rank=self.dp_rank)
        self._waiting.extend(retracted)
        if aborted is not None:
            log(f"retract_decode: aborted last request {aborted.seq} due to OOM", rank=0, dp_rank=self.dp_rank)
            if not aborted.future.done():
                aborted.future.set_exception(RuntimeError(
                    "Out of memory even after retracting all other requests in the decode batch. "
                    "Aborting the last request."))

    def _finish(self, job: _Job, now: float) -> None:
        self._batch_full = False
        if job.metered:
            self.stats.finished += 1
            self.stats.generated_tokens += job.output_tokens
            self.stats.prompt_tokens += job.prompt_tokens
        if not job.future.done():
            steps = max(1, round(job.output_tokens / self.timing.accept_length))
            job.future.set_result(JobResult(job.output_tokens, job.admitted - job.arrival,
                                            max(now, self._stall_until) - job.arrival, steps, job.retractions))

    def _exhaustion_at(self, base: float) -> float | None:
        """The first progress point from ``base`` (whole tokens on) at which the running requests' KV
        outgrows the pool; None if it never does before they finish. Held KV only grows with
        progress, so a binary search finds it."""
        horizon = max(job.finish_at for _, _, job in self._running) - base
        if self._held(base + horizon) <= self.max_total_tokens:
            return None
        low, high = 0, max(1, math.ceil(horizon))
        while low < high:
            middle = (low + high) // 2
            if self._held(base + middle) > self.max_total_tokens:
                high = middle
            else:
                low = middle + 1
        return base + low

    def _schedule(self, now: float) -> None:
        if self._timer:
            self._timer.cancel()
            self._timer = None
        if not self._running or self._frozen or self.clock.paused:
            return  # a paused clock wakes the engine when it resumes
        batch = len(self._running)
        remaining = self._running[0][0] - self._progress
        exhaustion = self._exhaustion_at(self._progress)
        if exhaustion is not None:
            remaining = min(remaining, exhaustion - self._progress)
        begin = max(now, self._stall_until)
        when = begin + max(0.0, remaining) / self.rate(batch)
        when = min(when, begin + CONTEXT_REFRESH_STEPS * self.step_seconds(batch))
        if self._waiting and batch < self.capacity and not self._batch_full:
            when = min(when, begin + ADMISSION_CHECK_STEPS * self.step_seconds(batch))
        if self.decode_logger is not None:
            # wake for the next "Decode batch" line, which SGLang prints while a request runs alone too
            steps = (self._logged_interval + 1) * DECODE_LOG_INTERVAL - self.stats.decode_steps
            when = min(when, begin + max(0.0, steps) * self.step_seconds(batch))
        self._timer = self.clock.loop.call_at(self.clock.wall_at(when), self._update)
