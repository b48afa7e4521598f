"""An exclusive lease on one shard's output, so that two live tries of a shard never both append.

Airflow can start a retry of a shard while the previous try still runs: a task the scheduler gave
up on (lost heartbeat, a "zombie") keeps its process, and both would append the same prompts.

Two files under ``shards/`` make the lease (``fleetgen.outputs`` names them; docs/shards.md §1):

- ``shard-NNNNN.lock``: held with ``flock(LOCK_EX)`` for as long as a try has the output open. The
  kernel releases it when the process dies, however it dies, so a crashed try never blocks a retry.
- ``shard-NNNNN.lease.json``: who holds or has claimed the output (``try``, ``pid``, ``host``,
  ``since``), replaced atomically by each new claimant. Before a write the holder checks that the
  file is still its own (one ``stat``, at most every ``CHECK_INTERVAL_S``, 10 ms); once a newer try
  has claimed it, the holder stops with ``ShardLeaseLost`` and releases the lock as it closes.

A new try whose lock is busy does not wait for an old try that may never finish: it *takes over*.
It claims the lease file at once (so the old try stops at its next write or progress save, within
about a second while its event loop runs) and then waits at most ``wait_s`` for the lock. Only
after the lock is free does it read and repair the output. An old try that is frozen (stopped, or
stuck without running its loop) keeps the lock: the new try then fails with ``ShardLeaseBusy``
naming both tries, and the frozen one, if it ever runs again, stops before its next write because
the lease is no longer its own. The lock is what makes writes exclusive; the lease file only tells
the old try to stop early.
"""

from __future__ import annotations

import errno as errno_codes
import fcntl
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import ShardLeaseBusy, ShardLeaseLost
from fleetgen.generate import jsonio
from fleetgen.generate.records import utc_now
from fleetgen.outputs import RunLayout

LOCK_POLL_S = 0.1
# The lease file is looked at (one stat) at most this often: cheap beside a request, and a stale try
# writing a few more lines before it stops is harmless, since the new try opens nothing before the lock.
CHECK_INTERVAL_S = 0.01


@dataclass(frozen=True)
class LeaseHolder:
    """One try of a shard: Airflow's try number (None outside Airflow), process and host."""

    try_number: int | None
    pid: int
    host: str
    since: str

    @classmethod
    def this_process(cls, try_number: int | None) -> "LeaseHolder":
        return cls(try_number=try_number, pid=os.getpid(), host=socket.gethostname(), since=utc_now())

    @classmethod
    def from_file(cls, path: Path) -> "LeaseHolder | None":
        """The holder recorded in ``path``; None when it is missing or unreadable (tolerant read)."""
        try:
            data = jsonio.loads(path.read_bytes())
            return cls(try_number=data.get("try"), pid=int(data["pid"]), host=str(data["host"]),
                       since=str(data.get("since", "?")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        who = f"try {self.try_number}" if self.try_number is not None else "a try"
        return f"{who} (pid {self.pid} on {self.host}, since {self.since})"

    def to_json(self) -> bytes:
        return jsonio.dumps({"try": self.try_number, "pid": self.pid, "host": self.host, "since": self.since})


class ShardLease:
    """Acquire with ``ShardLease.acquire``; ``check()`` before every write; ``release()`` last."""

    def __init__(self, root: Path, shard_id: int, holder: LeaseHolder) -> None:
        self.shard_id = shard_id
        self.holder = holder
        layout = RunLayout(root)
        self.lock_path = layout.shard(shard_id).lock
        self.lease_path = layout.shard(shard_id).lease
        self._lock_fd: int | None = None
        self._lease_fd: int | None = None  # keeps our lease file's inode from being reused
        self._lease_ino: int | None = None
        self._checked_at = 0.0  # monotonic time of the last look at the lease file

    @classmethod
    def acquire(cls, root: str | os.PathLike, shard_id: int, *, try_number: int | None, wait_s: float,
                log: logging.Logger | None = None) -> "ShardLease":
        """The lease on shard ``shard_id`` of the run whose output folder is ``root``."""
        lease = cls(Path(root), shard_id, LeaseHolder.this_process(try_number))
        lease.lock_path.parent.mkdir(parents=True, exist_ok=True)
        lease._lock_fd = os.open(lease.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not lease._try_lock():
                lease._take_over(wait_s, log)
            else:
                lease._claim()
        except BaseException:
            lease.release()
            raise
        return lease

    def _try_lock(self) -> bool:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno_codes.EWOULDBLOCK, errno_codes.EAGAIN):
                return False
            raise
        return True

    def _take_over(self, wait_s: float, log: logging.Logger | None) -> None:
        previous = LeaseHolder.from_file(self.lease_path)
        old = previous.describe() if previous is not None else "another try (its lease file is unreadable)"
        self._claim()  # the old try sees this at its next write and stops
        if log is not None:
            log.warning("shard %d: %s still holds the shard's output; %s takes it over and waits up to %.0f s "
                        "for it to stop", self.shard_id, old, self.holder.describe(), wait_s)
        deadline = time.monotonic() + wait_s
        while not self._try_lock():
            if time.monotonic() >= deadline:
                raise ShardLeaseBusy(
                    f"{old} still holds the output lock {self.lock_path} after {wait_s:.0f} s; "
                    f"{self.holder.describe()} has claimed the lease, so the old try stops before its next write "
                    "if it ever runs again",
                    shard=self.shard_id, path=str(self.lock_path),
                    hint=f"the old try is frozen or stuck (no progress save for {wait_s:.0f} s): if pid "
                         f"{previous.pid if previous else '?'} on {previous.host if previous else '?'} is a task that "
                         "Airflow gave up on, kill it; a retry of this task then resumes from the output on disk")
            time.sleep(LOCK_POLL_S)
        self.check(now=True)  # a third try may have claimed it meanwhile: then it is theirs
        if log is not None:
            log.warning("shard %d: took the output over from %s", self.shard_id, old)

    def _claim(self) -> None:
        partial = self.lease_path.with_name(f"{self.lease_path.name}.{self.holder.pid}.partial")
        partial.write_bytes(self.holder.to_json())
        fd = os.open(partial, os.O_RDONLY)
        os.replace(partial, self.lease_path)
        if self._lease_fd is not None:
            os.close(self._lease_fd)
        self._lease_fd = fd
        self._lease_ino = os.fstat(fd).st_ino

    def check(self, *, now: bool = False) -> None:
        """Raise ``ShardLeaseLost`` if a newer try has claimed the output since we took it (looked at
        no more than every ``CHECK_INTERVAL_S`` unless ``now``)."""
        if not now and self._lease_fd is not None:
            checked_at = time.monotonic()
            if checked_at - self._checked_at < CHECK_INTERVAL_S:
                return
            self._checked_at = checked_at
        try:
            current = os.stat(self.lease_path).st_ino
        except FileNotFoundError:
            current = None
        if self._lease_fd is not None and current == self._lease_ino:
            return
        newer = LeaseHolder.from_file(self.lease_path)
        raise ShardLeaseLost(
            f"{newer.describe() if newer else 'another try'} took this shard's output over; "
            f"{self.holder.describe()} stops here without writing more",
            shard=self.shard_id, path=str(self.lease_path),
            hint="two tries of this shard ran at once (Airflow started a retry while this one was still alive); "
                 "nothing to do: the newer try resumes from the output on disk")

    def release(self) -> None:
        for name in ("_lease_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)  # closing the lock's only descriptor releases the flock
