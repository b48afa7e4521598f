"""A shard's output on an object store, exactly once without a lock or an append (docs/shards.md §8).

``ObjectShardStore`` is what ``ShardStore`` is on a local folder, on the commit log of ``commit_log.py``:

- **Open.** Write the shard's plan if it is not there (else it must match), read the log, keep the errors that
  stand, and create the next commit: this try's fence. A try that still writes the shard (a zombie Airflow gave up
  on, frozen or not) fails at its next commit and stops; nothing waits for it.
- **Record.** A completion or a failure goes into an in-memory buffer; the dispatch loop never waits on the store.
  A committer thread turns the buffer into parts and a commit when it holds ``CommitBounds.lines`` lines or
  ``bytes`` bytes, or every ``interval_s`` seconds; the resume mark rides on the commit whose lines it covers.
  A crash loses at most the buffer, which the next try generates again. When the committer is ``max_behind``
  bytes behind, recording waits for it.
- **Fail.** A commit that fails (the store, or a newer try's fence) stops the committer; the next record, mark
  or close raises that error (``ShardLeaseLost``, ``StoreError``), and what was committed stays.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass

from fleetgen.errors import GenerationError, ShardPlanChanged, StoreConflict
from fleetgen.generate import jsonio
from fleetgen.generate.commit_log import (JOURNAL_KINDS, PART_KINDS, CommitLog, Part, ShardLog, describe_writer, log_prefix,
                                          part_name, plan_name)
from fleetgen.generate.errors_readback import read_back_errors
from fleetgen.generate.lease import LeaseHolder
from fleetgen.generate.resume_mark import MarkedResume
from fleetgen.generate.reuse import reuse_row
from fleetgen.generate.store import PLAN_KEYS, ResumeReport, _STATS_ID
from fleetgen.outputs import shard_stem
from fleetgen.prompts.lines import fast_id
from fleetgen.storage.objects import ObjectStore

# A new try and a live old one can race for the same commit number while the new one opens: each lost race means
# the old one committed once more, so a few rounds settle it.
OPEN_RACES = 8


@dataclass(frozen=True)
class CommitBounds:
    """When the buffer becomes a commit; docs/shards.md §8 weighs them (objects per completion, what a crash loses)."""

    lines: int = 4000
    bytes: int = 16 << 20
    interval_s: float = 5.0
    max_behind: int = 64 << 20


class ObjectShardStore(MarkedResume):
    """Open with ``ObjectShardStore.open``; ``done_ids`` holds the UTF-8 ids not to generate again."""

    def __init__(self, store: ObjectStore, shard: dict, holder: LeaseHolder, bounds: CommitBounds) -> None:
        self.store = store
        self.shard_id = int(shard["shard_id"])
        self.log_ = CommitLog(store, self.shard_id)
        self.holder = holder
        self.token = secrets.token_hex(6)
        self.bounds = bounds
        self.done_ids: set[bytes] = set()
        self.mark: tuple[int, int] | None = None
        self._log: logging.Logger | None = None
        self._seq = 0  # the last commit of this try
        self._buffer: dict[str, list[bytes]] = {kind: [] for kind in PART_KINDS}
        self._buffered = 0  # bytes in the buffer
        self._committing = 0  # bytes handed to the committer, not yet committed
        self._pending_mark: tuple[int, int] | None = None
        self._committed_mark: tuple[int, int] | None = None
        self._completions_end = 0  # where the next completion line starts in the shard's committed completions
        self._failure: BaseException | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._committer: threading.Thread | None = None

    @classmethod
    def open(cls, store: ObjectStore, shard: dict, *, log: logging.Logger | None = None,
             try_number: int | None = None, bounds: CommitBounds = CommitBounds()) -> tuple["ObjectShardStore",
                                                                                          ResumeReport]:
        """Fence the shard's log for this try, read back what is committed, start the committer."""
        writer = cls(store, shard, LeaseHolder.this_process(try_number), bounds)
        writer._log = log
        writer._check_plan(shard)
        report = writer._fence(shard)
        writer._committer = threading.Thread(target=writer._commit_loop, name=f"shard-{writer.shard_id}-commits",
                                             daemon=True)
        writer._committer.start()
        return writer, report

    @property
    def mark_where(self) -> str:
        return f"the resume mark in {self.store.url(log_prefix(self.shard_id))}"

    def _check_plan(self, shard: dict) -> None:
        plan = {key: shard[key] for key in PLAN_KEYS if key in shard}
        if "source" in shard:  # read from a local copy of the prompts object: the object is what the plan names
            plan["input_path"] = shard["source"]
        name = plan_name(self.shard_id)
        try:
            self.store.put(name, jsonio.dumps(plan), if_absent=True)
            return
        except StoreConflict:
            recorded = jsonio.loads(self.store.get(name))
        if recorded != plan:
            changed = ", ".join(key for key in sorted(set(recorded) | set(plan)) if recorded.get(key) != plan.get(key))
            raise ShardPlanChanged(
                f"this shard's output was written for a different plan ({recorded}), now {plan}: {changed} changed "
                "(the prompts file or shard_size changed since this run planned its shards); a retry finds the same "
                "output", shard=self.shard_id, path=self.store.url(name),
                hint="trigger a new run for the edited prompts file (a new run id gets a prefix of its own); or, to "
                     f"redo only this shard in this run, delete {self.store.url(name)} and every object under "
                     f"{self.store.url(f'shards/{shard_stem(self.shard_id)}/')}, then clear this task")

    def _fence(self, shard: dict) -> ResumeReport:
        for _ in range(OPEN_RACES):
            state = self.log_.read()
            self.done_ids = set()
            finished = self._read_stats_ids(state)
            errors = b"".join(self.log_.read_parts(state.parts["errors"]))
            read_back = read_back_errors(errors.splitlines(keepends=True), self._error_id)
            self.done_ids.update(read_back.kept_ids)
            record = {"kind": "open", "by": self._by(), "mark": None}
            mark = None if read_back.dropped else state.mark
            if read_back.dropped:  # restate only the errors that stand; their prompts' mark is void
                record["errors_base"] = self._write_part(state.next_seq, "errors", read_back.kept)
            record["mark"] = list(mark) if mark else None
            if self.log_.commit(state.next_seq, record, token=self.token) is not None:
                continue  # another try committed meanwhile: read again
            self._seq = state.next_seq
            self._completions_end = sum(part.size for part in state.parts["completions"])
            self.mark = self._committed_mark = self.checked_mark(shard, mark)
            self._warn_takeover(state)
            return ResumeReport(finished=finished, failed=len(read_back.kept), torn_bytes={}, restored_stats=0,
                                sent_again=read_back.dropped)
        raise StoreConflict(f"could not open the shard's log: {OPEN_RACES} other commits were created while this try "
                            "read it", shard=self.shard_id, path=self.store.url(), conn_id=self.store.conn_id,
                            hint="another try of this shard commits faster than this one can read: let it finish")

    def _warn_takeover(self, state: ShardLog) -> None:
        last = state.last
        if self._log is not None and last is not None and not last.get("final"):
            self._log.warning("shard %d: %s wrote this shard last and did not close it; %s fenced it at commit %d "
                              "(if it is still alive it stops at its next commit)", self.shard_id,
                              describe_writer(last), self.holder.describe(), self._seq)

    def _read_stats_ids(self, state: ShardLog) -> int:
        count = 0
        for part, data in zip(state.parts["stats"], self.log_.read_parts(state.parts["stats"])):
            found = _STATS_ID.findall(data)
            if len(found) != data.count(b"\n"):
                found = [self._line_id(raw, part.name) for raw in data.splitlines()]
            self.done_ids.update(found)
            count += len(found)
        return count

    def _error_id(self, raw: bytes, number: int) -> bytes:
        return self._line_id(raw, f"shards/{shard_stem(self.shard_id)}/parts/")

    def _line_id(self, raw: bytes, where: str) -> bytes:
        found = fast_id(raw)
        if found is not None:
            return found
        try:
            return jsonio.loads(raw)["id"].encode()
        except (ValueError, KeyError, TypeError, AttributeError):
            raise GenerationError(f"unreadable line in the shard's committed output: {raw[:120]!r}",
                                  shard=self.shard_id, path=self.store.url(where),
                                  hint="parts are written only by fleetgen: restore the object, or delete the "
                                       "shard's objects to regenerate the shard") from None

    def _by(self) -> dict:
        return jsonio.loads(self.holder.to_json())

    def _write_part(self, seq: int, kind: str, lines: list[bytes]) -> dict | None:
        if not lines:
            return None
        data = b"".join(lines)
        name = part_name(self.shard_id, seq, self.token, kind)
        self.store.put(name, data)
        return Part(name, len(lines), len(data)).to_json()

    # -- the hot path ---------------------------------------------------------------------------------------

    def record_completion(self, completion_line: bytes, stats_line: bytes, prompt_id: str, *,
                          prompt_hash: bytes | None = None) -> None:
        """Buffer one finished prompt (text and stats row commit together). With ``prompt_hash``, its reuse row too:
        where the line lies in the shard's committed completions, read as one stream (the same row as on disk,
        docs/output-formats.md §3.9)."""
        lines = (("completions", completion_line), ("stats", stats_line))
        self._add(lines, prompt_id, reuse_of=(prompt_hash, completion_line) if prompt_hash is not None else None)

    def record_failure(self, error_line: bytes, prompt_id: str) -> None:
        self._add((("errors", error_line),), prompt_id)

    def journal(self, kind: str) -> "ShardJournal":
        """A row sink (``watch.RowSink``) whose rows commit with the shard's records: ``events`` or ``metrics``."""
        if kind not in JOURNAL_KINDS:
            raise ValueError(f"unknown journal {kind!r}; expected one of {JOURNAL_KINDS}")
        return ShardJournal(self, kind)

    @property
    def errors_where(self) -> str:
        return self.store.url(f"shards/{shard_stem(self.shard_id)}/parts/")

    def _add(self, lines: tuple[tuple[str, bytes], ...], prompt_id: str | None, *,
             reuse_of: tuple[bytes, bytes] | None = None) -> None:
        with self._changed:
            self._raise_failure()
            while self._buffered + self._committing >= self.bounds.max_behind and self._failure is None:
                self._changed.wait(1.0)
            self._raise_failure()
            if reuse_of is not None:  # under the lock: the buffer's order is the commits' order
                digest, line = reuse_of
                lines += (("reuse", reuse_row(digest, self._completions_end, line)),)
            for kind, line in lines:
                if kind == "completions":
                    self._completions_end += len(line)
                self._buffer[kind].append(line)
                self._buffered += len(line)
            if prompt_id is not None:
                self.done_ids.add(prompt_id.encode())
            if self._full():
                self._changed.notify_all()

    def save_mark(self, valid_before: int, offset: int) -> None:
        """Every prompt before ``offset`` is recorded: the next commit (which holds those records) carries it."""
        with self._changed:
            self._raise_failure()
            self._pending_mark = (valid_before, offset)
            self.mark = self._pending_mark

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # -- the committer -----------------------------------------------------------------------------------------

    def _commit_loop(self) -> None:
        next_due = time.monotonic() + self.bounds.interval_s
        while True:
            with self._changed:
                while not self._closing and not self._full() and time.monotonic() < next_due:
                    self._changed.wait(max(0.0, next_due - time.monotonic()))
                if self._closing:
                    return
                batch, mark = self._take()
            next_due = time.monotonic() + self.bounds.interval_s
            if not self._commit(batch, mark):
                return

    def _full(self) -> bool:
        return (self._buffered >= self.bounds.bytes
                or len(self._buffer["stats"]) + len(self._buffer["errors"]) >= self.bounds.lines)

    def _take(self) -> tuple[dict[str, list[bytes]], tuple[int, int] | None]:
        """The buffer and the mark set before it was taken (called with the condition held)."""
        batch, self._buffer = self._buffer, {kind: [] for kind in PART_KINDS}
        self._committing, self._buffered = self._buffered, 0
        return batch, self._pending_mark

    def _commit(self, batch: dict[str, list[bytes]], mark: tuple[int, int] | None, *, final: bool = False) -> bool:
        """Parts first, then the commit that names them; False once it failed (the failure is kept)."""
        if not any(batch.values()) and mark == self._committed_mark and not final:
            self._done_committing()
            return True
        seq = self._seq + 1
        try:
            parts = {kind: part for kind in PART_KINDS if (part := self._write_part(seq, kind, batch[kind]))}
            record = {"kind": "parts", "by": self._by(), "parts": parts, "mark": list(mark) if mark else None}
            if final:
                record["final"] = True
            if (winner := self.log_.commit(seq, record, token=self.token)) is not None:
                raise self.log_.lease_lost(seq, winner)
        except BaseException as exc:  # noqa: BLE001 - kept for the dispatch loop to raise
            with self._changed:
                self._failure = exc
                self._changed.notify_all()
            self._discard(seq, batch)
            return False
        self._seq = seq
        self._committed_mark = mark
        self._done_committing()
        return True

    def _done_committing(self) -> None:
        with self._changed:
            self._committing = 0
            self._changed.notify_all()

    def _discard(self, seq: int, batch: dict[str, list[bytes]]) -> None:
        """Remove the parts of a commit that did not happen (best effort: no commit names them either way)."""
        for kind in PART_KINDS:
            if batch[kind]:
                try:
                    self.store.delete(part_name(self.shard_id, seq, self.token, kind))
                except Exception:  # noqa: BLE001 - garbage at worst
                    pass

    def close(self) -> None:
        """Commit what is buffered (marked final: this try ended on its own), stop the committer. Raises the
        committer's failure, if any."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._committer is not None:
            self._committer.join()
            self._committer = None
        if self._failure is None:
            with self._changed:
                batch, mark = self._take()
            self._commit(batch, mark, final=True)
        self._raise_failure()


class ShardJournal:
    """A journal of the shard (its server events, its metrics samples) committed in the shard's own parts."""

    def __init__(self, writer: ObjectShardStore, kind: str) -> None:
        self.writer = writer
        self.kind = kind

    def append(self, row: dict) -> None:
        self.writer._add(((self.kind, jsonio.dumps(row) + b"\n"),), None)

    def close(self) -> None:
        """Nothing of its own to close: its rows commit with the shard's."""
