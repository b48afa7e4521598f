"""The pull-based dispatcher: each server runs as many workers as its in-flight limit, and a worker
takes the next prompt only when its previous request has finished, so faster servers take more.

Failures, by what they say about the server:

- refused connection, timeout, dropped connection, 5xx, or a 200 that is not a completion: the
  server is marked down (its workers stop taking prompts), the prompt goes back to the queue with
  a backoff for the other servers, and ``/health`` is re-checked with a doubling delay. When it
  answers 200, one trial request must succeed before all the server's workers resume (a server
  whose /health is fine but whose generations fail stays down, at a growing interval). Only the
  failure that marks a server down counts against the prompt's ``max_attempts``; the requests that
  fail after it on a server already down are the server's fault, not the prompt's. Every server
  down for ``all_down_timeout_s`` fails the shard.
- a server that answers nothing for ``stall_check_s`` while requests are in flight and then fails its
  ``/health`` probe too (hung, not busy) is marked down at once and the requests it holds are
  abandoned and sent elsewhere, instead of each waiting out the request timeout.
- 408, 429, or a completion the server aborted: the prompt is retried; the server stays up.
- another shard of the run marked the server down (``health.py``): it is marked down here too and,
  when it was found hung, the requests this shard holds there are abandoned at once; when another
  shard finds it back up, it is back up here.
- 401/403/404: the run is misconfigured (key, URL, model), so the shard stops at once.
- a server that is not the launch ``wait_ready`` read: a completion naming another launch (its
  ``metadata.weight_version``), or a fresh ``/server_info`` (read before anything is sent, before a
  returning server's trial request and every ``launch_check_s``) with another model path, identity or
  planned flag: that completion is not written, the requests in flight there are abandoned, and the
  shard stops (``ServerReplaced``, never retried; ``launch_check.py``, docs/shards.md §7).
- any other 4xx: the prompt itself is wrong (e.g. longer than the context): written to the errors
  file as the prompt's own fault, not retried, and kept by every later try. Until a prompt of the
  shard has succeeded, such errors may as well be the server's (a broken chat template, a wrong
  model name): they are held unwritten until a completion shows the server works. If the first
  ``client_error_breaker`` results are all such errors, or every result is one, the shard stops
  and writes none of them off, so the try that follows the fix sends them again.
- a prompt whose ``max_attempts`` all failed is written off as the server's fault: a later try of
  the shard (a retry, or a clear) sends it again (``store.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleetgen.errors import AllServersDown, GenerationError
from fleetgen.generate.health_keeping import STALLED, ServerHealthKeeping
from fleetgen.generate import jsonio
from fleetgen.generate.chat import (CHAT_PATH, BadResponse, Verdict, error_message, parse_chat_response, request_body,
                                    verdict_for_status)
from fleetgen.generate.health import SharedHealth
from fleetgen.generate.launch_check import LaunchCheck, answered_by_another_launch
from fleetgen.generate.liveness import FleetShare, alone
from fleetgen.generate.progress import Progress
from fleetgen.generate.queue import QueuedPrompt, WorkQueue
from fleetgen.generate.records import PROMPT_FAULT, SERVER_FAULT, completion_record, error_record, stats_record
from fleetgen.generate.reuse import prompt_hash
from fleetgen.generate.server_state import ServerState
from fleetgen.generate.settings import GenerationSettings, ServerEndpoint
from fleetgen.generate.store import ShardStore
from fleetgen.generate.watch import EventJournal, MetricsScraper, RowSink

MONITOR_TICK_S = 0.25
MARK_INTERVAL_S = 1.0
HEALTH_POLL_S = 0.5  # how often the shared server-health file is looked at (one stat when unchanged)


@dataclass
class Periodic:
    """An action the monitor runs every ``interval_s`` (checked at each tick)."""

    interval_s: float
    action: Callable[[], None]
    next_at: float = 0.0

    def start(self, now: float) -> None:
        self.next_at = now + self.interval_s

    def run_if_due(self, now: float) -> None:
        if now >= self.next_at:
            self.next_at = now + self.interval_s
            self.action()


@dataclass(frozen=True)
class ShardWork:
    """What one shard's dispatcher works through, and where its results go."""

    shard_id: int
    queue: WorkQueue
    store: ShardStore
    progress: Progress
    finished_before: int = 0  # completed by earlier tries: the client-error breaker is armed only at 0
    # time.time() after which no fresh prompt is started (the tuning trial's time cap); the shard then ends once
    # its prompts in flight are done and leaves the others to a later try (None: every prompt)
    stop_taking_at: float | None = None


@dataclass(frozen=True)
class FleetLinks:
    """How the shard reaches the servers, and what it learns from the run's other shards."""

    transport: httpx.AsyncBaseTransport
    headers: list[tuple[bytes, bytes]]
    sharing: Callable[[], FleetShare] = alone  # this shard's part of every server, asked periodically
    sharing_interval_s: float = 10.0
    health: SharedHealth | None = None  # the run's shared server health; None: this shard's own view only


@dataclass(frozen=True)
class ShardRecords:
    """What the shard reports besides its completions: log lines, server events, metrics samples."""

    log: logging.Logger
    progress_interval_s: float
    events: EventJournal | None = None
    metrics_path: Path | RowSink | None = None  # a local file, or the journal of a shard on an object store


class Dispatcher(ServerHealthKeeping):
    """Sends a shard's prompts through the servers; keeping each server's health is ``ServerHealthKeeping``'s."""

    def __init__(self, *, servers: list[ServerEndpoint], settings: GenerationSettings, work: ShardWork,
                 links: FleetLinks, records: ShardRecords) -> None:
        self.shard_id = work.shard_id
        self.queue = work.queue
        self.store = work.store
        self.progress = work.progress
        self.stop_taking_at = work.stop_taking_at
        self.settings = settings
        self.transport = links.transport
        self.headers = httpx.Headers(links.headers)
        # Each running shard takes its share of every server's limit, so that together they keep each
        # server at its limit, not a multiple of it.
        self.sharing = links.sharing
        self.sharing_interval_s = links.sharing_interval_s
        self.shards_sharing = 1
        self.health = links.health
        self.log = records.log
        self.events = records.events  # server events (down, recovered, retried, failed) for the report
        self.progress_interval_s = records.progress_interval_s
        self.servers = [ServerState(endpoint) for endpoint in servers]
        self._rechecks: list[asyncio.Task] = []  # every re-check started (one may outlive its down period)
        self.fatal: BaseException | None = None
        # Client errors trip the breaker only while no prompt of the shard has ever succeeded; until then they
        # are held here (server, prompt, code, message), taken and not finished, so nothing is written off.
        self._breaker_armed = work.finished_before == 0
        self._client_error_window: list[tuple[ServerState, QueuedPrompt, str, str]] = []
        self._request_extensions = {"timeout": {
            "connect": settings.connect_timeout_s, "read": settings.effective_request_timeout_s,
            "write": settings.connect_timeout_s, "pool": settings.connect_timeout_s}}
        self._health_extensions = {"timeout": {
            "connect": settings.connect_timeout_s, "read": settings.health_timeout_s,
            "write": settings.connect_timeout_s, "pool": settings.connect_timeout_s}}
        self.launch_check = LaunchCheck(send=self._send, headers=self.headers, extensions=self._health_extensions)
        self.scraper = None
        if records.metrics_path is not None and settings.sample_interval_s > 0:
            by_name = {s.name: s for s in self.servers}
            self.scraper = MetricsScraper(servers=list(servers), send=self._send, headers=self.headers,
                                          interval_s=settings.sample_interval_s, path=records.metrics_path,
                                          in_flight=lambda name: by_name[name].load.in_flight, log=self.log,
                                          shard_id=self.shard_id, is_down=lambda name: by_name[name].health.is_down)

    async def run(self) -> None:
        self._reshare()
        self._sync_health()  # servers other shards already found down are not sent anything
        await self._check_launches()  # before anything is sent: a shard of an old run refuses another run's servers
        if self.fatal is not None:
            raise self.fatal
        self._close_if_due()  # a later trial shard may start past the cap: it sends nothing
        # Each server's first slots before any server's later ones (by the share of its own limit): the workers
        # started first take the prompts first, so a shard smaller than the fleet's limit (a small job, the end of
        # one) spreads over every server in proportion to its limit instead of filling the first and idling the rest.
        slots = sorted(((slot, server) for server in self.servers for slot in range(server.endpoint.max_in_flight)),
                       key=lambda pair: pair[0] / pair[1].endpoint.max_in_flight)
        tasks = []
        if not self.queue.finished.is_set():  # closed at once by its time cap: nothing to send or watch
            tasks = [self._spawn(self._worker(server, slot)) for slot, server in slots]
            tasks.append(self._spawn(self._monitor()))
            tasks.append(self._spawn(self._watch_launches()))
            if self.scraper is not None:
                tasks.append(self._spawn(self.scraper.run()))
        try:
            await self.queue.finished.wait()
        finally:
            tasks.extend(self._rechecks)
            tasks.extend(server.load.stall_probe for server in self.servers if server.load.stall_probe is not None)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.store.save_mark(*self.queue.low_water())
            if self.scraper is not None:  # a try that sent nothing (all done before, or past its time cap) leaves
                # no row: the servers' state is others' doing
                await self.scraper.finish(last_sample=self.progress.done + self.progress.failed > 0)
        if self.fatal is not None:
            raise self.fatal

    def _stop(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
        self.queue.finished.set()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task:
        """A task whose unexpected error (a prompts file changed under us, a full disk, a bug)
        stops the shard instead of dying unseen."""
        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._stop(exc)
        return asyncio.create_task(guarded())

    # --- the workers: one per slot of each server, each sending one prompt at a time ---------------------

    async def _worker(self, server: ServerState, slot: int) -> None:
        while self.fatal is None:
            if not server.health.up.is_set():
                await server.health.up.wait()
            if slot >= server.load.cap:  # another shard holds this share of the server for now
                await server.load.cap_changed.wait()
                continue
            item = self.queue.take()
            if item is None:
                self._settle_client_error_window()
                await self.queue.wait_for_change()
                continue
            await self._attempt(server, item)

    async def _attempt(self, server: ServerState, item: QueuedPrompt) -> str | None:
        """Send one prompt; returns the failure message when the server failed, else None."""
        body, sampling = request_body(item.prompt, self.settings)
        request = httpx.Request("POST", server.chat_url, content=body, headers=self.headers,
                                extensions=self._request_extensions)
        started = time.monotonic()
        worker = asyncio.current_task()
        server.load.begin(worker, started)
        try:
            response = await self._send(request)
        except httpx.TimeoutException as exc:
            return self._server_failed(server, item, "timeout", f"{type(exc).__name__}: {exc}")
        except httpx.TransportError as exc:
            return self._server_failed(server, item, "connection", f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError as exc:
            if exc.args != (STALLED,):
                raise
            worker.uncancel()  # abandoned by the stall watchdog: this worker goes on with other prompts
            return self._server_failed(server, item, "stalled", "abandoned: the server stopped answering")
        finally:
            server.load.end(worker)
        server.load.last_answer = time.monotonic()
        latency_s = server.load.last_answer - started
        status = response.status_code
        verdict = verdict_for_status(status)
        if verdict is Verdict.ANSWERED:
            try:
                result = parse_chat_response(response.content)
            except BadResponse as exc:
                return self._server_failed(server, item, "bad_response", str(exc))
            if result.finish_reason == "abort":
                return self._retry(server, item, "the server aborted the request (finish_reason abort)")
            if server.endpoint.launch_id is not None and result.weight_version != server.endpoint.launch_id:
                changes, found = answered_by_another_launch(server.endpoint, result.weight_version)
                self._stop_replaced(server, changes, found,
                                    seen_in=f"its completion of prompt {item.prompt.id!r}, not written")
                return None
            return self._completed(server, item, result, latency_s, sampling)
        message = f"HTTP {status}: {error_message(response.content)}"
        if verdict is Verdict.BAD_KEY:
            self._stop(GenerationError(
                message, shard=self.shard_id, server=server.name,
                hint="the server refused the API key: check the key in the run's connection/secret "
                     "matches the servers' --api-key"))
            return None
        if verdict is Verdict.NO_ROUTE:
            self._stop(GenerationError(
                f"{message} for {CHAT_PATH}", shard=self.shard_id, server=server.name,
                hint="check the server URL and that it is an OpenAI-compatible SGLang server"))
            return None
        if verdict is Verdict.RETRY:
            return self._retry(server, item, message)
        if verdict is Verdict.CLIENT_ERROR:
            return self._client_error(server, item, f"http_{status}", message)
        return self._server_failed(server, item, f"http_{status}", message)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """One request on the shard's pooled transport.

        ``httpx.AsyncClient.send`` would add cookie extraction (through urllib's request and
        response adapters), auth and redirect flows and event hooks: ~80 us of CPU per request,
        a third of the whole per-request cost, for features generation requests never use.
        """
        response = await self.transport.handle_async_request(request)
        await response.aread()
        return response

    # --- what becomes of a prompt ---------------------------------------------------------------------------

    def _completed(self, server: ServerState, item: QueuedPrompt, result, latency_s: float,
                   sampling: dict) -> None:
        record = completion_record(item.prompt, result, server=server.name, latency_s=latency_s,
                                   sampling=sampling)
        self.store.record_completion(jsonio.dumps(record) + b"\n", jsonio.dumps(stats_record(record)) + b"\n",
                                     item.prompt.id, prompt_hash=prompt_hash(item.prompt))
        server.tally.completed += 1
        usage = result.usage
        self.progress.add_completion(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
        self.queue.finish(item)
        if self.fatal is not None:  # a tripped breaker said none of its window is written off: keep its word
            return
        self._breaker_armed = False  # the server works: the refusals held so far were the prompts' own fault
        window, self._client_error_window = self._client_error_window, []
        for held in window:
            self._write_off(*held, fault=PROMPT_FAULT)

    def _write_off(self, server: ServerState, item: QueuedPrompt, code: str, message: str, *, fault: str) -> None:
        record = error_record(item.prompt.id, code=code, message=message, server=server.name, fault=fault)
        self.store.record_failure(jsonio.dumps(record) + b"\n", item.prompt.id)
        server.tally.failed += 1
        self._event("failed", server, prompt=item.prompt.id, code=code, reason=message[:500])
        self.progress.add_failure()
        self.queue.finish(item)
        self._settle_client_error_window()

    def _client_error(self, server: ServerState, item: QueuedPrompt, code: str, message: str) -> None:
        if not self._breaker_armed:
            return self._write_off(server, item, code, message, fault=PROMPT_FAULT)
        self._client_error_window.append((server, item, code, message))
        held = len(self._client_error_window)
        if held >= self.settings.client_error_breaker:
            self._trip_breaker(f"the first {held} results were all client errors")
        else:
            self._settle_client_error_window()

    def _settle_client_error_window(self) -> None:
        """Every prompt left is a held client error (none succeeded): the breaker trips on all of them."""
        held = len(self._client_error_window)
        if held and self.fatal is None and self.queue.only_held(held):
            self._trip_breaker(f"all {held} results were client errors")

    def _trip_breaker(self, what: str) -> None:
        server, _, _, message = self._client_error_window[-1]
        self._stop(GenerationError(
            f"{what}, e.g. {message}; none of them is written off", shard=self.shard_id, server=server.name,
            hint="a setting or the server is wrong rather than the prompts: check the model name, max_tokens against "
                 "the context length, extra_body and the server's chat template; once fixed, clear this task: "
                 "it sends these prompts again"))

    def _retry(self, server: ServerState, item: QueuedPrompt, message: str, *, blame: bool = True) -> None:
        server.tally.retried += 1
        self._event("retried", server, prompt=item.prompt.id, reason=message[:500])
        if blame:
            item.attempts += 1
            if item.attempts >= self.settings.max_attempts:
                return self._write_off(server, item, "attempts_exhausted",
                                       f"{item.attempts} attempts failed; the last: {message}", fault=SERVER_FAULT)
        delay = min(self.settings.retry_backoff_s * 2 ** max(0, item.attempts - 1), self.settings.recheck_max_s)
        self.queue.retry_later(item, delay)

    def _server_failed(self, server: ServerState, item: QueuedPrompt, code: str, message: str) -> str:
        reason = f"{code}: {message}"
        already_down = server.health.is_down
        if not already_down:
            self._mark_down(server, reason)
        self._retry(server, item, message, blame=not already_down)
        return reason

    def _event(self, kind: str, server: ServerState, **fields) -> None:
        if self.events is not None:
            self.events.record(kind, server.name, **fields)

    # --- sharing the fleet with the run's other shards ------------------------------------------------------

    def _reshare(self) -> None:
        """Ask how the shards share the fleet and resize every server's cap to this shard's part within
        the room the other shards leave (``FleetShare.cap``)."""
        try:
            share = self.sharing()
        except Exception as exc:  # keep the last known share: a failed count must not stop generation
            self.log.warning("shard %d: could not count the shards sharing the fleet (%s); keeping 1/%d",
                             self.shard_id, exc, self.shards_sharing)
            return
        caps = {server.name: share.cap(server.name, server.endpoint.max_in_flight) for server in self.servers}
        changed = share.active != self.shards_sharing
        self.shards_sharing = share.active
        for server in self.servers:
            server.load.resize(caps[server.name])
        if changed:
            self.log.info("shard %d: %d shard(s) share the fleet; in-flight caps now %s", self.shard_id,
                          share.active, ", ".join(f"{s.name}={s.load.cap}" for s in self.servers))

    def share_state(self) -> tuple[dict[str, int], bool]:
        """What this shard publishes to the others: requests in flight per server, and whether it is
        draining (no fresh prompts left to send)."""
        return {s.name: s.load.in_flight for s in self.servers}, self.queue.fresh_exhausted

    # --- the monitor: periodic work, stalled servers, every server down -------------------------------------

    async def _monitor(self) -> None:
        periodic = [Periodic(HEALTH_POLL_S, self._sync_health),
                    Periodic(self.sharing_interval_s, self._reshare),
                    Periodic(MARK_INTERVAL_S, lambda: self.store.save_mark(*self.queue.low_water())),
                    Periodic(self.progress_interval_s, self._log_progress)]
        now = time.monotonic()
        for timer in periodic:
            timer.start(now)
        tick = min(MONITOR_TICK_S, self.progress_interval_s)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for timer in periodic:
                timer.run_if_due(now)
            self._probe_silent_servers(now)
            self._close_if_due()
            if all(server.health.is_down for server in self.servers):
                since = max(server.health.down.since for server in self.servers)
                if now - since >= self.settings.all_down_timeout_s:
                    return self._stop(self._all_down_error(now - since))

    def _close_if_due(self) -> None:
        """Past ``stop_taking_at``: no more fresh prompts (those in flight finish; a later try takes the rest)."""
        if self.stop_taking_at is None or self.queue.fresh_exhausted or time.time() < self.stop_taking_at:
            return
        self.queue.close_fresh()
        self.log.info("shard %d: its time cap is reached: no more prompts are started, the %d in flight finish and "
                      "the rest of the shard is left for a later try", self.shard_id, self.queue.in_flight)

    def _log_progress(self) -> None:
        self.log.info("shard %d: %s", self.shard_id, self.progress_line())

    def progress_line(self) -> str:
        return self.progress.line({s.name: s.load.in_flight for s in self.servers},
                                  {s.name for s in self.servers if s.health.is_down})

    def _all_down_error(self, down_s: float) -> AllServersDown:
        lines = "\n".join(f"  {s.name}: down since {s.health.marked_down[-1]['at']} "
                          f"({s.health.marked_down[-1]['reason']})" for s in self.servers)
        return AllServersDown(
            f"every server has been down for {down_s:.0f} s; progress is saved "
            f"({self.progress.skipped + self.progress.done} done, {self.progress.remaining} left):\n{lines}",
            shard=self.shard_id,
            hint="check the servers' logs and GPUs; a retry of this task resumes where it stopped")
