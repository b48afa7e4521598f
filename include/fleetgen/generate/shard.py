"""Generate one shard: resume from disk, dispatch over the fleet, return a JSON-safe summary."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleetgen.errors import ConfigError, GenerationError
from fleetgen.generate.dispatch import Dispatcher, FleetLinks, ShardRecords, ShardWork
from fleetgen.generate.queue import WorkQueue
from fleetgen.generate.health import SharedHealth
from fleetgen.generate.liveness import HEARTBEAT_INTERVAL_S, FleetShare, ShardHeartbeat, alone, fleet_share
from fleetgen.generate.progress import Progress
from fleetgen.generate.reuse import ReuseSource, copy_reused
from fleetgen.generate.settings import GenerationSettings, ServerEndpoint
from fleetgen.generate.object_store import ObjectShardStore
from fleetgen.generate.store import ShardStore
from fleetgen.generate.transport import PooledTransport
from fleetgen.generate.watch import EventJournal
from fleetgen.outputs import RunLayout
from fleetgen.storage.objects import ObjectStore
from fleetgen.storage.run_files import LocalRunFiles, ObjectRunFiles, RunFiles

# "end" and "blocks" fix the bytes the shard reads at plan time (docs/shards.md §5).
SHARD_KEYS = ("shard_id", "input_path", "start", "end", "count", "blocks")
# How often a shard recounts the shards sharing the fleet: as often as they beat, so a shard that ends
# (its heartbeat removed) hands its part of every server over within seconds, not at a 10 s recount.
SHARING_INTERVAL_S = HEARTBEAT_INTERVAL_S
_default_log = logging.getLogger("fleetgen.generate")
# httpx logs every request at INFO: hundreds of thousands of lines and real CPU on the hot path.
_httpx_log = logging.getLogger("httpx")


@dataclass(frozen=True)
class ShardRunOptions:
    """How one try of a shard runs, beside what it generates (shard, servers, out_dir, settings);
    ``run_shard`` says what each option does. The defaults fit a shard run alone, outside Airflow."""

    api_key: str | None = field(default=None, repr=False)  # only ever sent as a header, never logged
    try_number: int | None = None
    reuse: ReuseSource | None = None
    transport: httpx.AsyncBaseTransport | None = None  # None: the shard's own pooled one, closed at its end
    sharing: Callable[[], int] | None = None
    sharing_interval_s: float = SHARING_INTERVAL_S
    log: logging.Logger | None = None
    progress_interval_s: float = 5.0
    # time.time() after which the try starts no more prompts (the tuning trial's time cap, docs/tuning-trial.md):
    # it finishes those in flight and leaves the rest of the shard, counted in the summary's "left", to a later try
    stop_taking_at: float | None = None
    # the run's prefix on an object store (docs/object-storage.md §4): the shard's records and journals are committed
    # there (generate/object_store.py), its heartbeat, lost tries and the run's server health kept there
    # (storage/run_files.py); nothing of the run is written to out_dir then
    output: ObjectStore | None = None

    def __post_init__(self) -> None:
        if not self.progress_interval_s > 0:
            raise ConfigError(f"progress_interval_s must be > 0, got {self.progress_interval_s}")


async def run_shard_async(shard: dict, servers: list[ServerEndpoint], out_dir: str | os.PathLike,
                          settings: GenerationSettings, *, options: ShardRunOptions = ShardRunOptions()) -> dict:
    """Generate every prompt of ``shard`` not already on disk under ``out_dir``; see ``run_shard``."""
    log = options.log or _default_log
    try_number, reuse, transport = options.try_number, options.reuse, options.transport
    if _httpx_log.getEffectiveLevel() < logging.WARNING:
        _httpx_log.setLevel(logging.WARNING)
    _check_inputs(shard, servers)
    shard_id = int(shard["shard_id"])
    if options.output is not None:
        store, resume = ObjectShardStore.open(options.output, shard, log=log, try_number=try_number)
    else:
        store, resume = ShardStore.open(out_dir, shard, log=log, try_number=try_number,
                                        lease_wait_s=settings.lease_wait_s)
    # After the store is open, so a try that may still write the output is over: a heartbeat left then
    # belongs to a try that died.
    layout = RunLayout(Path(out_dir))
    shared = ObjectRunFiles(options.output) if options.output is not None else LocalRunFiles(layout.root)
    heartbeat = ShardHeartbeat(shared, shard_id, try_number=try_number)
    lost = heartbeat.start(log=log)
    health = None
    ended = threading.Event()  # stops what reads the store in the background for this try
    beating = None
    try:
        reused = 0
        if reuse is not None:
            reused = copy_reused(store, store.pending_prompts(shard), reuse)
            log.info("shard %d: %d completion(s) reused from run %s (prompt, model and sampling unchanged)",
                     shard_id, reused, reuse.run_folder)
        already = resume.finished + resume.failed + reused
        log.info("shard %d: %d prompts, %d already done (%d completed, %d failed earlier); servers and "
                 "in-flight limits: %s; request timeout %.0f s", shard_id, shard["count"], already,
                 resume.finished, resume.failed,
                 ", ".join(f"{s.name}={s.max_in_flight}" for s in servers), settings.effective_request_timeout_s)
        if resume.sent_again:
            log.warning("shard %d: %d prompt(s) that failed in earlier tries through no fault of their own are sent "
                        "again (their error records are cut from %s)", shard_id, resume.sent_again,
                        store.errors_where)
        queue = WorkQueue(store.pending_prompts(shard), store.resume_point(shard))
        progress = Progress(int(shard["count"]), already)
        headers = [(b"content-type", b"application/json")]
        if options.api_key:
            headers.append((b"authorization", b"Bearer " + options.api_key.encode()))
        # One pooled transport carries every request of the shard (see Dispatcher._send).
        pooled = transport or PooledTransport()
        who = f"shard {shard_id}" + (f" (try {try_number})" if try_number is not None else "")
        health = SharedHealth(shared, who=who, log=log) if settings.share_server_health else None
        on_store = isinstance(store, ObjectShardStore)
        events = EventJournal(store.journal("events") if on_store else layout.shard_file("events", shard_id), shard_id)
        dispatcher = Dispatcher(
            servers=servers, settings=settings,
            work=ShardWork(shard_id, queue, store, progress, finished_before=resume.finished,
                           stop_taking_at=options.stop_taking_at),
            links=FleetLinks(pooled, headers,
                             sharing=_shared_by_heartbeats(options.sharing, shared, heartbeat, log, ended),
                             sharing_interval_s=options.sharing_interval_s, health=health),
            records=ShardRecords(log, options.progress_interval_s, events=events,
                                 metrics_path=store.journal("metrics") if on_store
                                 else layout.shard_file("metrics", shard_id)))
        beating = asyncio.create_task(heartbeat.run(dispatcher.share_state))
        try:
            await dispatcher.run()
        finally:
            events.close()
            log.info("shard %d: %s", shard_id, dispatcher.progress_line())
            if transport is None:
                await pooled.aclose()
    finally:
        if beating is not None:
            beating.cancel()
        ended.set()
        heartbeat.stop()
        if health is not None:
            health.close()
        store.close()
    left = int(shard["count"]) - already - progress.done - progress.failed if queue.closed_early else 0
    summary = {"shard_id": shard_id, "lost_try": lost, "done": progress.done, "failed": progress.failed,
               "skipped_already_done": already, "reused": reused, "left": left,
               "prompt_tokens": progress.prompt_tokens, "completion_tokens": progress.completion_tokens,
               "seconds": round(progress.seconds, 3),
               "servers": {s.endpoint.name: s.summary() for s in dispatcher.servers}}
    log.info("shard %d finished: %d done, %d failed, %d from earlier tries, %d completion tokens in %.1f s%s",
             shard_id, progress.done, progress.failed, already, progress.completion_tokens, progress.seconds,
             f"; {left} left for a later try (time cap)" if left else "")
    _check_some_completed(shard, resume.finished + reused + progress.done, resume.failed + progress.failed,
                          store.errors_where, tried=int(shard["count"]) - left)
    return summary


def _check_some_completed(shard: dict, completed: int, failed: int, errors_path: str, *, tried: int) -> None:
    """A shard none of whose prompts completed has not succeeded, whatever wrote its errors off; ``tried`` counts
    its prompts this try or an earlier one took (a time cap leaves the others untried, for a later try)."""
    if completed or not tried:
        return
    raise GenerationError(
        f"none of the shard's {shard['count']} prompts completed: {failed} failed ({errors_path} lists each one)",
        shard=int(shard["shard_id"]), path=errors_path,
        hint="if the servers were at fault (their logs, the errors' codes), fix them and clear this task: the "
             "failures that were not the prompts' own fault are sent again; failures that were (e.g. longer than "
             "the context) are kept: fix those lines of the prompts file and start a new run")


def run_shard(shard: dict, servers: list[ServerEndpoint], out_dir: str | os.PathLike,
              settings: GenerationSettings, *, options: ShardRunOptions = ShardRunOptions()) -> dict:
    """Generate one shard to ``out_dir``/{completions,stats,errors}/shard-NNNNN.jsonl; resumable.

    Returns ``{"shard_id", "lost_try", "done", "failed", "skipped_already_done", "reused", "left", "prompt_tokens",
    "completion_tokens", "seconds", "servers": {name: {"completed", "failed", "retried",
    "marked_down": [{"at", "reason"}], "recovered": [{"at", "down_s"}]}}}`` (JSON-safe).
    Raises ``AllServersDown`` (after saving progress) when every server stays down, and
    ``GenerationError`` when the run is misconfigured. ``options.api_key`` is only ever sent as a header.

    ``options.reuse``, when given, is an earlier run's index: the shard first copies the completions it holds
    for its prompts (``fleetgen.generate.reuse``), counted in ``reused``, and generates the rest.

    ``servers[].max_in_flight`` is the whole fleet's limit for a server. ``options.sharing``, when given, is
    asked every ``options.sharing_interval_s`` how many shards generate right now (this one included); this
    shard then uses 1/n of each server's limit, so concurrent shards together keep it at the limit.
    ``options.log`` takes the shard's lines, among them a progress line every ``options.progress_interval_s``.

    ``options.try_number`` (Airflow's) names this try in the shard's output lease: a newer try of the same
    shard takes the output over and this one stops with ``ShardLeaseLost`` (see generate/lease.py).
    A failed output write raises ``OutputError`` (``OutputUnwritable`` when a retry cannot help).
    The try keeps a heartbeat while it runs (see liveness.py); ``lost_try`` is the earlier try of this
    shard that died without finishing, if this try found one, else None (also named by ``try_number``).
    """
    coroutine = run_shard_async(shard, servers, out_dir, settings, options=options)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - depends on the environment
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _shared_by_heartbeats(running_in_airflow: Callable[[], int] | None, shared: RunFiles,
                          heartbeat: ShardHeartbeat, log: logging.Logger,
                          ended: threading.Event) -> Callable[[], FleetShare]:
    """The shards' own heartbeats decide the share (a dead try stops counting at once, a draining one
    hands its part over as it drains); Airflow's count of running tries, when given, bounds it. Outside
    Airflow the shard runs alone. On an object store the heartbeats are read by a thread of their own (a list and a
    read per shard), and the dispatch loop takes the latest share it counted."""
    if running_in_airflow is None:
        return alone

    def count() -> FleetShare:
        return fleet_share(shared, heartbeat, running_in_airflow=running_in_airflow(), log=log)

    if isinstance(shared, LocalRunFiles):
        return count
    return BackgroundValue(count, SHARING_INTERVAL_S, ended).latest


class BackgroundValue:
    """``latest()``: what ``compute`` last returned, recomputed every ``interval_s`` by a daemon thread (the first
    value at the first call) until ``ended`` is set; an error leaves the last value and is raised by ``latest``
    once."""

    def __init__(self, compute: Callable[[], FleetShare], interval_s: float, ended: threading.Event) -> None:
        self.compute = compute
        self.interval_s = interval_s
        self.ended = ended
        self._value: FleetShare | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def latest(self) -> FleetShare:
        if self._thread is None:
            self._value = self.compute()
            self._thread = threading.Thread(target=self._run, name="fleet-share", daemon=True)
            self._thread.start()
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error
        return self._value

    def _run(self) -> None:
        while not self.ended.wait(self.interval_s):
            try:
                value = self.compute()
            except Exception as exc:  # noqa: BLE001 - handed to the dispatch loop, which logs it and keeps its share
                with self._lock:
                    self._error = exc
                continue
            with self._lock:
                self._value = value


def _check_inputs(shard: dict, servers: list[ServerEndpoint]) -> None:
    missing = [key for key in SHARD_KEYS if key not in shard]
    if missing:
        raise ConfigError(f"shard record lacks {', '.join(missing)}: {shard!r}",
                          hint="pass one element of plan_shards()'s list")
    if not Path(shard["input_path"]).is_file():
        raise ConfigError("the shard's prompts file does not exist on this worker", path=str(shard["input_path"]),
                          shard=int(shard["shard_id"]), hint="put the prompts on storage every worker can read")
    if not servers:
        raise ConfigError("no servers to generate with", shard=int(shard["shard_id"]),
                          hint="check that wait_ready returned at least one server")
    names = [server.name for server in servers]
    if len(set(names)) != len(names):
        raise ConfigError(f"server names repeat: {names}", hint='name each server "host:port"')
