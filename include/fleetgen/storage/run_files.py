"""The small files a run's tasks share while they run (heartbeats, server health, lost tries), wherever the run lives.

Two kinds of run folder give the same few operations, each a whole file at a time, named relative to the run:

- ``LocalRunFiles``: a folder on a disk every worker sees; a write goes to a temporary file renamed over the old
  one, a read-modify-write holds ``flock`` on the name with the suffix ``.lock`` (``servers-health.lock``);
- ``ObjectRunFiles``: a prefix of an object store (``storage/objects.py``); a write is one PUT (atomic), a
  read-modify-write replaces only the version it read (``If-Match``; ``If-None-Match: *`` for a new file) and
  tries again when another writer came first. A file's time is the store's ``Last-Modified``.

Both are tested the same way (tests/unit/storage/test_run_files.py). docs/object-storage.md §4.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import ObjectMissing, StoreConflict
from fleetgen.storage.objects import ObjectStore

# A read-modify-write that keeps losing to other writers gives up after this many rounds.
UPDATE_ROUNDS = 20


@dataclass(frozen=True)
class Stamped:
    """A file's bytes, its time (seconds since the epoch, by the clock of whatever stamped it) and version."""

    data: bytes
    time: float
    version: str


class LocalRunFiles:
    """The run's folder ``root`` on a shared disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def where(self, name: str) -> str:
        return str(self.root / name)

    def read(self, name: str) -> Stamped | None:
        path = self.root / name
        try:
            with path.open("rb") as handle:
                stat = os.fstat(handle.fileno())
                return Stamped(handle.read(), stat.st_mtime, f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def version(self, name: str) -> str | None:
        """Cheaper than ``read``: what changes whenever the file does (one ``stat``)."""
        try:
            stat = os.stat(self.root / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"

    def write(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)

    def create(self, name: str, data: bytes) -> bool:
        """Write the file whole only if there is none yet (a hard link of a finished file, so no reader sees it half
        written); False when another writer was first."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")  # one per writer, threads included
        partial.write_bytes(data)
        try:
            os.link(partial, path)
            return True
        except FileExistsError:
            return False
        finally:
            partial.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def names(self, folder: str, suffix: str) -> list[str]:
        """The files of ``folder`` whose names end with ``suffix``, in name order."""
        return sorted(f"{folder}/{path.name}" for path in (self.root / folder).glob(f"*{suffix}"))

    def update(self, name: str, change: Callable[[bytes | None], bytes]) -> None:
        """Replace the file with ``change(its bytes, or None)``, no other writer in between."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            current = self.read(name)
            self.write(name, change(current.data if current is not None else None))


class ObjectRunFiles:
    """The run's prefix ``store`` of an object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def where(self, name: str) -> str:
        return self.store.url(name)

    def read(self, name: str) -> Stamped | None:
        try:
            data, info = self.store.get_with_info(name)
        except ObjectMissing:
            return None
        return Stamped(data, info.modified, info.etag)

    def version(self, name: str) -> str | None:
        info = self.store.head(name)
        return info.etag if info is not None else None

    def write(self, name: str, data: bytes) -> None:
        self.store.put(name, data)

    def create(self, name: str, data: bytes) -> bool:
        try:
            self.store.put(name, data, if_absent=True)
            return True
        except StoreConflict:
            return False

    def delete(self, name: str) -> None:
        self.store.delete(name)

    def names(self, folder: str, suffix: str) -> list[str]:
        return [info.name for info in self.store.iter_objects(folder + "/")
                if info.name.endswith(suffix) and "/" not in info.name[len(folder) + 1:]]

    def update(self, name: str, change: Callable[[bytes | None], bytes]) -> None:
        for _ in range(UPDATE_ROUNDS):
            current = self.read(name)
            data = change(current.data if current is not None else None)
            try:
                if current is None:
                    self.store.put(name, data, if_absent=True)
                else:
                    self.store.put(name, data, if_match=current.version)
                return
            except StoreConflict:
                continue  # another writer came first: read its version and apply the change to it
        raise StoreConflict(f"could not update the object: {UPDATE_ROUNDS} other writers changed it first",
                            path=self.store.url(name), conn_id=self.store.conn_id,
                            hint="too many tasks of the run write this object at once")


RunFiles = LocalRunFiles | ObjectRunFiles


def run_files(run) -> RunFiles:
    """The shared files of ``run``: given as such, or a run folder (a ``RunLayout`` or a path) on a shared disk."""
    from fleetgen.outputs import RunLayout

    if isinstance(run, (LocalRunFiles, ObjectRunFiles)):
        return run
    return LocalRunFiles(run.root if isinstance(run, RunLayout) else Path(run))
