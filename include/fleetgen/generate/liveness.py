"""Which shards are generating now, told by each try's own heartbeat on the run's shared storage (a shared folder or
an object store: ``storage/run_files.py``; on a store a file's time is its ``Last-Modified``).

Airflow keeps a try "running" until the scheduler's ``task_instance_heartbeat_timeout`` runs out, also
when its worker died; counted as running meanwhile, a dead try would keep half of every server idle.
So each try keeps ``shards/shard-NNNNN.alive``: written when it starts, its mtime advanced every
``HEARTBEAT_INTERVAL_S`` while it generates, removed when it ends. A file whose mtime has not moved for
``STALE_AFTER_S`` belongs to a try that died. The next try of that shard finds it and appends the dead
try's silent interval (its last beat to the new try's start) to ``shards/shard-NNNNN.lost.jsonl``:
the failure record of a killed try, and the dead time the report takes out of the throughput.

The heartbeat also carries what the try is doing: its requests in flight per server and whether it is
draining (no fresh prompts left). ``fleet_share`` reads them back for the other shards: a shard takes its
fair part of each server among the shards still taking prompts, and never more than the room the others
leave (their requests in flight), so a shard arriving does not stack on top of one that has not yet
drained down to its new part, and a draining shard's requests are taken over as they finish.

Each beat also carries its number (``beat``). A reader judges another try's heartbeat live when its file
moved within ``STALE_AFTER_S`` by the reader's clock, *or* its beat number advanced within ``STALE_AFTER_S``
as seen on the reader's own monotonic clock: the second rule needs no agreement between the clocks, so a
worker whose clock (or the storage's, which stamps the file) is off by more than ``STALE_AFTER_S`` still
holds its room instead of being counted dead and over-admitted beside; that case is logged as a warning
naming both workers and the skew. A heartbeat first seen already stale by its time gets
``FIRST_SIGHT_GRACE_S`` to advance before it stops counting. Whatever its file's time, a heartbeat whose beat
number the reader has watched stand still for ``STALE_AFTER_S`` of its own monotonic clock is dead: the file
of a try that died on a worker whose clock runs ahead would otherwise come into range by time after its death
(for up to twice ``STALE_AFTER_S``) and be counted live again. ``HeartbeatWatch`` keeps what a reader saw.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pathlib import Path

from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout, ShardPaths
from fleetgen.errors import StoreError
from fleetgen.storage.run_files import LocalRunFiles, RunFiles, run_files

HEARTBEAT_INTERVAL_S = 2.0
STALE_AFTER_S = 15.0
FIRST_BEAT_S = 0.5
FIRST_SIGHT_GRACE_S = 2 * HEARTBEAT_INTERVAL_S  # two beats: a live try seen stale by a skewed clock advances by then


def _iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).isoformat(timespec="seconds")


class ShardHeartbeat:
    """The heartbeat of one try of one shard; ``start`` it, ``beat`` it (or ``run`` it), ``stop`` it."""

    def __init__(self, run: RunLayout | RunFiles, shard_id: int, *, try_number: int | None = None) -> None:
        self.shard_id = shard_id
        self.files = run_files(run)
        paths = ShardPaths(RunLayout(Path()), shard_id)
        self.name = paths.name(ShardPaths.HEARTBEAT)
        self.lost_name = paths.name(ShardPaths.LOST_TRIES)
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "try": try_number,
                      "token": uuid.uuid4().hex, "started_at": time.time()}
        self._beats = 0
        self.watch = HeartbeatWatch(shard_id, host=self.owner["host"], pid=self.owner["pid"])  # the others, as seen

    def start(self, *, now: float | None = None, log: logging.Logger | None = None) -> dict | None:
        """Take the shard's heartbeat; returns the record of a dead try found in its place, if any."""
        now = time.time() if now is None else now
        lost = self._previous_dead(now)
        if lost is not None:
            self.files.update(self.lost_name, lambda old: (old or b"") + jsonio.dumps(lost) + b"\n")
            if log is not None:
                log.warning("shard %d: the previous try (%s) stopped heartbeating at %s and never finished; "
                            "%.0f s of this shard's slot were lost before this try resumed it", self.shard_id,
                            f"{lost['host']} pid {lost['pid']}, try {lost['try']}", lost["last_beat"],
                            lost["dead_s"])
        self.owner["started_at"] = now
        self.files.write(self.name, jsonio.dumps(self.owner))
        return lost

    @property
    def path(self) -> Path:
        """Where the heartbeat is (a path on a shared folder, a URL on a store)."""
        return Path(self.files.where(self.name))

    def _previous_dead(self, now: float) -> dict | None:
        found = self.files.read(self.name)
        if found is None:
            return None  # no earlier try, or it ended cleanly
        last_beat = found.time
        try:
            previous = jsonio.loads(found.data)
        except ValueError:
            return None
        return {"shard_id": self.shard_id, "host": previous.get("host"), "pid": previous.get("pid"),
                "try": previous.get("try"), "started_at": _iso(previous.get("started_at", last_beat)),
                "last_beat": _iso(last_beat), "resumed_at": _iso(now), "dead_since_s": last_beat,
                "resumed_s": now, "dead_s": round(max(0.0, now - last_beat), 3)}

    def beat(self, in_flight: dict[str, int] | None = None, draining: bool = False) -> None:
        """Advance the heartbeat, publishing this try's requests in flight per server."""
        self._beats += 1
        self.files.write(self.name, jsonio.dumps({**self.owner, "beat": self._beats, "in_flight": in_flight or {},
                                                  "draining": draining}))

    async def run(self, state: Callable[[], tuple[dict[str, int], bool]] | None = None,
                  interval_s: float = HEARTBEAT_INTERVAL_S, first_s: float = FIRST_BEAT_S) -> None:
        """Beat soon after the shard starts sending (the others wait for its word), then every interval."""
        await asyncio.sleep(first_s)
        while True:
            beat = state() if state else ({}, False)
            if isinstance(self.files, LocalRunFiles):
                self.beat(*beat)
            else:  # a request to the store: off the event loop
                await asyncio.to_thread(self.beat, *beat)
            await asyncio.sleep(interval_s)

    def stop(self) -> None:
        """Remove the heartbeat if it is still this try's (a newer try may have taken the shard over)."""
        try:
            found = self.files.read(self.name)
            if found is not None and jsonio.loads(found.data).get("token") == self.owner["token"]:
                self.files.delete(self.name)
        except (OSError, ValueError, StoreError):
            pass


@dataclass(frozen=True)
class FleetShare:
    """What a shard is told about the others: how many take a share of every server (it included), and
    how many requests the others have in flight on each server."""

    active: int
    others_in_flight: dict[str, int] = field(default_factory=dict)
    others_unpublished: int = 0  # shards that started but have not said yet what they hold

    def cap(self, server: str, fleet_limit: int) -> int:
        """This shard's in-flight limit on a server: its fair part, within the room the others leave. A
        shard that has not published yet may hold the whole limit (it started alone): wait for its word."""
        if self.others_unpublished:
            return 0
        fair = -(-fleet_limit // self.active)
        return max(0, min(fair, fleet_limit - self.others_in_flight.get(server, 0)))


def alone() -> FleetShare:
    """The share of a shard that runs by itself: every server's whole limit."""
    return FleetShare(active=1)


def _live_heartbeats(files: RunFiles, reader: ShardHeartbeat, now: float, seen_at: float, stale_after_s: float,
                     log: logging.Logger | None) -> list[dict]:
    beats = []
    for name in files.names("shards", "." + ShardPaths.HEARTBEAT):
        try:
            found = files.read(name)
            beat = jsonio.loads(found.data) if found is not None else None
        except (OSError, ValueError):  # replaced while we looked
            continue
        if beat is None:  # ended while we looked
            continue
        if beat.get("token") == reader.owner["token"] or reader.watch.is_live(
                name.rsplit("/", 1)[-1], beat, found.time, now=now, seen_at=seen_at, stale_after_s=stale_after_s,
                log=log):
            beats.append(beat)
    return beats


@dataclass
class _Sighting:
    """What a reader saw of another try's heartbeat, on its own monotonic clock."""

    beat: int
    still_since: float  # when its beat number was first seen, or last seen to change
    advanced: bool = False  # its beat number was seen to change
    grace_until: float | None = None  # first seen already stale by its time: counted until then unless it advances
    warned: bool = False  # the clock skew was logged


class HeartbeatWatch:
    """What one try sees of the other tries' heartbeats (by token), and whether each is live (module docstring)."""

    def __init__(self, shard_id: int, *, host: str, pid: int) -> None:
        self.shard_id, self.host, self.pid = shard_id, host, pid  # the reader, named in the clock-skew warning
        self._sightings: dict[str, _Sighting] = {}

    def is_live(self, name: str, beat: dict, mtime: float, *, now: float, seen_at: float, stale_after_s: float,
                log: logging.Logger | None = None) -> bool:
        """Whether the heartbeat ``name`` (its record ``beat``, its file's ``mtime``) is live: by its file's time
        on this machine's wall clock ``now``, or by its beat number advancing on this machine's monotonic clock
        ``seen_at``; never once that number stood still for ``stale_after_s``."""
        offset_s = mtime - now  # how far the clock that stamped the file is ahead of ours, give or take a beat
        by_time = abs(offset_s) <= stale_after_s
        number = beat.get("beat", 0)
        seen = self._sightings.get(beat.get("token"))
        if seen is None:
            seen = self._sightings[beat.get("token")] = _Sighting(
                number, still_since=seen_at, grace_until=None if by_time else seen_at + FIRST_SIGHT_GRACE_S)
        elif seen.beat != number:
            seen.beat, seen.still_since, seen.advanced, seen.grace_until = number, seen_at, True, None
            if not by_time and not seen.warned and log is not None:
                seen.warned = True
                log.warning("shard %d: the heartbeat shards/%s (host %s, pid %s, try %s) is beating, but its file's "
                            "time is %+.0f s off the clock of this worker (host %s, pid %d): the two workers' clocks, "
                            "or the shared storage's, disagree by more than %.0f s. It is counted live by its beats, "
                            "so the fleet is not over-admitted; sync the clocks (NTP) of every worker and of the "
                            "storage", self.shard_id, name, beat.get("host"), beat.get("pid"), beat.get("try"),
                            offset_s, self.host, self.pid, stale_after_s)
        if seen_at - seen.still_since > stale_after_s:
            return False  # its beats stopped: dead, whatever the clock that stamps its file says
        return by_time or seen.advanced or (seen.grace_until is not None and seen_at <= seen.grace_until)


def fleet_share(run: RunLayout | RunFiles, heartbeat: ShardHeartbeat, *, running_in_airflow: int | None = None,
                now: float | None = None, stale_after_s: float = STALE_AFTER_S, seen_at: float | None = None,
                log: logging.Logger | None = None) -> FleetShare:
    """The share of ``heartbeat``'s shard, from the live heartbeats of the run (dead tries' stop counting
    after ``stale_after_s``); ``running_in_airflow``, when known, bounds the count of active shards.

    ``now`` is this machine's wall clock (compared with the files' times), ``seen_at`` its monotonic clock
    (when each heartbeat was seen advancing); ``log`` gets the warning about clocks that disagree."""
    now = time.time() if now is None else now
    seen_at = time.monotonic() if seen_at is None else seen_at
    others = [beat for beat in _live_heartbeats(run_files(run), heartbeat, now, seen_at, stale_after_s, log)
              if beat.get("token") != heartbeat.owner["token"]]
    active = 1 + sum(1 for beat in others if not beat.get("draining"))
    if running_in_airflow is not None:
        active = min(active, max(1, running_in_airflow))
    in_flight: dict[str, int] = {}
    for beat in others:
        for server, count in (beat.get("in_flight") or {}).items():
            in_flight[server] = in_flight.get(server, 0) + int(count)
    unpublished = sum(1 for beat in others if "in_flight" not in beat)
    return FleetShare(active=active, others_in_flight=in_flight, others_unpublished=unpublished)


def lost_tries(run: RunLayout | RunFiles) -> list[dict]:
    """Every dead try the run's shards recorded (``shards/shard-NNNNN.lost.jsonl``)."""
    files = run_files(run)
    records = []
    for name in files.names("shards", "." + ShardPaths.LOST_TRIES):
        found = files.read(name)
        if found is not None:
            records.extend(jsonio.loads(line) for line in found.data.splitlines() if line.strip())
    return records


def dead_seconds(lost: list[dict], start: float | None, end: float | None) -> float:
    """Seconds of [start, end] during which at least one dead try held a shard (overlaps counted once)."""
    if start is None or end is None:
        return 0.0
    spans = sorted((max(start, r["dead_since_s"]), min(end, r["resumed_s"])) for r in lost)
    total, covered_to = 0.0, start
    for begin, finish in spans:
        begin = max(begin, covered_to)
        if finish > begin:
            total += finish - begin
            covered_to = finish
    return total
