"""Earlier runs on an object store as reuse sources (generate/reuse.py does the same on a disk; docs/shards.md §8).

A run on a store keeps, per completion, a reuse row among its committed parts (``reuse``, generate/object_store.py):
its prompt's hash and where the line lies in the shard's committed completions read as one stream. Once its
validation passed, ``report`` compacts them into ``reuse/index.npy`` and ``index.json`` (``write_reuse_index`` on the
task's copy of the run, uploaded whole). A later run finds it here: the runs below the output root, each with an
``index.json`` for the same generation material, the newest that passed its validation first. Its index is
downloaded (size and SHA-256 checked) and memory-mapped; a line is read from the part of the source's commit log
that holds it, the last parts read kept in memory, since a shard's prompts are looked up in file order.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from fleetgen.errors import ObjectMissing, StoreError
from fleetgen.generate.commit_log import CommitLog, Part
from fleetgen.generate.reuse import Candidate, ReuseLookup, ReuseSource, SourceUnusable, choose_source
from fleetgen.outputs import RunLayout
from fleetgen.storage.objects import ObjectStore
from fleetgen.validation.outcome import why_not_passed

# Parts of a source's completions held in memory at once (each at most CommitBounds.bytes).
PARTS_KEPT = 2
_INDEX_META = RunLayout(Path()).reuse_index_meta.as_posix()
_INDEX = RunLayout(Path()).reuse_index.as_posix()
_SUMMARY = RunLayout(Path()).validation_summary.as_posix()


@dataclass
class StoreReuseSource(ReuseSource):
    """``ReuseSource`` whose completion lines are read from the source run's committed parts on the store."""

    run_store: ObjectStore | None = None
    _parts: dict = field(default_factory=dict)  # shard -> [(start in the stream, Part)]
    _kept: OrderedDict = field(default_factory=OrderedDict)  # part name -> bytes
    _unreadable: set = field(default_factory=set)

    def read_line(self, shard: int, offset: int, length: int) -> bytes | None:
        try:
            for start, part in self._parts_of(shard):
                if start <= offset and offset + length <= start + part.size:
                    data = self._part(part)
                    return data[offset - start:offset - start + length]
        except StoreError as exc:
            if shard not in self._unreadable and self.log is not None:
                self.log.warning("reuse: cannot read shard %d of run %s (%s): its completions are generated again",
                                 shard, self.run_folder, exc.message)
            self._unreadable.add(shard)
        return None

    def _parts_of(self, shard: int) -> list[tuple[int, Part]]:
        if shard not in self._parts:
            stream, start = [], 0
            for part in CommitLog(self.run_store, shard).read().parts["completions"]:
                stream.append((start, part))
                start += part.size
            self._parts[shard] = stream
        return self._parts[shard]

    def _part(self, part: Part) -> bytes:
        if part.name in self._kept:
            self._kept.move_to_end(part.name)
        else:
            self._kept[part.name] = self.run_store.get(part.name)
            while len(self._kept) > PARTS_KEPT:
                self._kept.popitem(last=False)
        return self._kept[part.name]

    def close(self) -> None:
        self._kept.clear()


def look_up_reuse_on_store(root: ObjectStore, current_run_folder: str, material: dict, scratch: Path,
                           log: logging.Logger | None = None) -> ReuseLookup:
    """``look_up_reuse`` for the runs below the output root ``root`` on a store; ``scratch``: where a chosen source's
    index is downloaded."""
    candidates, skipped = [], []
    for run in root.folders():
        if run == current_run_folder:
            continue
        try:
            data, info = root.get_with_info(f"{run}/{_INDEX_META}")
        except ObjectMissing:
            continue
        try:
            meta = json.loads(data)
            candidates.append(Candidate(run, meta, float(meta.get("written_at") or info.modified)))
        except (ValueError, TypeError, AttributeError) as exc:
            skipped.append({"run": run, "reason": f"cannot read {root.url(f'{run}/{_INDEX_META}')}: {exc}"})

    def not_passed(run: str) -> str | None:
        where = root.url(f"{run}/{_SUMMARY}")
        try:
            summary = json.loads(root.get(f"{run}/{_SUMMARY}"))
        except (ObjectMissing, ValueError):
            return why_not_passed(where, None)
        return why_not_passed(where, summary if isinstance(summary, dict) else None)

    def open_source(run: str, meta: dict) -> StoreReuseSource:
        local = RunLayout(scratch / run)
        local.reuse_index.parent.mkdir(parents=True, exist_ok=True)
        try:
            with local.reuse_index.open("wb") as handle:
                root.download(f"{run}/{_INDEX}", handle)
        except StoreError as exc:
            raise SourceUnusable(f"cannot read {root.url(f'{run}/{_INDEX}')}: {exc.message}") from None
        checked = ReuseSource.open(local.root, meta)  # the downloaded index whole: its size and SHA-256 as recorded
        return StoreReuseSource(layout=checked.layout, index=checked.index, run_folder=run, log=log,
                                run_store=root.below(run))

    return choose_source(candidates, material, skipped=skipped, not_passed=not_passed, open_source=open_source,
                         log=log)
