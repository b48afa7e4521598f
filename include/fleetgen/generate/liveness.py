"""Which shards are generating now, told by each try's own heartbeat on the run's shared storage.

Airflow keeps a try "running" until the scheduler's ``task_instance_heartbeat_timeout`` runs out, also
when its worker died; counted as running meanwhile, a dead try would keep half of every server idle.
So each try keeps ``shards/shard-NNNNN.alive``: written when it starts, its mtime advanced every
``HEARTBEAT_INTERVAL_S`` while it generates, removed when it ends. A file whose mtime has not moved for
``STALE_AFTER_S`` belongs to a try that died. The next try of that shard finds it and appends the dead
try's silent interval (its last beat to the new try's start) to ``shards/shard-NNNNN.lost.jsonl``:
the failure record of a killed try, and the dead time the report takes out of the throughput.

mtimes are compared with this machine's clock: workers sharing the storage must keep their clocks
in sync (NTP) to well under ``STALE_AFTER_S``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
import uuid
from pathlib import Path

from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout

HEARTBEAT_INTERVAL_S = 2.0
STALE_AFTER_S = 15.0
ALIVE_SUFFIX = "alive"
LOST_SUFFIX = "lost.jsonl"


def _iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).isoformat(timespec="seconds")


class ShardHeartbeat:
    """The heartbeat of one try of one shard; ``start`` it, ``beat`` it (or ``run`` it), ``stop`` it."""

    def __init__(self, layout: RunLayout, shard_id: int, *, try_number: int | None = None) -> None:
        self.shard_id = shard_id
        self.path = layout.shard_file("shards", shard_id, ALIVE_SUFFIX)
        self.lost_path = layout.shard_file("shards", shard_id, LOST_SUFFIX)
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "try": try_number,
                      "token": uuid.uuid4().hex, "started_at": time.time()}

    def start(self, *, now: float | None = None, log: logging.Logger | None = None) -> dict | None:
        """Take the shard's heartbeat; returns the record of a dead try found in its place, if any."""
        now = time.time() if now is None else now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lost = self._previous_dead(now)
        if lost is not None:
            with self.lost_path.open("ab") as handle:
                handle.write(jsonio.dumps(lost) + b"\n")
            if log is not None:
                log.warning("shard %d: the previous try (%s) stopped heartbeating at %s and never finished; "
                            "%.0f s of this shard's slot were lost before this try resumed it", self.shard_id,
                            f"{lost['host']} pid {lost['pid']}, try {lost['try']}", lost["last_beat"],
                            lost["dead_s"])
        self.owner["started_at"] = now
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_bytes(jsonio.dumps(self.owner))
        os.replace(partial, self.path)
        return lost

    def _previous_dead(self, now: float) -> dict | None:
        try:
            last_beat = self.path.stat().st_mtime
            previous = jsonio.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None  # no earlier try, or it ended cleanly
        return {"shard_id": self.shard_id, "host": previous.get("host"), "pid": previous.get("pid"),
                "try": previous.get("try"), "started_at": _iso(previous.get("started_at", last_beat)),
                "last_beat": _iso(last_beat), "resumed_at": _iso(now), "dead_since_s": last_beat,
                "resumed_s": now, "dead_s": round(max(0.0, now - last_beat), 3)}

    def beat(self) -> None:
        try:
            os.utime(self.path)
        except FileNotFoundError:  # removed under us (a newer try ended): write it again, we still run
            self.path.write_bytes(jsonio.dumps(self.owner))

    async def run(self, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.beat()

    def stop(self) -> None:
        """Remove the heartbeat if it is still this try's (a newer try may have taken the shard over)."""
        try:
            if jsonio.loads(self.path.read_bytes()).get("token") == self.owner["token"]:
                self.path.unlink()
        except (OSError, ValueError):
            pass


def live_shards(layout: RunLayout, *, now: float | None = None, stale_after_s: float = STALE_AFTER_S) -> int:
    """How many shards of the run have a try whose heartbeat advanced within ``stale_after_s``."""
    now = time.time() if now is None else now
    shards_dir = layout.kind_dir("shards")
    count = 0
    for path in shards_dir.glob(f"shard-*.{ALIVE_SUFFIX}"):
        try:
            if now - path.stat().st_mtime <= stale_after_s:
                count += 1
        except FileNotFoundError:  # ended while we looked
            continue
    return count


def lost_tries(layout: RunLayout) -> list[dict]:
    """Every dead try the run's shards recorded (``shards/shard-NNNNN.lost.jsonl``)."""
    records = []
    for path in sorted(layout.kind_dir("shards").glob(f"shard-*.{LOST_SUFFIX}")):
        records.extend(jsonio.loads(line) for line in path.read_bytes().splitlines() if line.strip())
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
