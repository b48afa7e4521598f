"""A shard's output on an object store: immutable parts, and a log of numbered commits that says which count.

Object stores have no append, no rename and no lock, but they create an object only if it is absent
(``If-None-Match: *``), atomically, with reads that see every completed write. That is enough for exactly-once
output (docs/shards.md §8), the way Delta Lake keeps its table log:

    shards/shard-NNNNN.json                       the shard's plan (created once; a retry must match it)
    shards/shard-NNNNN/log/000000000001.json      commit 1, 2, ...: created only if absent, never replaced
    shards/shard-NNNNN/parts/000000000002-<token>.stats.jsonl   the lines a commit made part of the output

- A try writes its lines to *parts* (whole objects, named by the commit they are for and the try's random
  token, so no two tries ever write the same part), then creates the next commit, which names them.
  Parts no commit names are not output: a try that dies between the two leaves only garbage.
- A try starts by reading the log and creating the next commit, an ``open`` commit: its *fence*. From then on
  an older try, however long it was frozen, cannot commit: the number it would create exists. Its next commit
  fails with a conflict and it stops (``ShardLeaseLost``); the lines it had not committed are generated again
  by the new try, which saw exactly the commits before its fence.
- What the shard holds is the replay of its log: the parts of every commit in order; the errors of the last
  ``open`` commit that restated them (a new try keeps only the prompts' own faults, docs/shards.md §6) and of
  every commit after it; the resume mark of the last commit.

This module reads and writes the log and replays it; ``object_store.py`` is the writer a shard uses.
"""

from __future__ import annotations

import collections
import concurrent.futures
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from fleetgen.errors import GenerationError, ObjectMissing, ShardLeaseLost, StoreConflict
from fleetgen.generate import jsonio
from fleetgen.outputs import shard_stem
from fleetgen.storage.objects import ObjectStore

# "reuse": per completion, its prompt's hash and where its line lies in the shard's committed completions (the parts
# of that kind in commit order, read as one stream), for later runs to copy it (generate/reuse_store.py).
RECORD_KINDS = ("completions", "stats", "errors", "reuse")
# What the shard journals beside its records (generate/watch.py): committed in parts of the same commits.
JOURNAL_KINDS = ("events", "metrics")
PART_KINDS = RECORD_KINDS + JOURNAL_KINDS
SEQ_DIGITS = 12
# Commits and parts are read this many at a time when a shard resumes (each is one GET); at most this many are held
# in memory at once, so a resume's memory is bounded by the done ids, not by the committed output.
READ_PARALLELISM = 4


def plan_name(shard_id: int) -> str:
    return f"shards/{shard_stem(shard_id)}.json"


def log_prefix(shard_id: int) -> str:
    return f"shards/{shard_stem(shard_id)}/log/"


def commit_name(shard_id: int, seq: int) -> str:
    return f"{log_prefix(shard_id)}{seq:0{SEQ_DIGITS}d}.json"


def part_name(shard_id: int, seq: int, token: str, kind: str) -> str:
    return f"shards/{shard_stem(shard_id)}/parts/{seq:0{SEQ_DIGITS}d}-{token}.{kind}.jsonl"


@dataclass(frozen=True)
class Part:
    name: str
    lines: int
    size: int

    def to_json(self) -> dict:
        return {"name": self.name, "lines": self.lines, "bytes": self.size}

    @classmethod
    def from_json(cls, data: dict) -> "Part":
        return cls(str(data["name"]), int(data["lines"]), int(data["bytes"]))


@dataclass
class ShardLog:
    """The replay of a shard's log: its parts per kind (in commit order), its mark and its last writer."""

    shard_id: int
    commits: list[dict] = field(default_factory=list)
    parts: dict[str, list[Part]] = field(default_factory=lambda: {kind: [] for kind in PART_KINDS})
    mark: tuple[int, int] | None = None

    @property
    def next_seq(self) -> int:
        return len(self.commits) + 1

    @property
    def last(self) -> dict | None:
        return self.commits[-1] if self.commits else None

    def add(self, commit: dict) -> None:
        self.commits.append(commit)
        parts = commit.get("parts") or {}
        if "errors_base" in commit:  # an open commit that restated the errors that stand
            base = commit["errors_base"]
            self.parts["errors"] = [Part.from_json(base)] if base else []
        for kind in PART_KINDS:
            if kind in parts:
                self.parts[kind].append(Part.from_json(parts[kind]))
        mark = commit.get("mark")
        self.mark = (int(mark[0]), int(mark[1])) if mark else None


def describe_writer(commit: dict | None) -> str:
    """Who made ``commit``: the try, its pid and host."""
    if not commit:
        return "another try"
    by = commit.get("by") or {}
    who = f"try {by['try']}" if by.get("try") is not None else "a try"
    return f"{who} (pid {by.get('pid', '?')} on {by.get('host', '?')}, since {by.get('since', '?')})"


class CommitLog:
    """The log of shard ``shard_id`` in ``store`` (the run's prefix)."""

    def __init__(self, store: ObjectStore, shard_id: int) -> None:
        self.store = store
        self.shard_id = shard_id

    def read(self) -> ShardLog:
        """Every commit, in order. A gap in the numbers means an object of the log was removed by hand."""
        names = [info.name for info in self.store.list(log_prefix(self.shard_id)) if info.name.endswith(".json")]
        log = ShardLog(self.shard_id)
        for seq, (name, raw) in enumerate(zip(names, self._get_all(names)), 1):
            if name != commit_name(self.shard_id, seq):
                raise GenerationError(
                    f"the shard's commit log has a gap: {self.store.url(commit_name(self.shard_id, seq))} is missing "
                    f"but {self.store.url(name)} exists", shard=self.shard_id, path=self.store.url(name),
                    hint="the log is written only by fleetgen and never deleted from: restore the missing commit, "
                         f"or delete every object under {self.store.url(f'shards/{shard_stem(self.shard_id)}/')} "
                         "and the plan to regenerate the shard")
            log.add(self._decode(name, raw))
        return log

    def _get_all(self, names: list[str]) -> Iterator[bytes]:
        return read_in_order(self.store.get, names)

    def _decode(self, name: str, raw: bytes) -> dict:
        try:
            commit = jsonio.loads(raw)
            if not isinstance(commit, dict) or commit.get("kind") not in ("open", "parts"):
                raise ValueError("not a commit record")
            return commit
        except ValueError as exc:
            raise GenerationError(f"unreadable commit record: {exc}", shard=self.shard_id, path=self.store.url(name),
                                  hint="the log is written only by fleetgen: restore the object, or delete the "
                                       "shard's objects to regenerate it") from None

    def commit(self, seq: int, record: dict, *, token: str) -> dict | None:
        """Create commit ``seq``; None once it is this try's, else the commit another try created first ({} when
        that one cannot be read). A create whose answer was lost and that botocore sent again finds its own commit
        there: that is success."""
        name = commit_name(self.shard_id, seq)
        try:
            self.store.put(name, jsonio.dumps({**record, "seq": seq, "token": token}), if_absent=True)
        except StoreConflict:
            winner = self._winner(name)
            if winner is not None and winner.get("token") == token:
                return None
            return winner if winner is not None else {}
        return None

    def lease_lost(self, seq: int, winner: dict) -> ShardLeaseLost:
        """What a try reads when a newer one fenced the shard at commit ``seq``."""
        return ShardLeaseLost(
            f"{describe_writer(winner)} took this shard's output over (it created commit {seq} first); this try "
            "stops here, and what it had not committed is generated again by the newer try",
            shard=self.shard_id, path=self.store.url(commit_name(self.shard_id, seq)),
            hint="two tries of this shard ran at once (Airflow started a retry while this one was still alive): "
                 "nothing to do, the newer try resumes from the committed output")

    def _winner(self, name: str) -> dict | None:
        try:
            return self._decode(name, self.store.get(name))
        except (ObjectMissing, GenerationError):
            return None

    def read_part(self, part: Part) -> bytes:
        """A part's bytes, checked against what its commit recorded (a part changed or cut by hand is named)."""
        try:
            data = self.store.get(part.name)
        except ObjectMissing:
            raise GenerationError(
                f"a committed part of the shard's output is missing ({part.lines} lines, {part.size} bytes)",
                shard=self.shard_id, path=self.store.url(part.name),
                hint="parts are written only by fleetgen and never deleted: restore the object, or delete the "
                     "shard's objects to regenerate the shard") from None
        lines = data.count(b"\n")
        if len(data) != part.size or lines != part.lines or (data and not data.endswith(b"\n")):
            raise GenerationError(
                f"a committed part of the shard's output is torn: {len(data)} bytes and {lines} lines, "
                f"its commit recorded {part.size} bytes and {part.lines} lines",
                shard=self.shard_id, path=self.store.url(part.name),
                hint="the part was changed after it was committed: restore it, or delete the shard's objects to "
                     "regenerate the shard")
        return data

    def read_parts(self, parts: list[Part]) -> Iterator[bytes]:
        """The parts' bytes in order, read several at a time."""
        return read_in_order(self.read_part, parts)


def read_in_order(read, items: list) -> Iterator[bytes]:
    """``read(item)`` of each item, in order, with at most ``READ_PARALLELISM`` reads running or waiting to be
    consumed."""
    if len(items) <= 1:
        yield from (read(item) for item in items)
        return
    with concurrent.futures.ThreadPoolExecutor(min(READ_PARALLELISM, len(items))) as pool:
        pending = collections.deque()
        for item in items:
            if len(pending) >= READ_PARALLELISM:
                yield pending.popleft().result()
            pending.append(pool.submit(read, item))
        while pending:
            yield pending.popleft().result()


def committed_shards(store: ObjectStore) -> list[int]:
    """The shards of the run (``store``: its prefix) that opened a log, by the plan each wrote first, in order."""
    shards = []
    for info in store.iter_objects("shards/"):
        match = _PLAN_NAME.fullmatch(info.name)
        if match:
            shards.append(int(match.group(1)))
    return sorted(shards)


_PLAN_NAME = re.compile(r"shards/shard-(\d+)\.json")


def committed_lines(store: ObjectStore, shard_id: int, kind: str) -> Iterator[bytes]:
    """Every committed line of ``kind`` of the shard, in commit order (what a reader of the finished run sees)."""
    log = CommitLog(store, shard_id)
    for data in log.read_parts(log.read().parts[kind]):
        yield from data.splitlines(keepends=True)
