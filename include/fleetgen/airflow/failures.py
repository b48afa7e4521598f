"""What a failed task leaves for on-call: one summary in the log and a line in ``failures.jsonl``."""

from __future__ import annotations

import datetime
import json
import logging

import jsonlines
import orjson

from fleetgen.errors import FleetgenError
from fleetgen.outputs import RunLayout

log = logging.getLogger("fleetgen")


def _dumps(record: dict) -> bytes:
    return orjson.dumps(record, default=str)


def run_outcome() -> None:
    """Runs only when a task failed (trigger rule one_failed): keeps the run failed although the
    release_servers clean-up, a leaf that runs whatever happened, succeeded."""
    raise FleetgenError("a task of this run failed; see the first failed task's log for what broke and what to check")


def _unwrap(exception):
    if exception is not None and isinstance(exception.__cause__, FleetgenError):
        return exception.__cause__  # unwrapped from AirflowFailException by fail_fast
    return exception


def failure_record(context) -> dict:
    """The failed task, its error and what to check next, from the Airflow callback context."""
    exception = _unwrap(context.get("exception"))
    ti = context.get("task_instance")
    where = f"{ti.task_id}[{ti.map_index}]" if ti is not None and ti.map_index >= 0 else getattr(ti, "task_id", "?")
    ours = isinstance(exception, FleetgenError)
    return {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "task": where,
            "try": getattr(ti, "try_number", None), "error": type(exception).__name__,
            "message": getattr(exception, "message", str(exception))[:2000],
            "hint": exception.hint if ours else "this is not an error fleetgen anticipated; read the traceback above",
            "host": getattr(exception, "host", None), "server": getattr(exception, "server", None),
            "shard": getattr(exception, "shard", None), "path": getattr(exception, "path", None), "ours": ours}


def _append(layout: RunLayout, record: dict) -> None:
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        with layout.failures.open("ab") as handle, jsonlines.Writer(handle, dumps=_dumps) as failures:
            failures.write(record)
    except OSError as error:
        log.warning("could not append the failure summary (%s); it was: %s", error, json.dumps(record, default=str))


def record_lost_try(layout: RunLayout, task: str, lost: dict) -> None:
    """The failure line of a try that was killed (no callback of its own ran): found by the next try
    of its shard from the heartbeat it left (``fleetgen.generate.liveness``)."""
    _append(layout, {"at": lost["resumed_at"], "task": f"{task}[{lost['shard_id']}]", "try": lost["try"],
                     "error": "TryLost",
                     "message": f"the try on {lost['host']} (pid {lost['pid']}) stopped heartbeating at "
                                f"{lost['last_beat']} without finishing; resumed {lost['dead_s']:.0f} s later",
                     "hint": "the worker died or was killed: check that machine (memory, OOM killer, restarts); "
                             "[scheduler] task_instance_heartbeat_timeout bounds how long a dead try holds a shard",
                     "host": lost["host"], "server": None})


def describe_failure(context) -> None:
    """on_failure_callback: one short summary an on-call engineer can act on, in the log and appended
    to ``<run output>/failures.jsonl``."""
    record = failure_record(context)
    exception = _unwrap(context.get("exception"))
    if record.pop("ours"):
        log.error("FAILED %s: %s", record["task"], exception)
    else:
        log.error("FAILED %s: %s: %s\nWhat to check next: %s", record["task"], record["error"], exception,
                  record["hint"])
    try:
        layout = RunLayout.for_run(context["params"]["output_root"], context["run_id"])
    except KeyError as error:
        log.warning("could not append the failure summary (%s); it was: %s", error, json.dumps(record, default=str))
        return
    _append(layout, record)
