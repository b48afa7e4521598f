"""One server as one shard's dispatcher sees it, in parts with one job each.

- ``ServerHealth``: up or down, a small state machine (up, then down, then up again) that keeps what the
  report shows of it (each time the server was marked down and why, each recovery and how long it took)
  and whether the down server was found *hung*: what a shard holds there then never returns.
- ``ServerLoad``: the requests in flight there, the workers waiting on it, when it last answered, and this
  shard's cap on it (its share of the server's limit while other shards run).
- ``ServerTally``: what became of the prompts sent there.

The dispatcher (``dispatch.py``) decides when a server goes down or comes back; these parts only keep
the state consistent (a transition from the wrong state is refused) and in one place.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx

from fleetgen.generate.chat import CHAT_PATH, HEALTH_PATH
from fleetgen.generate.settings import ServerEndpoint


@dataclass(frozen=True)
class DownPeriod:
    """Why and since when (monotonic seconds) a server is down; ``hung``: it stopped answering."""

    since: float
    reason: str


class ServerHealth:
    """Up or down. ``up`` is set while the server is up: the server's workers wait on it."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.up.set()
        self.down: DownPeriod | None = None
        self.marked_down: list[dict] = []  # {"at", "reason"} per down period, for the report
        self.recovered: list[dict] = []  # {"at", "down_s"} per recovery
        self.shared_at = 0.0  # wall time of the latest shared-health transition made or applied here

    @property
    def is_down(self) -> bool:
        return self.down is not None

    @property
    def downs(self) -> int:
        """How many times the server was marked down (the re-check backoff grows with it)."""
        return len(self.marked_down)

    def mark_down(self, reason: str, *, now: float, at: str) -> None:
        """Up -> down. ``now``: monotonic; ``at``: the wall-clock time the report shows."""
        if self.down is not None:
            raise RuntimeError(f"marked down while already down ({self.down.reason}): {reason}")
        self.down = DownPeriod(since=now, reason=reason)
        self.up.clear()
        self.marked_down.append({"at": at, "reason": reason})

    def mark_up(self, *, now: float, at: str) -> float:
        """Down -> up; returns how long the server was down, in seconds."""
        if self.down is None:
            raise RuntimeError("marked up while up")
        down_s = now - self.down.since
        self.down = None
        self.recovered.append({"at": at, "down_s": round(down_s, 1)})
        self.up.set()
        return down_s


@dataclass
class ServerLoad:
    """What this shard has on the server now."""

    cap: int  # workers allowed to send now: the server's limit shared with the other running shards
    in_flight: int = 0
    requesting: set = field(default_factory=set)  # worker tasks waiting on this server right now
    last_answer: float = 0.0  # monotonic time of the last response (of any kind) from this server
    stall_probe: asyncio.Task | None = None
    cap_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def begin(self, worker: asyncio.Task, now: float) -> None:
        if self.in_flight == 0:
            self.last_answer = now  # silence is measured from the first request in flight
        self.in_flight += 1
        self.requesting.add(worker)

    def end(self, worker: asyncio.Task) -> None:
        self.in_flight -= 1
        self.requesting.discard(worker)

    def resize(self, cap: int) -> None:
        """A new cap wakes the workers waiting for a share of the server."""
        if cap != self.cap:
            self.cap = cap
            self.cap_changed.set()
            self.cap_changed = asyncio.Event()

    def abandon(self, message: str) -> None:
        """Cancel every request waiting on the server (it hung: they would never return)."""
        for worker in list(self.requesting):
            worker.cancel(message)


@dataclass
class ServerTally:
    completed: int = 0
    failed: int = 0  # prompts written off while on this server
    retried: int = 0  # requests that failed here and went back to the queue


@dataclass
class ServerState:
    endpoint: ServerEndpoint
    health: ServerHealth = field(default_factory=ServerHealth)
    load: ServerLoad = field(init=False)
    tally: ServerTally = field(default_factory=ServerTally)
    recheck: asyncio.Task | None = None

    def __post_init__(self) -> None:
        # URLs are parsed once: httpx would parse them again for every request.
        self.chat_url = httpx.URL(self.endpoint.url + CHAT_PATH)
        self.health_url = httpx.URL(self.endpoint.url + HEALTH_PATH)
        self.load = ServerLoad(cap=self.endpoint.max_in_flight)

    @property
    def name(self) -> str:
        return self.endpoint.name

    def summary(self) -> dict:
        """The server's part of the shard's stats record."""
        return {"completed": self.tally.completed, "failed": self.tally.failed, "retried": self.tally.retried,
                "marked_down": list(self.health.marked_down), "recovered": list(self.health.recovered)}
