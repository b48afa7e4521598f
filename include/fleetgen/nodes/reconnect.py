"""How long a watcher keeps reconnecting to a node whose SSH connection dropped.

A budget of consecutive failures, counted from the first failure after the last good poll: at most
``attempts`` reconnects and at most ``seconds`` of trying, whichever runs out first. Waits between
tries grow exponentially with jitter (so that the watchers of one node do not reconnect in lockstep)
and never overshoot what is left of the time budget. Pure logic: the clock is passed in. Why these
defaults: docs/security-and-ssh.md §4.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Defaults, for a readiness wait of up to 30 minutes. An sshd restart or a dropped NAT entry costs
# seconds and a switch fail-over or a route flap a minute or two: 8 reconnects back off 1, 2, 4, 8,
# 16, 30, 30, 30 s (about 2 minutes, 3 with jitter), and 5 minutes caps tries that each hang until
# their timeout on a black-holed route. A node gone longer than that is an outage for a person.
DEFAULT_RECONNECT_ATTEMPTS = 8
DEFAULT_RECONNECT_BUDGET_S = 300.0
# One remote command (tail of the log + kill -0) answers in milliseconds; 30 s is a wedged channel.
DEFAULT_COMMAND_TIMEOUT_S = 30.0
MAX_BACKOFF_S = 30.0


@dataclass
class ReconnectBudget:
    attempts: int = DEFAULT_RECONNECT_ATTEMPTS
    seconds: float = DEFAULT_RECONNECT_BUDGET_S
    failures: int = 0
    first_failure_at: float | None = None
    _random: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.seconds < 0:
            raise ValueError(f"a reconnect budget is never negative: {self.attempts} attempts, {self.seconds} s")

    def record_failure(self, now: float) -> None:
        self.failures += 1
        if self.first_failure_at is None:
            self.first_failure_at = now

    def reset(self) -> None:
        """A full poll succeeded: the next drop starts a fresh budget."""
        self.failures, self.first_failure_at = 0, None

    def elapsed(self, now: float) -> float:
        return 0.0 if self.first_failure_at is None else now - self.first_failure_at

    def spent(self, now: float) -> bool:
        return self.failures > self.attempts or self.elapsed(now) >= self.seconds

    def delay(self, now: float) -> float:
        """Seconds to wait before the next reconnect: exponential, jittered, within the time left."""
        base = min(2.0 ** max(self.failures - 1, 0), MAX_BACKOFF_S)
        wanted = base + self._random.uniform(0, base / 2)
        return max(0.0, min(wanted, self.seconds - self.elapsed(now)))

    def describe(self, now: float) -> str:
        return (f"{self.failures} failed connection(s) over {self.elapsed(now):.0f} s "
                f"(budget: {self.attempts} reconnects, {self.seconds:.0f} s)")
