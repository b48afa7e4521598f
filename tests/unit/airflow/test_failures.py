"""failures.jsonl holds one meaningful record per failed task; the run's outcome names each failed task."""

import json
from types import SimpleNamespace

import pytest

from fleetgen.airflow import failures
from fleetgen.outputs import read_failures
from fleetgen.errors import ConfigError, FailureKind, ServerStartupError


def _context(tmp_path, exception, task_id="servers.wait_ready", map_index=1, label="n1:30001 (GPU 1)"):
    ti = SimpleNamespace(task_id=task_id, map_index=map_index, rendered_map_index=label, try_number=1)
    return {"exception": exception, "task_instance": ti, "params": {"output_root": str(tmp_path)},
            "run_id": "manual__1"}


def _lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "manual__1" / "failures.jsonl").read_text().splitlines()]


def test_a_record_names_the_server_and_the_parameter_and_has_no_empty_field(tmp_path):
    error = ServerStartupError("n1:30001 (GPU [1], pid 9) died while starting: Not enough memory\n(log ...)",
                               host="n1", server="n1:30001", kind="oom_kv", hint=FailureKind.OOM_KV.hint)
    failures.describe_failure(_context(tmp_path, error))
    [record] = _lines(tmp_path)
    assert record["task"] == "servers.wait_ready[n1:30001 (GPU 1)]" and record["server"] == "n1:30001"
    assert record["first_line"].endswith("died while starting: Not enough memory")
    assert "max_running_requests" in record["hint"] and "--max-running-requests" in record["hint"]
    assert None not in record.values() and "" not in record.values()


def test_the_outcome_task_adds_no_line(tmp_path):
    failures.describe_failure(_context(tmp_path, ConfigError("x"), task_id="load_fleet", map_index=-1, label=None))
    failures.describe_failure(_context(tmp_path, failures.RunFailed("y"), task_id="run_outcome", map_index=-1,
                                       label=None))
    [record] = _lines(tmp_path)
    assert record["task"] == "load_fleet" and "hint" not in record and "map_index" not in record


def test_the_outcome_names_each_failed_task_with_its_first_error_line(tmp_path):
    error = ServerStartupError("n1:30001 died while starting: Not enough memory\nmore", server="n1:30001")
    failures.describe_failure(_context(tmp_path, error))
    states = {"load_fleet": "success", "servers.wait_ready_0": "success", "servers.wait_ready_1": "failed",
              "generate.generate_shard_0": "failed", "run_outcome": "running"}
    message = failures.outcome_message(states, read_failures(tmp_path / "manual__1" / "failures.jsonl"))
    assert message.splitlines() == [
        "2 task(s) of this run failed:",
        "- generate.generate_shard_0: (no summary recorded; open its log)",
        "- servers.wait_ready[n1:30001 (GPU 1)]: [server n1:30001] n1:30001 died while starting: Not enough memory",
    ]


@pytest.mark.parametrize("kind", [k for k in FailureKind if k.can_back_off()])
def test_memory_hints_name_a_dag_parameter_and_the_flag_it_drives(kind):
    assert "DAG parameter" in kind.hint and "--" in kind.hint


def test_a_task_failed_by_airflow_itself_is_recorded_without_none(tmp_path):
    failures.describe_failure(_context(tmp_path, None, label=None))
    [record] = _lines(tmp_path)
    assert record["task"] == "servers.wait_ready[1]" and "without an error from its code" in record["first_line"]
    assert "None" not in json.dumps(record) and "error" not in record


def test_a_startup_failure_says_what_to_check_before_the_log_tail():
    from fleetgen.nodes.readiness import format_log_excerpt

    tail = ["server_args=ServerArgs(" + "x" * 5000 + ")", "RuntimeError: Not enough memory."]
    error = ServerStartupError(f"n1:30001 died while starting: Not enough memory.\n(log /l)\n{format_log_excerpt(tail)}",
                               server="n1:30001", hint=FailureKind.OOM_KV.hint)
    lines = str(error).splitlines()
    assert lines[0] == "[server n1:30001] n1:30001 died while starting: Not enough memory."
    assert lines[1].startswith("What to check next:") and "DAG parameter max_running_requests" in lines[1]
    assert max(len(line) for line in lines) < 500 and lines[-1].endswith("Not enough memory.")


def test_the_summary_is_logged_once(tmp_path, caplog):
    error = ServerStartupError("died", server="n1:30001", hint=FailureKind.OOM_KV.hint)
    with caplog.at_level("INFO", logger="fleetgen"):
        failures.describe_failure(_context(tmp_path, error))  # the exception's own text already says it
        assert caplog.records == []
        failures.describe_failure(_context(tmp_path, KeyError("x")))
    [summary] = caplog.records
    assert summary.getMessage().startswith("FAILED servers.wait_ready[n1:30001 (GPU 1)]: 'x'")
