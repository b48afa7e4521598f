"""Counters of a running shard and the progress line it logs every few seconds."""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """Done/total, tokens/s and an ETA from the tokens still to generate.

    Tokens still to generate = prompts left x mean completion tokens seen so far in this run;
    the ETA divides that by the run's output rate since it started.
    """

    def __init__(self, total: int, already_done: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.skipped = already_done
        self.done = 0
        self.failed = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._clock = clock
        self.started = clock()
        self._last_time = self.started
        self._last_tokens = 0

    def add_completion(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.done += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def add_failure(self) -> None:
        self.failed += 1

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.skipped - self.done - self.failed)

    @property
    def seconds(self) -> float:
        return self._clock() - self.started

    def line(self, in_flight: dict[str, int], down: set[str]) -> str:
        now = self._clock()
        window_s = now - self._last_time
        window_rate = (self.completion_tokens - self._last_tokens) / window_s if window_s > 0 else 0.0
        self._last_time, self._last_tokens = now, self.completion_tokens
        elapsed = now - self.started
        overall_rate = self.completion_tokens / elapsed if elapsed > 0 else 0.0
        finished = self.skipped + self.done + self.failed
        if self.done and overall_rate > 0:
            tokens_left = self.remaining * self.completion_tokens / self.done
            eta = f"ETA {format_duration(tokens_left / overall_rate)} ({tokens_left / 1e6:.2f}M tokens to go)"
        else:
            eta = "ETA unknown until the first completions"
        servers = " ".join(f"{name}={'DOWN/' if name in down else ''}{count}" for name, count in in_flight.items())
        return (f"{finished}/{self.total} done ({100.0 * finished / max(1, self.total):.1f} %; "
                f"{self.failed} failed, {self.skipped} from earlier tries), "
                f"{window_rate:,.0f} tok/s now, {overall_rate:,.0f} tok/s overall, {eta}; in flight: {servers}")


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
