"""The output folder of one run: where every file lives, and the columns of the compact stats rows.

One contract read by every stage: generation writes the per-shard files, validation and the report read
them, the Airflow glue names the run's folder. docs/output-formats.md describes each file.

    <output_root>/<run folder>/
      prompts.json                 which prompts file the run read (path, size, mtime, count)
      rejects.jsonl                prompts set aside at scan time, with the reason
      completions/shard-NNNNN.jsonl  one finished prompt a line (append-only)
      stats/shard-NNNNN.jsonl      one compact row per completion (STATS_COLUMNS): the checkpoint of record
      errors/shard-NNNNN.jsonl     prompts that failed permanently
      metrics/shard-NNNNN.jsonl    the servers' /metrics sampled by the shard (running, queue, KV use...)
      events/shard-NNNNN.jsonl     servers marked down / recovered, prompts retried / failed, per shard
      gpu/shard-NNNNN.jsonl        nvidia-smi utilisation, power, memory per GPU (one sampling shard per node)
      reuse/shard-NNNNN.jsonl      prompt hash -> where its completion line is, per completion
      reuse/index.npy, index.json  the run's reuse index (written once validation passed) and its key
      shards/shard-NNNNN.json      the shard's byte range; ``.mark.json`` its resume mark; ``.lock`` and
                                   ``.lease.json`` the one try that may write it (generate/lease.py);
                                   ``.alive`` the live try's heartbeat, ``.lost.jsonl`` tries that died
      servers-health.json          servers the running shards found down or back up (generate/health.py);
                                   servers-health.lock serialises its writers
      validation/                  summary.json and data_docs/
      report/                      report.json, report.md, plots
      failures.jsonl               one line per failed task: what broke and what to check
      workload_plan.json           per server: the cap, KV pool and ceiling the workload mode planned
      candidate-plans.json         the tuning trial's candidates: each one's plan per server, tonight's split
      calibration.json             each server's readback: the memory it really had vs the plan
      trial-decision.json          the tuning trial's decision, its candidates' scores and each server's candidate
      trial-began.json             when the trial's first shard started (the time cap counts from it)
      batch/output.jsonl, errors.jsonl  the results as OpenAI Batch API output and error files (once validated)
      dataset/shard-NNNNN.parquet  the validated completions as a Parquet dataset (report/parquet_dataset.py)
      server-times/<host>_<port>.jsonl  when each server was launched, kept, ready and stopped (GPU-hours)

    <output_root>/calibration.json   corrections per (GPU, SGLang version, model, tp) the next plan starts from
    <output_root>/tuning-trials.jsonl  one tuning trial decision a line, per (GPU, model, SGLang version, workload)
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import ConfigError, OutputError

# Column order of a stats row (``fleetgen.generate.records.stats_record`` writes them in this order).
STATS_COLUMNS = ("id", "prompt_tokens", "completion_tokens", "finish_reason", "reasoning_chars",
                 "content_chars", "server", "latency_s", "finished_at", "reused_from")
NUMBER_COLUMNS = ("prompt_tokens", "completion_tokens", "reasoning_chars", "content_chars", "latency_s",
                  "finished_at")
CATEGORY_COLUMNS = ("finish_reason", "server", "reused_from")
# Null on purpose: ``reused_from`` is the run folder that generated a copied completion, null when generated tonight.
OPTIONAL_STATS_COLUMNS = ("reused_from",)
# An error record is {"id", "status", "error": {"code", "message"}, "server", "at"}; read flat as these.
ERROR_COLUMNS = ("id", "code", "message", "server", "at")

SHARD_KINDS = ("completions", "stats", "errors", "shards", "metrics", "events", "gpu", "reuse")


# The deployment's output root: the DAG's default, the root the results view serves and the one runs may write in
# (docs/security-and-ssh.md §6).
OUTPUT_ROOT_VARIABLE = "FLEETGEN_OUTPUT_ROOT"


def default_output_root() -> str:
    """Where runs write unless their conf says otherwise: ``$FLEETGEN_OUTPUT_ROOT`` of the deployment, else
    ``~/fleetgen-output`` (the DAG's default, the results view's root and the workers' allowed root read it here)."""
    return os.environ.get(OUTPUT_ROOT_VARIABLE, "~/fleetgen-output")


def run_folder_name(run_id: str) -> str:
    """A run id as a folder name: Airflow run ids hold ``:`` and ``+``, which some filesystems refuse. A name
    that would not be a plain folder of its own (empty, ``.``, ``..``, hidden) is refused: run ``.`` would write
    into the output root itself, beside every other run."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)
    if not name or name.startswith("."):
        raise ConfigError(f"run id {run_id!r} does not name a folder of its own under the output root",
                          hint="trigger the run with a run id that starts with a letter, a digit or _ "
                               "(Airflow's own, manual__<date>, does)")
    return name


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run's outputs under ``root`` (``<output_root>/<run folder>``)."""

    root: Path

    @classmethod
    def for_run(cls, output_root: str | Path, run_id: str) -> RunLayout:
        return cls(Path(output_root).expanduser() / run_folder_name(run_id))

    @property
    def prompts_identity(self) -> Path:
        return self.root / "prompts.json"

    @property
    def rejects(self) -> Path:
        return self.root / "rejects.jsonl"

    SERVERS_HEALTH = "servers-health.json"

    @property
    def servers_health(self) -> Path:
        return self.root / self.SERVERS_HEALTH

    @property
    def servers_health_lock(self) -> Path:
        return self.root / "servers-health.lock"

    @property
    def failures(self) -> Path:
        return self.root / self.FAILURES

    FAILURES = "failures.jsonl"

    @property
    def validation_dir(self) -> Path:
        return self.root / "validation"

    @property
    def validation_summary(self) -> Path:
        """The verdict ``validate`` wrote (fleetgen.validation.outcome judges it)."""
        return self.validation_dir / "summary.json"

    @property
    def data_docs_dir(self) -> Path:
        return self.validation_dir / "data_docs"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def calibration(self) -> Path:
        """This run's readbacks (one entry per server)."""
        return self.root / "calibration.json"

    @property
    def report_json(self) -> Path:
        return self.report_dir / "report.json"

    @property
    def plan_notes(self) -> Path:
        """What the plan left out or warns about (fleetgen.tuning.plan_notes)."""
        return self.root / "plan-notes.json"

    @property
    def servers_stopped_dir(self) -> Path:
        """Per node, the servers of ours stop_servers found only by their launch marker (another module, no pid
        file): ``<node>.json`` (write_marker_stops / read_marker_stops)."""
        return self.root / "servers-stopped"

    @property
    def candidate_plans(self) -> Path:
        """The tuning trial's candidates: each one's plan for every server and tonight's split
        (fleetgen.tuning.trial_plan)."""
        return self.root / "candidate-plans.json"

    @property
    def workload_plan(self) -> Path:
        """Per server: the request cap and KV pool the run was planned with (fleetgen.tuning.workload_history)."""
        return self.root / "workload_plan.json"

    @property
    def trial_decision(self) -> Path:
        """The tuning trial's decision (fleetgen.tuning.trial.decision_record), or why no trial ran."""
        return self.root / "trial-decision.json"

    TRIAL_BEGAN = "trial-began.json"

    @property
    def trial_began(self) -> Path:
        """When the tuning trial's first shard started, written once (fleetgen.tuning.trial_clock)."""
        return self.root / self.TRIAL_BEGAN

    @property
    def batch_output(self) -> Path:
        """The results as an OpenAI Batch API output file (fleetgen.report.batch_output)."""
        return self.root / "batch" / "output.jsonl"

    @property
    def dataset_dir(self) -> Path:
        """The validated completions as Parquet, one file per shard (docs/output-formats.md §10)."""
        return self.root / "dataset"

    @property
    def batch_errors(self) -> Path:
        """The prompts without a completion as an OpenAI Batch API error file (fleetgen.report.batch_output)."""
        return self.root / "batch" / "errors.jsonl"

    @property
    def server_times_dir(self) -> Path:
        """Per server, when it was launched, kept, ready and stopped in this run (record_server_time)."""
        return self.root / "server-times"

    def gpu_sampler_claim(self, node: str) -> Path:
        """Which shard samples ``node``'s GPUs now (fleetgen.nodes.gpu_sampling.SamplerClaim)."""
        return self.root / self.gpu_sampler_claim_name(node)

    @staticmethod
    def gpu_sampler_claim_name(node: str) -> str:
        return f"gpu/{node}.sampler"

    @property
    def reuse_index(self) -> Path:
        return self.root / "reuse" / "index.npy"

    @property
    def reuse_index_meta(self) -> Path:
        return self.root / "reuse" / "index.json"

    def kind_dir(self, kind: str) -> Path:
        if kind not in SHARD_KINDS:
            raise ValueError(f"unknown per-shard output kind {kind!r}; expected one of {SHARD_KINDS}")
        return self.root / kind

    def shard(self, shard_id: int) -> ShardPaths:
        """One shard's bookkeeping files."""
        return ShardPaths(self, shard_id)

    def shard_file(self, kind: str, shard_id: int) -> Path:
        """One shard's JSONL file of a data kind (completions, stats, errors, metrics, events, gpu, reuse)."""
        return self.kind_dir(kind) / f"{shard_stem(shard_id)}.jsonl"

    def shard_files(self, kind: str) -> list[Path]:
        """Every shard's file of one kind, in shard order."""
        return sorted(self.kind_dir(kind).glob("*.jsonl"))

    def heartbeat_files(self) -> list[Path]:
        """The heartbeats of the shard tries running now, or of tries that died without removing theirs."""
        return sorted(self.kind_dir("shards").glob(f"shard-*.{ShardPaths.HEARTBEAT}"))

    def lost_try_files(self) -> list[Path]:
        """Every shard's record of its tries that died."""
        return sorted(self.kind_dir("shards").glob(f"shard-*.{ShardPaths.LOST_TRIES}"))


def shard_stem(shard_id: int) -> str:
    """A shard's name in every file and object of it: ``shard-NNNNN``."""
    return f"shard-{shard_id:05d}"


@dataclass(frozen=True)
class ShardPaths:
    """The bookkeeping files of one shard in ``shards/`` (its data files: ``RunLayout.shard_file``); every name
    is made here."""

    layout: RunLayout
    shard_id: int

    PLAN = "json"                 # the byte range the shard reads, fixed at its first try
    MARK = "mark.json"            # the resume mark: where the next try starts reading
    LOCK = "lock"                 # flock of the try writing the output
    LEASE = "lease.json"          # which try holds (or has claimed) the output
    HEARTBEAT = "alive"           # the live try's heartbeat, touched while it runs
    LOST_TRIES = "lost.jsonl"     # tries of this shard that died, one record each

    def _bookkeeping(self, suffix: str) -> Path:
        return self.layout.root / self.name(suffix)

    def name(self, suffix: str) -> str:
        """The file's name relative to the run (``shards/shard-NNNNN.<suffix>``), as run_files.py names it."""
        return f"shards/{shard_stem(self.shard_id)}.{suffix}"

    @property
    def plan(self) -> Path:
        return self._bookkeeping(self.PLAN)

    @property
    def mark(self) -> Path:
        return self._bookkeeping(self.MARK)

    @property
    def lock(self) -> Path:
        return self._bookkeeping(self.LOCK)

    @property
    def lease(self) -> Path:
        return self._bookkeeping(self.LEASE)

    @property
    def heartbeat(self) -> Path:
        return self._bookkeeping(self.HEARTBEAT)

    @property
    def lost_tries(self) -> Path:
        return self._bookkeeping(self.LOST_TRIES)


# The files of the output root itself, beside the runs' folders: shared by every run of that root.
CALIBRATION_FILE, TRIAL_HISTORY_FILE = "calibration.json", "tuning-trials.jsonl"
ROOT_FILES = (CALIBRATION_FILE, TRIAL_HISTORY_FILE)


def calibration_file(output_root: str | Path) -> Path:
    """The corrections every run reads and the readiness check updates, shared by the runs of one output root."""
    return Path(output_root).expanduser() / CALIBRATION_FILE


def trial_history_file(output_root: str | Path) -> Path:
    """The tuning trials' decisions across nights (fleetgen.tuning.trial_history), shared by the runs of one root."""
    return Path(output_root).expanduser() / TRIAL_HISTORY_FILE


def run_root_of_report(report_json: str | Path) -> Path:
    """The run folder holding a ``report/report.json``."""
    return Path(report_json).parent.parent


def read_failures(path: Path) -> list[dict]:
    """The records of a run's ``failures.jsonl`` (a torn last line is skipped)."""
    return _jsonl_records(path)


def parse_failures(data: bytes) -> list[dict]:
    """The records of a ``failures.jsonl`` read whole (from an object store); a torn line is skipped."""
    return _parse_records(data.decode("utf-8"))


def _jsonl_records(path: Path) -> list[dict]:
    return _parse_records(path.read_text(encoding="utf-8")) if path.is_file() else []


def _parse_records(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def write_marker_stops(layout: RunLayout, node: str, records: list[dict]) -> list[dict]:
    """Keep, for the report, the stop records of ``node`` that found a server of ours only by its launch marker
    (launched under another ``server.module``, or its pid file gone); returns them."""
    unusual = [{"node": node, **record} for record in records
               if record.get("launched_under_other_module") or record.get("pid_file_missing")]
    if unusual:
        layout.servers_stopped_dir.mkdir(parents=True, exist_ok=True)
        (layout.servers_stopped_dir / f"{node}.json").write_text(json.dumps(unusual, indent=1))
    return unusual


def read_marker_stops(layout: RunLayout) -> list[dict]:
    """Every node's records written by write_marker_stops, by node then port."""
    records = []
    for path in sorted(layout.servers_stopped_dir.glob("*.json")) if layout.servers_stopped_dir.is_dir() else []:
        records += json.loads(path.read_text())
    return records


# What a server's line in server-times/ says happened to it: launched (launch_servers, or wait_ready relaunching it
# smaller), kept (launch_servers passing on one that already ran the plan), ready (wait_ready read /server_info),
# stopped (stop_servers, at the trial's relaunch and at release_servers).
SERVER_TIME_EVENTS = ("launched", "kept", "ready", "stopped")


def record_server_time(layout: RunLayout, server: str, event: str, *, pid: int | None = None,
                       at: float | None = None) -> dict:
    """Append ``event`` of ``server`` ("host:port") at ``at`` (now) to its file in ``server-times/``: one small
    line a write, each server's events written one task after another (one writer at a time per file)."""
    if event not in SERVER_TIME_EVENTS:
        raise ValueError(f"unknown server event {event!r}; expected one of {SERVER_TIME_EVENTS}")
    record = {"server": server, "event": event, "t": round(time.time() if at is None else at, 3), "pid": pid}
    layout.server_times_dir.mkdir(parents=True, exist_ok=True)
    path = layout.server_times_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', server)}.jsonl"
    with path.open("a+b") as handle:
        torn = False
        if handle.seek(0, os.SEEK_END):
            handle.seek(-1, os.SEEK_END)
            torn = handle.read(1) != b"\n"
        handle.write((b"\n" if torn else b"") + json.dumps(record).encode() + b"\n")  # a torn line stays alone
    return record


def read_server_times(layout: RunLayout) -> dict[str, list[dict]]:
    """Every server's recorded events, in time order; a torn last line (a killed task) is skipped."""
    events: dict[str, list[dict]] = {}
    for path in sorted(layout.server_times_dir.glob("*.jsonl")) if layout.server_times_dir.is_dir() else []:
        for record in _jsonl_records(path):
            if isinstance(record, dict) and record.get("event") in SERVER_TIME_EVENTS \
                    and isinstance(record.get("t"), (int, float)):
                events.setdefault(str(record["server"]), []).append(record)
    return {server: sorted(rows, key=lambda row: row["t"]) for server, rows in sorted(events.items())}


@contextmanager
def write_whole(path: Path) -> Iterator:
    """Write ``path`` whole or not at all: a ``.partial`` beside it, renamed over it once written without error; an
    OS error raises ``OutputError`` naming the file (report/batch_output.py, report/parquet_dataset.py)."""
    partial = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with partial.open("wb") as handle:
            yield handle
        os.replace(partial, path)
    except BaseException as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OutputError(f"cannot write {path}: {error.strerror or error}", errno=error.errno, path=str(path),
                              hint="free space where the DAG parameter output_root points (or FLEETGEN_OUTPUT_ROOT), "
                                   "then clear this task") from error
        raise
