"""What a generating shard records beside its completions: the servers' own metrics over time, and
what happened to each server (marked down, back up, prompts retried or written off).

Both are per-shard JSONL files in the run folder (``RunLayout``: ``metrics/`` and ``events/``;
docs/output-formats.md). The shard itself samples because it lives exactly as long as generation,
already holds a connection pool to every server, and needs no slot of its own; with several shards
running, each samples (a few hundred bytes every few seconds per server), and the report merges
the samples per server by time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import httpx

from fleetgen.errors import ServerError
from fleetgen.generate import jsonio
from fleetgen.generate.records import utc_now
from fleetgen.generate.server_metrics import METRICS_PATH, parse_metrics
from fleetgen.generate.settings import ServerEndpoint

SCRAPE_TIMEOUT_S = 5.0


class JsonlAppender:
    """An append-only JSONL file opened once; each row is one ``write`` (whole lines, never torn by
    another writer of the same file since each shard has its own)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, row: dict) -> None:
        os.write(self._fd, jsonio.dumps(row) + b"\n")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RowSink(Protocol):
    """Where a journal's rows go: a local file (``JsonlAppender``) or the parts of a shard on an object store
    (``ObjectShardStore.journal``)."""

    def append(self, row: dict) -> None: ...

    def close(self) -> None: ...


def row_sink(target: Path | RowSink) -> RowSink:
    return JsonlAppender(target) if isinstance(target, Path) else target


class EventJournal:
    """``events/shard-NNNNN.jsonl``: one row per server event the dispatcher sees (see ``EVENT_KINDS``)."""

    EVENT_KINDS = ("down", "recovered", "retried", "failed", "replaced")

    def __init__(self, target: Path | RowSink, shard_id: int) -> None:
        self.shard_id = shard_id
        self._out = row_sink(target)

    def record(self, kind: str, server: str, **fields) -> None:
        if kind not in self.EVENT_KINDS:
            raise ValueError(f"unknown server event {kind!r}; expected one of {self.EVENT_KINDS}")
        self._out.append({"at": utc_now(), "t": round(time.time(), 3), "shard": self.shard_id, "event": kind,
                          "server": server, **fields})

    def close(self) -> None:
        self._out.close()


class MetricsScraper:
    """Every ``interval_s``, GET ``/metrics`` of every server at once and append one row per server
    (``MetricsSample.row`` plus ``sent``: this shard's requests in flight there) to ``path``.

    A failed scrape is skipped (the dispatcher judges a server's health, not this); the first
    failure of each server is logged once.
    """

    def __init__(self, *, servers: list[ServerEndpoint], send: Callable[[httpx.Request], Awaitable[httpx.Response]],
                 headers: httpx.Headers, interval_s: float, path: Path | RowSink, in_flight: Callable[[str], int],
                 log: logging.Logger, shard_id: int, is_down: Callable[[str], bool] = lambda name: False) -> None:
        self.servers = servers
        self.send = send
        self.headers = headers
        self.interval_s = interval_s
        self.in_flight = in_flight
        self.is_down = is_down  # a server the dispatcher marked down is not asked (a hung one would not answer)
        self.log = log
        self.shard_id = shard_id
        self._out = row_sink(path)
        self._urls = {server.name: httpx.URL(server.url + METRICS_PATH) for server in servers}
        self._warned: set[str] = set()
        self._extensions = {"timeout": {"connect": SCRAPE_TIMEOUT_S, "read": SCRAPE_TIMEOUT_S,
                                        "write": SCRAPE_TIMEOUT_S, "pool": SCRAPE_TIMEOUT_S}}
        self.samples = 0

    async def run(self) -> None:
        """Sample until cancelled; ``finish`` closes the file."""
        while True:
            await self.scrape_all()
            await asyncio.sleep(self.interval_s)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(server) for server in self.servers if not self.is_down(server.name)))

    async def finish(self, *, last_sample: bool = True) -> None:
        """After ``run`` was cancelled: one last sample of every server that answers, the servers as the shard
        leaves them. SGLang counts a request's output tokens when it finishes, so only a row after the shard's last
        requests returned holds their tokens (the report's end of the job, fleetgen.report.drain); and a shard that
        ended before any scrape answered (a short one on a busy host) still leaves a row per server. Without
        ``last_sample`` (a try that found nothing to send) the file is only closed."""
        try:
            if last_sample:
                await self.scrape_all()
        finally:
            self._out.close()

    async def scrape(self, server: ServerEndpoint) -> None:
        request = httpx.Request("GET", self._urls[server.name], headers=self.headers, extensions=self._extensions)
        at = time.time()
        try:
            response = await self.send(request)
            if response.status_code != 200:
                raise ServerError(f"{METRICS_PATH} answered HTTP {response.status_code}", server=server.name)
            sample = parse_metrics(response.content.decode("utf-8", "replace"), server=server.name)
        except (httpx.TransportError, ServerError) as exc:
            if server.name not in self._warned:
                self._warned.add(server.name)
                self.log.warning("shard %d: no metrics from %s (%s); its occupancy has gaps", self.shard_id,
                                 server.name, exc)
            return
        row = sample.row(at=at, server=server.name, cap=server.effective_max_running_requests)
        row["sent"] = self.in_flight(server.name)
        self._out.append(row)
        self.samples += 1
