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
made or applied for that server. Writers change it by a read-modify-write that no other writer can come between
(``storage/run_files.py``: ``flock`` on ``servers-health.lock`` on a shared folder, a write that replaces only the
version read on an object store), and a reader always sees a whole file;
a missing or unreadable file reads as "nothing known" and generation goes on with each shard's own
view. Shards keep re-checking a server marked down with their own backoff; the first that finds it
back (health and one trial request) marks it up for all.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

from fleetgen.errors import StoreError
from fleetgen.generate import jsonio
from fleetgen.outputs import RunLayout
from fleetgen.storage.run_files import LocalRunFiles, RunFiles, run_files

# On an object store the file is looked at this often from a thread of its own, not from the dispatch loop.
STORE_POLL_S = 0.5
# How long closing waits for the store's writer to record the transitions published last.
CLOSE_WAIT_S = 30.0

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

    def __init__(self, run: str | os.PathLike | RunFiles, *, who: str, log: logging.Logger) -> None:
        self.files = run_files(run)
        self.name = RunLayout.SERVERS_HEALTH
        self.path = self.files.where(self.name)
        self.who = who
        self.log = log
        self._seen: str | None = None  # the version of the file last read
        self._warned = False
        self._polled: dict[str, HealthEntry] | None = None  # what the store's poller found changed, not yet taken
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._writes: queue.SimpleQueue | None = None  # on a store: transitions for the writer thread, in order
        self._writer: threading.Thread | None = None
        if not isinstance(self.files, LocalRunFiles):
            self._poller = threading.Thread(target=self._poll, name="servers-health", daemon=True)
            self._poller.start()
            self._writes = queue.SimpleQueue()
            self._writer = threading.Thread(target=self._write_queued, name="servers-health-writer", daemon=True)
            self._writer.start()

    def publish(self, server: str, state: str, reason: str, *, hung: bool = False) -> float:
        """Record a transition this shard observed; returns its ``at``. A failure to write is logged
        and ignored: the shard goes on with its own view. On an object store the write (a read-modify-write of
        a few requests) is handed to a thread of its own, in order: the dispatch loop does not wait on it."""
        at = time.time()
        entry = {"state": state, "at": at, "reason": reason, "by": self.who, **({"hung": True} if hung else {})}
        if self._writes is not None:
            self._writes.put((server, entry))
        else:
            self._write(server, entry)
        return at

    def _write(self, server: str, entry: dict) -> None:
        def change(old: bytes | None) -> bytes:
            servers = self._servers(old)
            servers[server] = entry
            return jsonio.dumps({"servers": servers})

        try:
            self.files.update(self.name, change)
        except (OSError, StoreError) as exc:
            self.log.warning("%s: could not record server %s as %s in %s (%s); other shards will find out "
                             "for themselves", self.who, server, entry["state"], self.path, exc)

    def _write_queued(self) -> None:
        while (item := self._writes.get()) is not None:
            self._write(*item)

    def changed_entries(self) -> dict[str, HealthEntry] | None:
        """Every server's latest entry if the file changed since the last call, else None."""
        if self._poller is not None:
            with self._poll_lock:
                polled, self._polled = self._polled, None
            return polled
        return self._look()

    def _look(self) -> dict[str, HealthEntry] | None:
        try:
            version = self.files.version(self.name)
        except (OSError, StoreError):
            return None
        if version is None or version == self._seen:
            return None
        found = self.files.read(self.name)
        if found is None:
            return None
        self._seen = found.version
        entries = {}
        for server, data in self._servers(found.data).items():
            try:
                entries[server] = HealthEntry.from_json(data)
            except (KeyError, TypeError, ValueError):
                continue  # one bad entry does not hide the others
        return entries

    def _poll(self) -> None:
        while not self._stop.wait(STORE_POLL_S):
            try:
                entries = self._look()
            except (OSError, StoreError):
                continue
            if entries is not None:
                with self._poll_lock:
                    self._polled = entries

    def close(self) -> None:
        """Stop the store's poller, and its writer once it wrote what was published (nothing to do on a shared
        folder)."""
        self._stop.set()
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join(timeout=CLOSE_WAIT_S)

    def _servers(self, data: bytes | None) -> dict:
        if data is None:
            return {}
        try:
            servers = jsonio.loads(data).get("servers", {})
            if not isinstance(servers, dict):
                raise ValueError("servers is not an object")
            return servers
        except (ValueError, AttributeError) as exc:
            if not self._warned:
                self._warned = True
                self.log.warning("%s: ignoring an unreadable %s (%s); it is rewritten at the next change",
                                 self.who, self.path, exc)
            return {}
