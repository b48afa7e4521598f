"""What a failed task leaves for on-call: one summary in the log and a line in ``failures.jsonl``; and the
run's outcome naming every failed task with its first error line."""

from __future__ import annotations

import datetime
import json
import logging

import jsonlines
import orjson

from fleetgen.airflow.run_config import run_layout
from fleetgen.errors import ConfigError, FleetgenError, StoreError
from fleetgen.outputs import RunLayout, read_failures, run_folder_name
from fleetgen.storage.location import STORAGE_CONN_PARAMETER, is_object_location, parse_location

log = logging.getLogger("fleetgen")

OUTCOME_TASK = "run_outcome"
_UNANTICIPATED = "this is not an error fleetgen anticipated; read the traceback above"
_NO_EXCEPTION = "Airflow marked the task failed without an error from its code (its process was lost or killed)"


def _dumps(record: dict) -> bytes:
    return orjson.dumps(record, default=str)


class RunFailed(FleetgenError):
    """The run's outcome: at least one task failed (each is named in the message)."""


def _unwrap(exception):
    if exception is not None and isinstance(exception.__cause__, FleetgenError):
        return exception.__cause__  # unwrapped from AirflowFailException by fail_fast
    return exception


def first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def failure_record(context) -> dict:
    """The failed task, its error and what to check next, from the Airflow callback context.

    Keys without a value are left out: every line of ``failures.jsonl`` says something."""
    exception = _unwrap(context.get("exception"))
    ti = context.get("task_instance")
    map_index = getattr(ti, "map_index", -1)
    label = getattr(ti, "rendered_map_index", None) or (str(map_index) if map_index >= 0 else None)
    task_id = getattr(ti, "task_id", "?")
    ours = isinstance(exception, FleetgenError)
    if exception is None:  # failed by Airflow itself (process lost or killed), not by an exception of ours
        return _without_empty({"at": _now(), "task": f"{task_id}[{label}]" if label else task_id, "task_id": task_id,
                               "map_index": map_index if map_index >= 0 else None,
                               "try": getattr(ti, "try_number", None), "first_line": _NO_EXCEPTION,
                               "hint": "clear the task to run it again; if it repeats, read the scheduler's log "
                                       "for this task instance"})
    record = {"at": _now(),
              "task": f"{task_id}[{label}]" if label else task_id, "task_id": task_id,
              "map_index": map_index if map_index >= 0 else None, "try": getattr(ti, "try_number", None),
              "error": type(exception).__name__, "first_line": first_line(exception) or type(exception).__name__,
              "message": (getattr(exception, "message", None) or str(exception))[:2000],
              "hint": exception.hint if ours else _UNANTICIPATED,
              "host": getattr(exception, "host", None), "server": getattr(exception, "server", None),
              "shard": getattr(exception, "shard", None), "path": getattr(exception, "path", None)}
    return _without_empty(record)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _without_empty(record: dict) -> dict:
    return {key: value for key, value in record.items() if value not in (None, "")}


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
                     "host": lost["host"], "task_id": task, "map_index": lost["shard_id"],
                     "first_line": f"the try on {lost['host']} (pid {lost['pid']}) stopped heartbeating"})


def describe_failure(context) -> None:
    """on_failure_callback: one record an on-call engineer can act on, appended to ``<run output>/failures.jsonl``
    (and a summary in the log when the error is not one of ours, whose message already says it all). The
    run's outcome task is not a failure of its own."""
    _describe(context)


def describe_retry(context) -> None:
    """on_retry_callback: a failed try that Airflow retries leaves its line too (``"retried": true``), so the
    Failures link shows every failed try, also of a task whose last try succeeded."""
    _describe(context, retried=True)


def _describe(context, *, retried: bool = False) -> None:
    ti = context.get("task_instance")
    if getattr(ti, "task_id", None) == OUTCOME_TASK:
        return
    record = failure_record(context)
    if retried:
        record["retried"] = True
    if not isinstance(_unwrap(context.get("exception")), FleetgenError):
        # Our errors already print what failed and what to check in the exception above: summarise only the others.
        log.error("FAILED %s: %s\nWhat to check next: %s", record["task"], record["first_line"],
                  record.get("hint", _UNANTICIPATED))
    try:  # the run's own rule for its folder (run_config.run_layout): a refused output_root gets no file either
        root = parse_location(context["params"]["output_root"], parameter="output_root")
        if is_object_location(root):
            _append_on_store(root, context, record)
            return
        layout = run_layout(root, context["run_id"])
    except (KeyError, ConfigError, StoreError) as error:  # no output_root, a refused one, a run id naming no folder
        # of its own, a store that does not answer
        log.warning("could not append the failure summary (%s); it was: %s", error, json.dumps(record, default=str))
        return
    _append(layout, record)


def _append_on_store(root, context, record: dict) -> None:
    """The line appended to the run's ``failures.jsonl`` object: the object replaced only as it was read
    (``If-Match``), so that failures recorded side by side keep each other's lines."""
    from fleetgen.airflow.run_config import check_object_root
    from fleetgen.airflow.run_storage import connect
    from fleetgen.storage.run_files import ObjectRunFiles

    check_object_root(root, context["run_id"])
    store = connect(root, context["params"][STORAGE_CONN_PARAMETER], "output_root")
    line = _dumps(record) + b"\n"
    ObjectRunFiles(store.below(run_folder_name(context["run_id"]))).update(
        RunLayout.FAILURES, lambda old: (old or b"") + (b"\n" if old and not old.endswith(b"\n") else b"") + line)


def outcome_message(task_states: dict[str, str], records: list[dict]) -> str:
    """Every failed task of the run (``task_states``: Airflow's ``task_id`` or ``task_id_<map index>`` ->
    state) with the first error line ``failures.jsonl`` holds for it (the last try's)."""
    by_key = {}
    for record in records:
        key = record.get("task_id", "?") + (f"_{record['map_index']}" if record.get("map_index") is not None else "")
        by_key[key] = record
    failed = sorted(key for key, state in task_states.items() if state == "failed" and key != OUTCOME_TASK)
    lines = [f"{len(failed)} task(s) of this run failed:" if failed else "a task of this run failed:"]
    for key in failed:
        record = by_key.get(key)
        lines.append(f"- {record['task']}: {record.get('first_line', record.get('error'))}" if record
                     else f"- {key}: (no summary recorded; open its log)")
    return "\n".join(lines)


def run_outcome() -> None:
    """Runs only when a task failed: names the failed tasks and their first error line, and keeps the run failed
    (the `release_servers` clean-up, which runs whatever happened, may have succeeded). The *Failures* link lists
    every failure of the run with what to check next.
    """
    from fleetgen.airflow.context import run_context

    context, _, layout = run_context()
    ti = context["ti"]
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    message = outcome_message(states, read_failures(layout.failures))
    raise RunFailed(message, path=str(layout.failures),
                    hint="open the Failures link of this task, or the failed task's log")
