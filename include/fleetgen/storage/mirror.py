"""A run on an object store, mirrored into one task's private scratch folder (docs/object-storage.md §6).

The stages read and write a run's folder with plain file operations (``outputs.RunLayout``). A task of a run whose
``output_root`` is an ``s3://`` URL runs them on a scratch copy of the output root instead:

- **open**: the run's small files (everything under its prefix but the folders in ``SKIPPED`` and the per-shard
  folders the task does not ask for) and the output root's own files (``outputs.ROOT_FILES``) are downloaded; each
  one's ETag and bytes are kept as its *base*;
- the task runs on the scratch folder, worker-local and its own;
- **sync** (when the task fails too: what it wrote is not lost): every file the task created, changed or deleted
  goes back. A file nobody changed meanwhile is replaced with ``If-Match`` on its base's ETag (a new one is created
  with ``If-None-Match: *``; a file of ``WRITTEN_WHOLE``, which one task writes whole and no task reads back, is
  uploaded over whatever is there). When another task wrote it first, the two are merged the way the file is written:
  a JSONL file the task only appended to gets the appended lines added to the store's version; a JSON object gets
  the keys the task added, changed or removed applied to the store's version (where both changed a key, the
  store's value stands: the first writer wins); anything else raises ``StoreConflict`` naming the object;
- files the task reads but must not send back (the shards' committed records, the prompts) are written with
  ``write_derived`` / ``fetch_prompts``;
- **close**: the scratch folder is removed.

A shard's own output never goes through here: it is committed by ``generate/object_store.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fleetgen.errors import ObjectMissing, StoreConflict
from fleetgen.outputs import ROOT_FILES, SHARD_KINDS, ShardPaths
from fleetgen.storage.objects import ObjectStore
from fleetgen.storage.run_files import UPDATE_ROUNDS

# Folders of a run no task reads back as files: the shards' commit logs and heartbeats (read through the store),
# and what only the report writes and people read (the Parquet dataset, the Batch API files, the Data Docs).
SKIPPED = ("shards/", "dataset/", "batch/", "validation/data_docs/")
# Files one task writes whole and no task of the run reads back: a retry's upload replaces them (the report's
# outputs, and the reuse index built once validation passed, generate/reuse.py).
WRITTEN_WHOLE = ("dataset/", "batch/", "validation/data_docs/", "reuse/index")
# But the tries each shard found dead (``shards/shard-NNNNN.lost.jsonl``, generate/liveness.py): the report reads them.
LOST_TRIES = re.compile(rf"shards/shard-\d+\.{re.escape(ShardPaths.LOST_TRIES)}")
# Small files downloaded side by side.
DOWNLOAD_PARALLELISM = 8


@dataclass(frozen=True)
class _Base:
    """What a file was when the task's mirror was opened: None for a file that was not there."""

    etag: str | None
    data: bytes | None


def is_plain_name(name: str) -> bool:
    """Whether ``name`` (an object's name below the output root) is relative and climbs nowhere: a key of the store
    such as ``../x`` or ``./x`` names no file of the copy."""
    parts = name.split("/")
    return bool(name) and all(part not in ("", ".", "..") for part in parts)


def _write_chunks(path: Path, chunks: Iterable[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
    return path


def _is_scratch_only(name: str) -> bool:
    """Locks and half-written temporaries of the file code: they mean nothing to another worker."""
    base = PurePosixPath(name).name
    return base.startswith(".") or base.endswith((".lock", ".partial", ".tmp"))


class RunMirror:
    """The output root ``store`` mirrored into ``scratch`` for the run folder ``run_folder``."""

    def __init__(self, store: ObjectStore, run_folder: str, scratch: Path) -> None:
        self.store = store
        self.run_folder = run_folder
        self.scratch = Path(scratch)
        self._bases: dict[str, _Base] = {}  # by name relative to the output root
        self._derived: set[str] = set()

    @property
    def run_root(self) -> Path:
        return self.scratch / self.run_folder

    @classmethod
    def open(cls, store: ObjectStore, run_folder: str, scratch: Path, *, folders: Iterable[str] = ()) -> RunMirror:
        """Download the run's small files into ``scratch`` (an empty folder, made if need be); ``folders``: the per-shard
        folders (``outputs.SHARD_KINDS``, e.g. ``gpu``) the task reads as plain objects."""
        mirror = cls(store, run_folder, scratch)
        wanted = set(folders)
        skipped = SKIPPED + tuple(f"{kind}/" for kind in SHARD_KINDS if kind not in wanted)
        relative = [info.name[len(run_folder) + 1:] for info in store.iter_objects(run_folder + "/")]
        names = [f"{run_folder}/{name}" for name in relative
                 if not name.startswith(skipped) or LOST_TRIES.fullmatch(name)]
        mirror.run_root.mkdir(parents=True, exist_ok=True)  # and the scratch folder: it may exist, empty
        with ThreadPoolExecutor(DOWNLOAD_PARALLELISM) as pool:
            for name, base in pool.map(mirror._download, [*ROOT_FILES, *names]):
                if base is not None:
                    mirror._bases[name] = base
        return mirror

    def _download(self, name: str) -> tuple[str, _Base | None]:
        try:
            data, info = self.store.get_with_info(name)
        except ObjectMissing:  # a root file no run wrote yet, or an object deleted since the listing
            return name, None
        path = self.scratch / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return name, _Base(info.etag, data)

    def write_derived(self, name: str, chunks: Iterable[bytes]) -> Path:
        """Write ``name`` (relative to the run's folder) from ``chunks`` for the task to read; never sent back."""
        relative = f"{self.run_folder}/{name}"
        self._derived.add(relative)
        return _write_chunks(self.scratch / relative, chunks)

    def copy_read_only(self, names: Iterable[str]) -> list[str]:
        """Download ``names`` (relative to the output root: files of the root's other runs) for the task to read, never
        to be sent back; the names found, in the order given (a missing object is left out)."""
        names = [self._read_only(name) for name in names]
        with ThreadPoolExecutor(DOWNLOAD_PARALLELISM) as pool:
            return [name for name, base in pool.map(self._download, names) if base is not None]

    def write_read_only(self, name: str, chunks: Iterable[bytes]) -> Path:
        """Write ``name`` (relative to the output root: a file of another run) from ``chunks``; never sent back."""
        return _write_chunks(self.scratch / self._read_only(name), chunks)

    def _read_only(self, name: str) -> str:
        """``name``, refused when it is a file the mirror sends back (the run's own or a root file) or would lie
        outside the copy."""
        if name in ROOT_FILES or name.startswith(self.run_folder + "/"):
            raise ValueError(f"{name} is a file of the mirrored run, not a read-only copy")
        if not is_plain_name(name):
            raise ValueError(f"{name!r} is not a plain relative name")
        return name

    def _local_names(self) -> set[str]:
        names = set()
        for folder, _, files in os.walk(self.scratch):
            for file in files:
                name = Path(folder, file).relative_to(self.scratch).as_posix()
                if not _is_scratch_only(name) and name not in self._derived and (
                        name in ROOT_FILES or name.startswith(self.run_folder + "/")):
                    names.add(name)
        return names

    def changes(self) -> list[str]:
        """The names the task created, changed or deleted, in name order."""
        local = self._local_names()
        changed = [name for name in local
                   if name not in self._bases or (self.scratch / name).read_bytes() != self._bases[name].data]
        return sorted(changed + [name for name in self._bases if name not in local])

    def sync(self) -> list[str]:
        """Send every change back (see the module doc); returns the names sent. A file merged with another task's
        version is rewritten in scratch as sent, so that a later sync starts from what the store holds."""
        sent = self.changes()
        for name in sent:
            path = self.scratch / name
            if not path.exists():
                self.store.delete(name)
                del self._bases[name]
                continue
            if name[len(self.run_folder) + 1:].startswith(WRITTEN_WHOLE):
                self.store.upload(name, path)
                self._derived.add(name)  # sent once: a later sync sends it only if written again
                continue
            etag, data = self._send(name, path.read_bytes())
            if data != path.read_bytes():
                path.write_bytes(data)
            self._bases[name] = _Base(etag, data)
        return sent

    def _send(self, name: str, data: bytes) -> tuple[str, bytes]:
        """Write ``data`` over the base of ``name``, merged with what another writer put there meanwhile; returns
        the ETag and the bytes written."""
        base = self._bases.get(name)
        ours = data
        etag = base.etag if base is not None else None  # None: create it
        for _ in range(UPDATE_ROUNDS):
            try:
                if etag is None:
                    return self.store.put(name, data, if_absent=True), data
                return self.store.put(name, data, if_match=etag), data
            except StoreConflict:
                pass
            try:
                current, info = self.store.get_with_info(name)
            except ObjectMissing:  # deleted in between: create it
                etag, data = None, ours
                continue
            data = merge(name, base.data if base is not None else None, ours, current,
                         where=self.store.url(name), conn_id=self.store.conn_id)
            etag = info.etag
        raise StoreConflict(f"could not write the object back: {UPDATE_ROUNDS} other writers changed it first",
                            path=self.store.url(name), conn_id=self.store.conn_id,
                            hint="too many tasks of the run write this object at once; clear the task to run it again")

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def merge(name: str, base: bytes | None, ours: bytes, theirs: bytes, *, where: str, conn_id: str) -> bytes:
    """``ours`` (the task's version of a file it read as ``base``) applied to ``theirs`` (what another task wrote
    meanwhile); see the module doc. A change that cannot be merged raises ``StoreConflict`` naming the object."""
    before = base or b""
    if name.endswith(".jsonl") and ours.startswith(before):
        added = ours[len(before):]
        return theirs + (b"\n" if theirs and not theirs.endswith(b"\n") else b"") + added
    if name.endswith(".json"):
        try:
            old, new, current = (json.loads(text) if text else {} for text in (before, ours, theirs))
        except ValueError:
            raise _unmergeable(where, conn_id) from None
        if all(isinstance(value, dict) for value in (old, new, current)):
            merged = dict(current)
            for key in sorted(set(old) | set(new)):
                was, now = old.get(key, _ABSENT), new.get(key, _ABSENT)
                if was == now or current.get(key, _ABSENT) != was:
                    continue  # not ours to change, or changed by the other writer too: theirs stands
                if now is _ABSENT:
                    del merged[key]
                else:
                    merged[key] = now
            return (json.dumps(merged, indent=1, sort_keys=True) + "\n").encode()
    raise _unmergeable(where, conn_id)


def _unmergeable(where: str, conn_id: str) -> StoreConflict:
    return StoreConflict("another task wrote this object while this task changed it, and the two cannot be merged",
                         path=where, conn_id=conn_id, hint="clear the task to run it again on the object as it is now")


# A key missing from one version (a value of None is a value)
_ABSENT = object()
