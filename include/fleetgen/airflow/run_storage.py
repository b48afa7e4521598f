"""Where a task finds its run: the run's folder on the workers' disk, or a private copy of it when the run lives on an
object store (``output_root`` an ``s3://`` URL; docs/object-storage.md §6).

Every task callable runs inside ``task_run`` (applied once, by the DAG's ``_task`` helper, and by the operators'
own methods that touch the run). On local disk it changes nothing. On a store it mirrors the run into a scratch
folder of the worker (``storage/mirror.py``), reads into it what the task declared it reads (the prompts, the
shards' committed records), lets the task run there, and sends back what the task wrote, when the task fails too.
``run_context`` then answers with the scratch folder as the output root and the local copy of the prompts.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from fleetgen.errors import ConfigError, ObjectMissing
from fleetgen.outputs import run_folder_name
from fleetgen.storage.location import STORAGE_CONN_PARAMETER, ObjectLocation, is_object_location
from fleetgen.storage.mirror import RunMirror, is_plain_name
from fleetgen.storage.objects import ObjectStore
from fleetgen.storage.run_files import LocalRunFiles, ObjectRunFiles, RunFiles

log = logging.getLogger(__name__)

# Where the workers keep a task's copy of a run on a store: the deployment's choice, else the system's temp folder.
SCRATCH_VARIABLE = "FLEETGEN_SCRATCH_DIR"
SCRATCH_PREFIX = "fleetgen-run-"  # then the host and the process id (scratch_prefix)
# What a task may declare it reads from a run on a store, beside its small files: the whole prompts file, and the
# shards' committed records and journals (generate/commit_log.py) or their GPU samples (plain objects).
PROMPTS = "prompts"
# The output root's earlier runs, for the tasks that learn from them (report/previous.py finds the one they use, as
# on disk): every earlier run's report; with the previous run, also what the tuner reads of the newest successful
# one (its prompts' identity, its workload plan and its committed stats).
PREVIOUS_REPORTS = "previous_reports"
PREVIOUS_RUN = "previous_run"
# commit_log.PART_KINDS, spelled out: importing it here would load numpy when the DAG is parsed (a test holds them
# equal)
COMMITTED_KINDS = ("completions", "stats", "errors", "reuse", "events", "metrics")
OBJECT_KINDS = ("gpu",)
READS = (PROMPTS, PREVIOUS_REPORTS, PREVIOUS_RUN, *COMMITTED_KINDS, *OBJECT_KINDS)


@dataclass(frozen=True)
class StoreRun:
    """A task's view of a run on a store: its mirror, the run's prefix and the prompts' object (None when local)."""

    mirror: RunMirror
    output: ObjectStore
    prompts: ObjectStore | None
    prompts_name: str
    prompts_file: Path | None  # the whole prompts file in scratch, when the task declared it reads it


_current: contextvars.ContextVar[StoreRun | None] = contextvars.ContextVar("fleetgen_store_run", default=None)


def current_store_run() -> StoreRun | None:
    """The run on a store of the task running now, or None (a run on local disk, or outside ``task_run``)."""
    return _current.get()


def scratch_base() -> Path:
    return Path(os.environ.get(SCRATCH_VARIABLE) or tempfile.gettempdir()).expanduser()


def connect(location: ObjectLocation, conn_id: str, parameter: str) -> ObjectStore:
    return ObjectStore.connect(location, conn_id=conn_id, parameter=parameter)


@contextmanager
def task_run(params: dict, run_id: str, *, reads: Iterable[str] = ()) -> Iterator[StoreRun | None]:
    """The run of ``params`` as the task sees it while the block runs; see the module doc."""
    from fleetgen.airflow.run_config import RunConfig, check_object_root

    unknown = sorted(set(reads) - set(READS))
    if unknown:
        raise ValueError(f"unknown reads {unknown}; known: {READS}")
    config = RunConfig.from_params(params)
    root = config.inputs.output_root
    if not is_object_location(root):
        yield None
        return
    check_object_root(root, run_id)
    conn_id = config.inputs.storage_conn_id
    folder = run_folder_name(run_id)
    store = connect(root, conn_id, "output_root")
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()), dir=_scratch_dir()))
    try:  # the scratch folder goes, whatever fails
        mirror = RunMirror.open(store, folder, scratch / "root", folders=[kind for kind in OBJECT_KINDS
                                                                          if kind in reads])
        run = _store_run(mirror, store.below(folder), config, conn_id, reads)
        token = _current.set(run)
        failed = True
        try:
            yield run
            failed = False
        finally:
            _current.reset(token)
            try:
                sent = mirror.sync()
                if sent:
                    log.info("wrote back to %s: %s", store.url(folder), ", ".join(sent))
            except Exception:
                if not failed:
                    raise
                log.exception("what this failed task wrote could not all be sent back to %s", store.url(folder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _store_run(mirror: RunMirror, output: ObjectStore, config, conn_id: str, reads: Iterable[str]) -> StoreRun:
    """What the task reads of the run, in its copy: the prompts and the shards' committed records it declared."""
    location = config.inputs.prompts_path
    prompts, prompts_name, prompts_file = None, "", None
    if is_object_location(location):
        prompts = connect(ObjectLocation(location.scheme, location.bucket), conn_id, "prompts_path")
        prompts_name = location.key
        if PROMPTS in reads:
            prompts_file = fetch_prompts(prompts, prompts_name, mirror.scratch.parent / "prompts" /
                                         _base_name(prompts_name))
    for kind in COMMITTED_KINDS:
        if kind in reads:
            read_committed(mirror, output, kind)
    if PREVIOUS_REPORTS in reads or PREVIOUS_RUN in reads:
        previous = read_earlier_runs(mirror, whole_previous=PREVIOUS_RUN in reads)
        log.info("earlier runs of %s: %s", mirror.store.url(), f"the previous successful one is {previous}"
                 if previous else "none succeeded")
    return StoreRun(mirror, output, prompts, prompts_name, prompts_file)


def _scratch_dir() -> Path:
    base = scratch_base()
    base.mkdir(parents=True, exist_ok=True)
    swept = sweep_scratch(base)
    if swept:
        log.info("removed the copies of %d task(s) on %s that ended without removing them (killed): %s", len(swept),
                 base, ", ".join(swept))
    return base


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", socket.gethostname()) or "host"


def scratch_prefix(pid: int) -> str:
    """The name a task's copy starts with: its worker's host and process, so that a later task on the same worker
    can tell a copy whose task is gone (killed: SIGKILL, out of memory, a lost pod's process) from a running one."""
    return f"{SCRATCH_PREFIX}{_host()}-{int(pid)}-"


def sweep_scratch(base: Path) -> list[str]:
    """Remove the copies under ``base`` that a task of this host made and whose process no longer runs; the names
    removed. A copy of another host (a folder shared between workers) or of a running process is left alone."""
    own = re.compile(rf"{re.escape(SCRATCH_PREFIX + _host())}-(\d+)-")
    swept = []
    for entry in sorted(base.iterdir()) if base.is_dir() else ():
        found = own.match(entry.name)
        if found and entry.is_dir() and not _process_runs(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            swept.append(entry.name)
    return swept


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        pass
    return True


def _base_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key.rsplit("/", 1)[-1]) or "prompts.jsonl"


def fetch_prompts(store: ObjectStore, name: str, path: Path, *, start: int | None = None,
                  end: int | None = None) -> Path:
    """The prompts object ``name`` as the local file ``path``: whole, or only bytes ``[start, end)`` in place in a
    sparse file of the object's full size, so that the scan's byte offsets hold. Its modification time is the
    object's Last-Modified: the scan's identity of the file (size and time) is then the same on every worker, and
    changes when the object is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("wb") as handle:
            if start:
                handle.seek(start)
            info = store.download(name, handle, start=start, end=end)
            handle.truncate(info.size)
    except ObjectMissing:
        raise ConfigError(f"prompts file {store.url(name)} not found (connection {store.conn_id})",
                          path=store.url(name), hint=f"set the DAG parameter prompts_path to the prompts object's "
                                                     f"URL, or {STORAGE_CONN_PARAMETER} to a connection that sees it"
                          ) from None
    seconds = round(info.modified)
    os.utime(path, ns=(seconds * 10**9, seconds * 10**9))
    return path


def shard_prompts(shard: dict) -> dict:
    """``shard`` as the task reads it: on a store, its byte range (and the blocks it checks) fetched into scratch and
    ``input_path`` naming that copy (``source`` keeps the object's URL, the shard's identity on the store); on local disk, unchanged."""
    run = current_store_run()
    if run is None or run.prompts is None:
        return shard
    local = run.mirror.scratch.parent / "prompts" / f"shard-{int(shard['shard_id'])}-{_base_name(run.prompts_name)}"
    # the scan's digested blocks the range overlaps are checked whole before a prompt is read (prompts/planned.py)
    blocks = shard.get("blocks") or []
    start = min([int(shard["start"]), *(int(block[1]) for block in blocks)])
    end = max([int(shard["end"]), *(int(block[2]) for block in blocks)])
    fetch_prompts(run.prompts, run.prompts_name, local, start=start, end=end)
    return {**shard, "input_path": str(local), "source": run.prompts.url(run.prompts_name)}


def planned_on_store(shard: dict) -> dict:
    """A shard just cut from the task's copy of the prompts, as every other task finds it: on a store, its
    ``input_path`` is the prompts object's URL (the copy is this task's own)."""
    run = current_store_run()
    if run is None or run.prompts is None:
        return shard
    return {**shard, "input_path": run.prompts.url(run.prompts_name)}


def run_url(layout, relative: str = "") -> str:
    """Where the run's outputs (or ``relative`` among them) are, as a person or a downstream DAG finds them: a URL
    of the run's prefix on a store, else a path of its folder."""
    run = current_store_run()
    return run.output.url(relative) if run is not None else str(layout.root / relative)


def scan_as_stored(scan: dict) -> dict:
    """The scan of the task's copy of the prompts, naming the prompts object (what the other tasks find)."""
    run = current_store_run()
    if run is None or run.prompts is None:
        return scan
    return {**scan, "path": run.prompts.url(run.prompts_name)}


def scan_here(scan: dict, prompts_path) -> dict:
    """A scan made by another task, naming the task's own copy of the prompts (``prompts_path``) on a store."""
    run = current_store_run()
    if run is None or run.prompts is None:
        return scan
    return {**scan, "path": str(prompts_path)}


def look_up_reuse_here(output_root, layout, material: dict, log: logging.Logger):
    """The earlier run whose completions this one reuses (generate/reuse.py): among the runs of the output root on
    disk, or of its prefix on a store (generate/reuse_store.py)."""
    from fleetgen.generate.reuse import look_up_reuse
    from fleetgen.generate.reuse_store import look_up_reuse_on_store

    run = current_store_run()
    if run is None:
        return look_up_reuse(output_root, layout.root.name, material, log=log)
    return look_up_reuse_on_store(run.mirror.store, run.mirror.run_folder, material,
                                  run.mirror.scratch.parent / "reuse-sources", log=log)


def shared_run_files(layout) -> RunFiles:
    """The files the run's tasks share while they run (storage/run_files.py): the run's prefix on a store, else its
    folder."""
    run = current_store_run()
    return ObjectRunFiles(run.output) if run is not None else LocalRunFiles(layout.root)


def read_earlier_runs(mirror: RunMirror, *, whole_previous: bool) -> str | None:
    """Every earlier run's report under the mirrored output root into the copy, read-only; with ``whole_previous``
    also, of the newest successful one, what the tuner learns from: its prompts' identity, its workload plan and its
    committed stats. The folder of that run, or None."""
    from fleetgen.outputs import RunLayout, run_root_of_report
    from fleetgen.report.previous import find_previous_report

    relative = RunLayout(Path())  # names relative to a run's folder
    folders = [folder for folder in mirror.store.folders() if folder != mirror.run_folder and is_plain_name(folder)]
    mirror.copy_read_only(f"{folder}/{relative.report_json.as_posix()}" for folder in folders)
    found = find_previous_report(mirror.scratch, mirror.run_folder)
    if found is None:
        return None
    folder = run_root_of_report(found).name
    if whole_previous:
        mirror.copy_read_only(f"{folder}/{path.as_posix()}" for path in (relative.prompts_identity,
                                                                         relative.workload_plan))
        for name, lines in committed_files(mirror.store.below(folder), "stats"):
            mirror.write_read_only(f"{folder}/{name}", lines)
    return folder


def read_committed(mirror: RunMirror, run_store: ObjectStore, kind: str) -> None:
    """Every shard's committed lines of ``kind`` (generate/commit_log.py) as ``<kind>/shard-NNNNN.jsonl`` of the
    copy: what the stages read of a finished shard, never sent back."""
    for name, lines in committed_files(run_store, kind):
        mirror.write_derived(name, lines)


def committed_files(run_store: ObjectStore, kind: str) -> Iterator[tuple[str, Iterator[bytes]]]:
    """(``<kind>/shard-NNNNN.jsonl``, its committed lines) for every shard of the run at ``run_store``."""
    from fleetgen.generate.commit_log import committed_lines, committed_shards
    from fleetgen.outputs import RunLayout

    layout = RunLayout(Path())  # names relative to the run's folder
    for shard_id in committed_shards(run_store):
        yield layout.shard_file(kind, shard_id).as_posix(), committed_lines(run_store, shard_id, kind)


def local_config(config, run: StoreRun | None):
    """``config`` with the output root and prompts as the task reads them: the scratch copies on a store."""
    if run is None:
        return config
    inputs = replace(config.inputs, output_root=run.mirror.scratch,
                     prompts_path=run.prompts_file if run.prompts_file is not None else config.inputs.prompts_path)
    return replace(config, inputs=inputs)


@contextmanager
def current_task_run(*, reads: Iterable[str] = ()) -> Iterator[StoreRun | None]:
    """``task_run`` for the task running now (an operator's method that writes to its run)."""
    from fleetgen.airflow.context import task_context

    if current_store_run() is not None:  # already inside one
        yield current_store_run()
        return
    try:
        context = task_context()
    except RuntimeError:  # not in a task (a callable tested on its own): no run to mirror
        yield None
        return
    with task_run(context["params"], context["run_id"], reads=reads) as run:
        yield run


def on_run_storage(function, *, reads: Iterable[str] | None = ()):
    """``function`` (a task callable, or an operator's method) run inside ``task_run`` for the current task's run;
    ``reads=None`` declares a callable that touches none of the run's files (it shapes its arguments): it runs as it
    is, with no copy of a run on a store. ``wrapper.reads`` keeps the declaration."""
    reads = None if reads is None else tuple(reads)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if reads is None:
            return function(*args, **kwargs)
        with current_task_run(reads=reads):
            return function(*args, **kwargs)

    wrapper.reads = reads
    return wrapper


