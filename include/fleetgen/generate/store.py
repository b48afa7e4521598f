"""Per-shard output files and exactly-once resume.

Layout under the run's output root::

    completions/shard-00042.jsonl   the text: one finished prompt a line (append-only)
    stats/shard-00042.jsonl         one compact row per completion: the checkpoint of record
    errors/shard-00042.jsonl        prompts that failed; only the prompt's own faults stay failed on resume
    shards/shard-00042.json         the shard's plan, to refuse resuming over a different plan
    shards/shard-00042.mark.json    where to start reading prompts again: every prompt before it
                                    is finished (rewritten atomically about once a second)
    shards/shard-00042.lock         flock'ed by the one try that may write the shard's output
    shards/shard-00042.lease.json   which try holds (or has claimed) the output (see lease.py)

Every finished prompt is written to the completions file first and to the stats file second, each
with one ``write()`` straight to the OS (nothing sits in a user-space buffer, so a kill -9 loses
only what was in flight). A kill can therefore leave: a torn last line in any file, and completion
lines whose stats row was never written (at most the last one or two). Opening the store repairs
exactly that: torn tails are cut off, and completion lines after the one matching the last stats
row get their stats rows rebuilt. Of the errors file only the prompts' own faults stand
(``errors_readback.py`` sorts its lines): the others are cut from it and their prompts sent again, so
clearing a shard after the cause is fixed regenerates them. Only the stats ids and the tail of the completions file are read,
so resume cost does not grow with the size of the text; the mark spares re-reading the prompts
that are all finished.

A write that fails (disk full, quota, read-only) raises ``OutputError`` naming the file and the
shard; the file is cut back to its last whole line at once and the store refuses every later
write, so the output stays exactly what a resume expects. When the disk is still full the error is
``OutputUnwritable`` (a retry would fail the same way until space is freed; ``write_errors.py``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import GenerationError, OutputError, ShardPlanChanged
from fleetgen.generate import jsonio
from fleetgen.generate.lease import ShardLease
from fleetgen.generate.errors_readback import read_back_errors
from fleetgen.generate.records import stats_record
from fleetgen.generate.settings import GenerationSettings
from fleetgen.generate.write_errors import OutputErrorsAs, output_error
from fleetgen.generate.resume_mark import MarkedResume
from fleetgen.generate.reuse import reuse_row
from fleetgen.outputs import RunLayout
from fleetgen.prompts.lines import fast_id

TAIL_CHUNK = 1 << 20
BLOCK = 1 << 22
# A stats row starts with its id; rows hold no nested objects, so this matches once per row
# unless the id has escapes (then that block is read line by line).
_STATS_ID = re.compile(rb'\{"id":"([^"\\]*)"')
# What shards/shard-NNNNN.json records of the plan: a retry must be cut the same way over the same bytes.
PLAN_KEYS = ("shard_id", "input_path", "start", "end", "count", "blocks")


@dataclass(frozen=True)
class ResumeReport:
    finished: int  # completions already on disk
    failed: int  # errors already on disk that were the prompts' own fault (kept)
    torn_bytes: dict[str, int]  # bytes of torn last lines cut off, per file kind
    restored_stats: int  # stats rows rebuilt from completion lines
    sent_again: int = 0  # earlier errors not the prompts' fault: cut from the errors file, their prompts pending


class ShardStore(MarkedResume):
    """Open with ``ShardStore.open``; ``done_ids`` holds the UTF-8 ids not to generate again."""

    def __init__(self, root: Path, shard: dict) -> None:
        self.shard_id = int(shard["shard_id"])
        layout = RunLayout(root)
        self.completions_path = layout.shard_file("completions", self.shard_id)
        self.stats_path = layout.shard_file("stats", self.shard_id)
        self.errors_path = layout.shard_file("errors", self.shard_id)
        self.plan_path = layout.shard(self.shard_id).plan
        self.mark_path = layout.shard(self.shard_id).mark
        # prompt hash -> where its completion line is (fleetgen.generate.reuse); a row lost in a crash
        # only means that completion is generated again next time.
        self.reuse_path = layout.shard_file("reuse", self.shard_id)
        self.done_ids: set[bytes] = set()
        self.mark: tuple[int, int] | None = None  # (valid prompts before, byte offset)
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}  # bytes of whole lines in each file (this try is the only writer)
        self._paths = {"completions": self.completions_path, "stats": self.stats_path, "errors": self.errors_path,
                       "reuse": self.reuse_path}
        self._lease: ShardLease | None = None
        self._broken: OutputError | None = None  # the first failed write; every later write re-raises it
        self._log: logging.Logger | None = None

    @classmethod
    def open(cls, out_dir: str | os.PathLike, shard: dict, *, log: logging.Logger | None = None,
             try_number: int | None = None,
             lease_wait_s: float = GenerationSettings.lease_wait_s) -> tuple["ShardStore", ResumeReport]:
        """Take the shard's output lease (see lease.py), repair what an interrupted try left, open for append.

        ``try_number`` (Airflow's) names this try in the lease and in the errors of a try that lost it.
        """
        root = Path(out_dir)
        store = cls(root, shard)
        store._log = log
        with store._output_errors(store.plan_path.parent):
            store._lease = ShardLease.acquire(root, store.shard_id, try_number=try_number,
                                              wait_s=lease_wait_s, log=log)
        try:
            with store._output_errors(store.completions_path.parent):
                return store, store._open_files(shard, log)
        except BaseException:
            store.close()
            raise

    def _open_files(self, shard: dict, log: logging.Logger | None) -> ResumeReport:
        for path in (self.completions_path, self.stats_path, self.errors_path, self.plan_path,
                     self.reuse_path):
            path.parent.mkdir(parents=True, exist_ok=True)
        self._check_plan(shard)
        report = self._recover()
        self.mark = self._read_mark(shard, log)
        if log is not None and (report.torn_bytes or report.restored_stats):
            log.warning("shard %d: repaired output after an interrupted run: cut torn last lines %s, "
                        "rebuilt %d stats rows", self.shard_id, report.torn_bytes or "{}", report.restored_stats)
        for kind, path in self._paths.items():
            self._fds[kind] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._sizes[kind] = os.fstat(self._fds[kind]).st_size
        return report

    def output_files(self) -> list[Path]:
        """The files a resume of this shard reads back: deleting them all makes the shard start afresh."""
        return [*self._paths.values(), self.plan_path, self.mark_path]

    def _output_errors(self, path: Path, attempted: int = 0) -> OutputErrorsAs:
        return OutputErrorsAs(path, self.shard_id, attempted)

    def _check_plan(self, shard: dict) -> None:
        plan = {key: shard[key] for key in PLAN_KEYS if key in shard}
        if self.plan_path.exists():
            recorded = jsonio.loads(self.plan_path.read_bytes())
            if recorded != plan:
                changed = ", ".join(key for key in sorted(set(recorded) | set(plan))
                                    if recorded.get(key) != plan.get(key))
                raise ShardPlanChanged(
                    f"this shard's output was written for a different plan ({recorded}), now {plan}: {changed} "
                    "changed (the prompts file or shard_size changed since this run planned its shards); a retry "
                    "finds the same output", shard=self.shard_id, path=str(self.plan_path),
                    hint="trigger a new run for the edited prompts file (a new run id gets a folder of its own); "
                         "or, to redo only this shard in this run, delete its output ("
                         + " ".join(str(path) for path in self.output_files()) + ") and clear this task")
            return
        partial = self.plan_path.with_name(self.plan_path.name + ".partial")
        partial.write_bytes(jsonio.dumps(plan))
        os.replace(partial, self.plan_path)

    def _recover(self) -> ResumeReport:
        torn = {}
        for kind, path in (("completions", self.completions_path), ("stats", self.stats_path),
                           ("errors", self.errors_path), ("reuse", self.reuse_path)):
            cut = _cut_torn_tail(path)
            if cut:
                torn[kind] = cut
        failed, sent_again = self._load_error_ids()
        last_id = self._load_stats_ids()
        orphans = self._orphan_completions(last_id)
        if orphans:
            with self.stats_path.open("ab") as stats:
                for record in orphans:
                    stats.write(jsonio.dumps(stats_record(record)) + b"\n")
                    self.done_ids.add(record["id"].encode())
        return ResumeReport(finished=len(self.done_ids) - failed, failed=failed, torn_bytes=torn,
                            restored_stats=len(orphans), sent_again=sent_again)

    def _load_error_ids(self) -> tuple[int, int]:
        """Take the prompts' own faults as done; cut every other error record (its prompt is sent again).
        Returns (kept, cut)."""
        if not self.errors_path.exists():
            return 0, 0
        with self.errors_path.open("rb") as handle:
            read_back = read_back_errors(handle, lambda raw, number: self._line_id(raw, self.errors_path, number))
        self.done_ids.update(read_back.kept_ids)
        if read_back.dropped:
            # The mark goes first: it may lie past the prompts about to be pending again. A kill between the
            # two leaves the old errors file and no mark, which the next open handles the same way.
            self.mark_path.unlink(missing_ok=True)
            partial = self.errors_path.with_name(self.errors_path.name + ".partial")
            partial.write_bytes(b"".join(read_back.kept))
            os.replace(partial, self.errors_path)
        return len(read_back.kept), read_back.dropped

    def _load_stats_ids(self) -> bytes | None:
        last_id = None
        if self.stats_path.exists():
            for block in _line_blocks(self.stats_path):
                found = _STATS_ID.findall(block)
                if len(found) != block.count(b"\n"):
                    found = [self._line_id(raw, self.stats_path, None) for raw in block.splitlines()]
                self.done_ids.update(found)
                if found:
                    last_id = found[-1]
        return last_id

    def _read_mark(self, shard: dict, log: logging.Logger | None) -> tuple[int, int] | None:
        try:
            data = jsonio.loads(self.mark_path.read_bytes())
            mark = (int(data["valid_before"]), int(data["offset"]))
        except FileNotFoundError:
            return None
        except (jsonio.JSONDecodeError, KeyError, TypeError, ValueError):
            if log is not None:
                log.warning("shard %d: ignoring an unreadable %s; reading the whole shard instead",
                            self.shard_id, self.mark_path)
            return None
        return self.checked_mark(shard, mark)

    @property
    def mark_where(self) -> str:
        return str(self.mark_path)

    @property
    def errors_where(self) -> str:
        return str(self.errors_path)

    def save_mark(self, valid_before: int, offset: int) -> None:
        """Record that every prompt before ``offset`` (``valid_before`` of them) is finished.

        Also the stale-try check of a shard with no write for a while (called about once a second)."""
        self._check_writable(now=True)
        if self.mark == (valid_before, offset):
            return
        partial = self.mark_path.with_name(self.mark_path.name + ".partial")
        with self._output_errors(partial):
            try:
                partial.write_bytes(jsonio.dumps({"valid_before": valid_before, "offset": offset}))
            except OSError:
                partial.unlink(missing_ok=True)  # the old mark stays valid: it only ever lags
                raise
            os.replace(partial, self.mark_path)
        self.mark = (valid_before, offset)

    def _check_writable(self, *, now: bool = False) -> None:
        if self._broken is not None:
            raise self._broken
        if self._lease is not None:
            self._lease.check(now=now)

    @staticmethod
    def _line_id(raw: bytes, path: Path, number: int | None) -> bytes:
        raw_id = fast_id(raw)
        if raw_id is not None:
            return raw_id
        try:
            return jsonio.loads(raw)["id"].encode()
        except (jsonio.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise GenerationError(f"unreadable line in the shard's output: {raw[:120]!r}", path=str(path),
                                  line=number, hint="this file is written only by fleetgen; restore it or "
                                  "remove the shard's output files to regenerate the shard") from None

    def _orphan_completions(self, last_stats_id: bytes | None) -> list[dict]:
        """Completion lines written after the last stats row (newest last), read from the end."""
        orphans = []
        for raw in _lines_backwards(self.completions_path):
            raw_id = self._line_id(raw, self.completions_path, None)
            if raw_id == last_stats_id:
                break
            if raw_id in self.done_ids:
                raise GenerationError(
                    f"completion {raw_id.decode(errors='replace')!r} is after the last stats row but already "
                    "recorded: the completions and stats files do not belong together",
                    shard=self.shard_id, path=str(self.completions_path),
                    hint="restore both files from the same run, or remove the shard's output to regenerate it")
            orphans.append(jsonio.loads(raw))
        else:
            if last_stats_id is not None:
                raise GenerationError(
                    f"the stats file lists {len(self.done_ids)} finished prompts but its last one "
                    f"({last_stats_id.decode(errors='replace')!r}) is not in the completions file",
                    shard=self.shard_id, path=str(self.completions_path),
                    hint="the completions file was truncated or replaced; restore it, or remove the "
                         "shard's output files to regenerate the shard")
        orphans.reverse()
        return orphans

    def record_completion(self, completion_line: bytes, stats_line: bytes, prompt_id: str, *,
                          prompt_hash: bytes | None = None) -> None:
        """Persist one finished prompt: text first, then its stats row (the checkpoint), then where the
        text is for a later run to reuse it (``reuse/``; docs/output-formats.md §3.9)."""
        self._check_writable()
        offset = self._sizes["completions"]
        self._append("completions", completion_line)
        self._append("stats", stats_line)
        self.done_ids.add(prompt_id.encode())
        if prompt_hash is not None:
            self._append("reuse", reuse_row(prompt_hash, offset, completion_line))

    def record_failure(self, error_line: bytes, prompt_id: str) -> None:
        """Persist one failed prompt (``records.error_record``); this try does not send it again."""
        self._check_writable()
        self._append("errors", error_line)
        self.done_ids.add(prompt_id.encode())

    def _append(self, kind: str, data: bytes) -> None:
        fd = self._fds[kind]
        try:
            _write_all(fd, data)
        except OSError as exc:
            try:  # a partial line would be followed by whole ones if space came back: cut it now
                os.ftruncate(fd, self._sizes[kind])
            except OSError:
                pass  # the torn tail is cut when the shard is opened again
            self._broken = output_error(exc, self._paths[kind], self.shard_id, len(data))
            raise self._broken from exc
        self._sizes[kind] += len(data)

    def close(self) -> None:
        """Sync and close the files, then release the lease; kill -9 needs no sync, a lost machine does."""
        failure = None
        for kind, fd in self._fds.items():
            try:
                os.fsync(fd)
            except OSError as exc:  # the last data may not have reached the disk: the next open repairs it
                failure = failure or output_error(exc, self._paths[kind], self.shard_id, 0)
            finally:
                os.close(fd)
        self._fds.clear()
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if failure is not None and self._broken is None:
            raise failure


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _line_blocks(path: Path):
    """The file in blocks of whole lines (the file ends with a newline)."""
    with path.open("rb") as handle:
        carry = b""
        while chunk := handle.read(BLOCK):
            chunk = carry + chunk
            cut = chunk.rfind(b"\n") + 1
            if cut:
                yield chunk[:cut]
            carry = chunk[cut:]
        if carry:
            yield carry + b"\n"


def _cut_torn_tail(path: Path) -> int:
    """Truncate a last line that has no newline; return the bytes cut."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("r+b") as handle:
        end = size
        while end > 0:
            start = max(0, end - TAIL_CHUNK)
            handle.seek(start)
            chunk = handle.read(end - start)
            if end == size and chunk.endswith(b"\n"):
                return 0
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        handle.truncate(keep)
    return size - keep


def _lines_backwards(path: Path):
    """Complete lines of a newline-terminated file, last first, reading fixed-size chunks from the end."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        carry = b""
        while end > 0:
            start = max(0, end - TAIL_CHUNK)
            handle.seek(start)
            chunk = handle.read(end - start) + carry
            end = start
            lines = chunk.split(b"\n")
            carry = lines[0] if start > 0 else b""
            for raw in reversed(lines[1:] if start > 0 else lines):
                if raw:
                    yield raw + b"\n"
        if carry:
            yield carry + b"\n"
