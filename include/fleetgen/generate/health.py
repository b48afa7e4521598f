"""Server health shared by the running shards of one run: a server one shard found down is skipped
by all of them until it is re-checked.

Without it every shard finds out for itself: a shard that starts after a server hung sends it a
full share of requests and waits for its own stall check (``stall_check_s`` + ``health_timeout_s``)
before routing around it, and so does every later shard.

The state is one small JSON file in the run's output folder, ``servers-health.json``
(``fleetgen.outputs.RunLayout.servers_health``; docs/shards.md §2)::

    {"servers": {"host:port": {"state": "down", "at": 1764500000.123, "hung": true,
                               "reason": "stalled: no answer for 61 s ...", "by": "shard 3 (try 1)"}}}

``hung`` marks a server that stopped answering with requests in flight: what any shard holds there
will never return, so each shard abandons those requests at once instead of waiting them out.

``at`` is wall-clock time (shards may run on several workers that share the output folder), and a
newer ``at`` wins: each shard applies an entry only if it is newer than the last transition it
made or applied for that server. Writers take ``flock`` on ``servers-health.lock`` for their
read-modify-write and replace the file atomically, so readers (who take no lock) see a whole file;
a missing or unreadable file reads as "nothing known" and generation goes on with each shard's own
view. Shards keep re-checking a server marked down with their own backoff; the first that finds it
back (health and one trial request) marks it up for all.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout

DOWN, UP = "down", "up"


@dataclass(frozen=True)
class HealthEntry:
    state: str  # DOWN or UP
    at: float  # wall-clock time of the transition
    reason: str
    by: str  # which shard (and try) saw it
    hung: bool = False  # down because it stopped answering: requests held there never return

    @classmethod
    def from_json(cls, data: dict) -> "HealthEntry":
        state = data["state"]
        if state not in (DOWN, UP):
            raise ValueError(f"unknown state {state!r}")
        return cls(state=state, at=float(data["at"]), reason=str(data.get("reason", "")), by=str(data.get("by", "?")),
                   hung=data.get("hung") is True)


class SharedHealth:
    """The run's shared server-health file, as seen by one shard (``who``)."""

    def __init__(self, run_dir: str | os.PathLike, *, who: str, log: logging.Logger) -> None:
        layout = RunLayout(Path(run_dir))
        self.path = layout.servers_health
        self.lock_path = layout.servers_health_lock
        self.who = who
        self.log = log
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) of the last file read
        self._warned = False

    def publish(self, server: str, state: str, reason: str, *, hung: bool = False) -> float:
        """Record a transition this shard observed; returns its ``at``. A failure to write is logged
        and ignored: the shard goes on with its own view."""
        at = time.time()
        entry = {"state": state, "at": at, "reason": reason, "by": self.who, **({"hung": True} if hung else {})}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.lock_path, "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                servers = self._read()
                servers[server] = entry
                partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
                partial.write_bytes(jsonio.dumps({"servers": servers}))
                os.replace(partial, self.path)
        except OSError as exc:
            self.log.warning("%s: could not record server %s as %s in %s (%s); other shards will find out "
                             "for themselves", self.who, server, state, self.path, exc)
        return at

    def changed_entries(self) -> dict[str, HealthEntry] | None:
        """Every server's latest entry if the file changed since the last call, else None."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        entries = {}
        for server, data in self._read().items():
            try:
                entries[server] = HealthEntry.from_json(data)
            except (KeyError, TypeError, ValueError):
                continue  # one bad entry does not hide the others
        return entries

    def _read(self) -> dict:
        try:
            servers = jsonio.loads(self.path.read_bytes()).get("servers", {})
            if not isinstance(servers, dict):
                raise ValueError("servers is not an object")
            return servers
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as exc:
            if not self._warned:
                self._warned = True
                self.log.warning("%s: ignoring an unreadable %s (%s); it is rewritten at the next change",
                                 self.who, self.path, exc)
            return {}
