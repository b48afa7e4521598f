"""failures.jsonl holds one meaningful record per failed task; the run's outcome names each failed task."""

import json
import re
from types import SimpleNamespace

import pytest

from fleetgen.airflow import failures
from fleetgen.outputs import read_failures
from fleetgen.errors import ConfigError, FailureKind, ServerStartupError


@pytest.fixture(autouse=True)
def deployment_root(tmp_path, monkeypatch):
    """Each test's folder is the deployment's output root, as the output_root its contexts name."""
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))


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


def test_the_first_shards_failure_keeps_its_index_and_its_summary(tmp_path):
    from fleetgen.errors import OutputError

    error = OutputError("cannot write the shard's output", shard=0, hint="free space")
    failures.describe_failure(_context(tmp_path, error, task_id="generate.generate_shard", map_index=0, label=None))
    failures.describe_failure(_context(tmp_path, None, task_id="generate.generate_shard", map_index=0, label=None))
    raised, lost = _lines(tmp_path)
    assert (raised["task"], raised["map_index"], raised["shard"]) == ("generate.generate_shard[0]", 0, 0)
    assert (lost["task"], lost["map_index"]) == ("generate.generate_shard[0]", 0)
    states = {"generate.generate_shard_0": "failed", "generate.generate_shard_1": "success"}
    message = failures.outcome_message(states, read_failures(tmp_path / "manual__1" / "failures.jsonl"))
    assert message.splitlines()[1].startswith("- generate.generate_shard[0]: Airflow marked the task failed")


def test_an_unmapped_task_has_no_index_in_its_name_or_record(tmp_path):
    record = failures.failure_record(_context(tmp_path, ConfigError("bad"), task_id="load_fleet", map_index=-1,
                                              label=None))
    assert record["task"] == "load_fleet" and record["task_id"] == "load_fleet" and "map_index" not in record
    lost = failures.failure_record(_context(tmp_path, None, task_id="load_fleet", map_index=-1, label=None))
    assert lost["task"] == "load_fleet" and "map_index" not in lost


def test_the_outcome_names_the_last_tries_error_of_a_task_that_failed_several_times(tmp_path):
    layout_file = tmp_path / "manual__1" / "failures.jsonl"
    for attempt, reason in [(1, "connection reset"), (2, "timed out"), (3, "Not enough memory")]:
        context = _context(tmp_path, ServerStartupError(reason, server="n1:30001"), map_index=0, label="n1:30001")
        context["task_instance"].try_number = attempt
        failures.describe_failure(context)
    assert [record["try"] for record in read_failures(layout_file)] == [1, 2, 3]
    message = failures.outcome_message({"servers.wait_ready_0": "failed"}, read_failures(layout_file))
    assert message == "1 task(s) of this run failed:\n- servers.wait_ready[n1:30001]: [server n1:30001] Not enough memory"


def test_the_outcome_lists_each_failed_task_in_order_and_only_the_failed_ones():
    records = [{"task": "a[2]", "task_id": "a", "map_index": 2, "first_line": "two"},
               {"task": "a[10]", "task_id": "a", "map_index": 10, "error": "KeyError"},
               {"task": "b", "task_id": "b", "first_line": "bee"},
               {"task": "run_outcome", "task_id": "run_outcome", "first_line": "itself"}]
    states = {"b": "failed", "a_2": "failed", "a_10": "failed", "a_3": "upstream_failed", "c": "success",
              "run_outcome": "failed"}
    assert failures.outcome_message(states, records).splitlines() == [
        "3 task(s) of this run failed:", "- a[10]: KeyError", "- a[2]: two", "- b: bee"]


def test_an_outcome_without_a_failed_task_of_its_own_says_a_task_failed():
    assert failures.outcome_message({"a": "upstream_failed", "run_outcome": "failed"}, []) == (
        "a task of this run failed:")


def test_a_record_of_a_wrapped_error_describes_the_error_fleetgen_raised(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow.context import fail_fast
    from fleetgen.errors import PlanError

    def plan():
        raise PlanError("no plan fits\nsecond line", host="n1", path="/fleet.yaml", hint="lower max_tokens")

    with pytest.raises(AirflowFailException) as caught:
        fail_fast(plan)()
    context = _context(tmp_path, caught.value, task_id="plan", map_index=3, label=None)
    context["task_instance"].try_number = 2
    record = failures.failure_record(context)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record.pop("at"))
    assert record == {"task": "plan[3]", "task_id": "plan", "map_index": 3, "try": 2, "error": "PlanError",
                      "first_line": "[host n1, /fleet.yaml] no plan fits",
                      "message": "no plan fits\nsecond line", "hint": "lower max_tokens", "host": "n1",
                      "path": "/fleet.yaml"}


def test_a_record_of_an_unanticipated_error_keeps_its_first_nonblank_line_and_a_bounded_message(tmp_path):
    error = RuntimeError("\n  \n  CUDA error: device-side assert  \nmore" + "x" * 3000)
    record = failures.failure_record(_context(tmp_path, error, map_index=1, label="n1:30001 (GPU 1)"))
    assert record["error"] == "RuntimeError" and record["first_line"] == "CUDA error: device-side assert"
    assert record["message"] == str(error)[:2000] and len(record["message"]) == 2000
    assert record["hint"] == "this is not an error fleetgen anticipated; read the traceback above"
    assert record["task"] == "servers.wait_ready[n1:30001 (GPU 1)]" and record["map_index"] == 1
    assert not {"host", "server", "shard", "path"} & set(record)


def test_an_error_without_text_is_named_by_its_type():
    record = failures.failure_record({"exception": KeyboardInterrupt(), "task_instance": None})
    assert (record["task"], record["first_line"], record["error"]) == ("?", "KeyboardInterrupt", "KeyboardInterrupt")
    assert failures.first_line("") == "" and failures.first_line(" \n\t\n") == ""
    assert failures.first_line("\n one \n two") == "one"


def test_an_airflow_error_caused_by_something_else_is_recorded_as_itself(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    try:
        try:
            raise KeyError("k")
        except KeyError as cause:
            raise AirflowFailException("wrapped") from cause
    except AirflowFailException as error:
        record = failures.failure_record(_context(tmp_path, error))
    assert record["error"] == "AirflowFailException" and record["first_line"] == "wrapped"
    assert record["hint"] == "this is not an error fleetgen anticipated; read the traceback above"


def test_a_lost_try_of_the_first_shard_is_recorded_with_its_host_and_how_long_it_was_dead(tmp_path):
    from fleetgen.outputs import RunLayout

    layout = RunLayout.for_run(tmp_path, "manual__1")
    lost = {"resumed_at": "2026-01-01T00:10:00+00:00", "shard_id": 0, "try": 2, "host": "w1", "pid": 41,
            "last_beat": "2026-01-01T00:00:00+00:00", "dead_s": 599.6}
    failures.record_lost_try(layout, "generate.generate_shard", lost)
    failures.record_lost_try(layout, "generate.generate_shard", {**lost, "shard_id": 1, "try": 3})
    first, second = read_failures(layout.failures)
    assert first == {
        "at": "2026-01-01T00:10:00+00:00", "task": "generate.generate_shard[0]", "try": 2, "error": "TryLost",
        "message": "the try on w1 (pid 41) stopped heartbeating at 2026-01-01T00:00:00+00:00 without finishing; "
                   "resumed 600 s later",
        "hint": "the worker died or was killed: check that machine (memory, OOM killer, restarts); "
                "[scheduler] task_instance_heartbeat_timeout bounds how long a dead try holds a shard",
        "host": "w1", "task_id": "generate.generate_shard", "map_index": 0,
        "first_line": "the try on w1 (pid 41) stopped heartbeating"}
    assert (second["task"], second["map_index"], second["try"]) == ("generate.generate_shard[1]", 1, 3)
    message = failures.outcome_message({"generate.generate_shard_0": "failed"}, [first, second])
    assert message.splitlines()[1] == "- generate.generate_shard[0]: the try on w1 (pid 41) stopped heartbeating"


def test_a_failure_of_a_run_whose_output_root_is_refused_goes_to_the_log_not_into_that_folder(tmp_path, caplog,
                                                                                               monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path / "deployment"))
    context = _context(tmp_path / "elsewhere", ConfigError("refused"), task_id="load_fleet", map_index=-1, label=None)
    with caplog.at_level("WARNING", logger="fleetgen"):
        failures.describe_failure(context)
    assert not (tmp_path / "elsewhere").exists()
    [warning] = [record.getMessage() for record in caplog.records if "failure summary" in record.getMessage()]
    assert warning.startswith(f"could not append the failure summary (DAG parameter output_root {tmp_path}/elsewhere "
                              f"lies outside the output roots runs may write in")
    assert '"task": "load_fleet"' in warning


def test_a_summary_without_an_output_root_goes_to_the_log(tmp_path, caplog):
    context = _context(tmp_path, ConfigError("bad fleet", hint="fix it"), task_id="load_fleet", map_index=-1,
                       label=None)
    del context["params"]["output_root"]
    with caplog.at_level("WARNING", logger="fleetgen"):
        failures.describe_failure(context)
    [warning] = caplog.records
    assert warning.getMessage().startswith("could not append the failure summary ('output_root'); it was: {")
    assert json.loads(warning.getMessage().split("it was: ", 1)[1])["first_line"] == "bad fleet"
    assert not (tmp_path / "manual__1").exists()


def test_a_summary_of_a_run_whose_id_names_no_folder_goes_to_the_log_not_into_the_output_root(tmp_path, caplog):
    context = _context(tmp_path, ConfigError("bad fleet", hint="fix it"), task_id="load_fleet", map_index=-1,
                       label=None)
    context["run_id"] = "."
    with caplog.at_level("WARNING", logger="fleetgen"):
        failures.describe_failure(context)
    [warning] = caplog.records
    assert warning.getMessage().startswith("could not append the failure summary (run id '.' does not name a folder")
    assert json.loads(warning.getMessage().split("it was: ", 1)[1])["first_line"] == "bad fleet"
    assert not (tmp_path / "failures.jsonl").exists()


def test_a_wrapped_error_of_ours_is_not_summarised_again_in_the_log(tmp_path, caplog):
    from airflow.sdk.exceptions import AirflowFailException

    wrapped = AirflowFailException("bad")
    wrapped.__cause__ = ConfigError("bad")
    with caplog.at_level("INFO", logger="fleetgen"):
        failures.describe_failure(_context(tmp_path, wrapped))
        failures.describe_failure(_context(tmp_path, None))
    [summary] = caplog.records
    assert summary.levelname == "ERROR" and summary.getMessage() == (
        "FAILED servers.wait_ready[n1:30001 (GPU 1)]: Airflow marked the task failed without an error from its code "
        "(its process was lost or killed)\nWhat to check next: clear the task to run it again; if it repeats, read "
        "the scheduler's log for this task instance")
    assert [record["first_line"] for record in _lines(tmp_path)][0] == "bad"


def test_the_run_outcome_fails_the_run_naming_the_failed_tasks(tmp_path, monkeypatch):
    from fleetgen.airflow import context as task_context
    from fleetgen.airflow.run_config import RunConfig

    failures.describe_failure(_context(tmp_path, ConfigError("bad fleet"), task_id="load_fleet", map_index=-1,
                                       label=None))
    asked = []

    class _TaskInstance:
        dag_id, run_id = "fleetgen", "manual__1"

        def get_task_states(self, *, dag_id, run_ids):
            asked.append((dag_id, run_ids))
            return {"manual__1": {"load_fleet": "failed", "run_outcome": "running"}, "manual__0": {"x": "failed"}}

    params = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    params["output_root"] = str(tmp_path)
    monkeypatch.setattr(task_context, "task_context",
                        lambda: {"params": params, "run_id": "manual__1", "ti": _TaskInstance()})
    with pytest.raises(failures.RunFailed) as caught:
        failures.run_outcome()
    assert caught.value.message == "1 task(s) of this run failed:\n- load_fleet: bad fleet"
    assert caught.value.path == str(tmp_path / "manual__1" / "failures.jsonl")
    assert caught.value.hint == "open the Failures link of this task, or the failed task's log"
    assert asked == [("fleetgen", ["manual__1"])]


def test_a_lost_process_record_keeps_when_and_which_try(tmp_path):
    context = _context(tmp_path, None, map_index=2, label=None)
    context["task_instance"].try_number = 3
    record = failures.failure_record(context)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["at"])
    assert (record["task"], record["map_index"], record["try"]) == ("servers.wait_ready[2]", 2, 3)


def test_a_callback_without_a_task_instance_still_records_the_failure(tmp_path):
    context = _context(tmp_path, ConfigError("bad"))
    del context["task_instance"]
    failures.describe_failure(context)
    [record] = _lines(tmp_path)
    assert (record["task"], record["first_line"]) == ("?", "bad") and not {"map_index", "try"} & set(record)


def test_the_first_failure_of_a_run_creates_its_output_folder(tmp_path):
    context = _context(tmp_path, ConfigError("bad"))
    context["params"]["output_root"] = str(tmp_path / "not" / "yet")
    failures.describe_failure(context)
    [record] = read_failures(tmp_path / "not" / "yet" / "manual__1" / "failures.jsonl")
    assert record["first_line"] == "bad"


def test_a_path_given_as_a_path_object_is_recorded_as_text(tmp_path, caplog):
    from pathlib import Path

    error = ConfigError("bad", path=Path("/etc/fleet.yaml"), host="")  # an empty host says nothing: left out
    failures.describe_failure(_context(tmp_path, error))
    [record] = _lines(tmp_path)
    assert record["path"] == "/etc/fleet.yaml" and "host" not in record
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the output root should be")
    context = _context(blocked, error)
    with caplog.at_level("WARNING", logger="fleetgen"):
        failures.describe_failure(context)
        del context["params"]["output_root"]
        failures.describe_failure(context)
    appended, unplaced = (record.getMessage() for record in caplog.records)
    assert re.match(r"could not append the failure summary \(\[Errno \d+\] [^)]*\); it was: \{", appended)
    for message in (appended, unplaced):
        assert json.loads(message.split("it was: ", 1)[1])["path"] == "/etc/fleet.yaml"


def test_a_summary_without_a_task_id_is_left_out_of_the_outcome():
    records = [{"task": "old", "first_line": "an older line"}, {"task": "a", "task_id": "a", "first_line": "x"}]
    assert failures.outcome_message({"a": "failed", "b": "failed"}, records).splitlines() == [
        "2 task(s) of this run failed:", "- a: x", "- b: (no summary recorded; open its log)"]


def test_the_run_outcome_of_a_run_airflow_reports_no_states_for_still_fails(tmp_path, monkeypatch):
    from fleetgen.airflow import context as task_context
    from fleetgen.airflow.run_config import RunConfig

    class _TaskInstance:
        dag_id, run_id = "fleetgen", "manual__1"

        def get_task_states(self, *, dag_id, run_ids):
            return {}

    params = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    params["output_root"] = str(tmp_path)
    monkeypatch.setattr(task_context, "task_context",
                        lambda: {"params": params, "run_id": "manual__1", "ti": _TaskInstance()})
    with pytest.raises(failures.RunFailed) as caught:
        failures.run_outcome()
    assert caught.value.message == "a task of this run failed:"


def test_a_lost_process_without_a_task_instance_is_still_recorded(tmp_path):
    record = failures.failure_record({"exception": None})
    assert record["task"] == "?" and "without an error from its code" in record["first_line"]
    assert not {"try", "map_index"} & set(record)


def test_a_try_that_airflow_retries_leaves_its_line_too_marked_retried(tmp_path):
    error = ConfigError("the first 20 results were all client errors", shard=3)
    failures.describe_retry(_context(tmp_path, error, task_id="generate.generate_shard", map_index=3, label=None))
    failures.describe_failure(_context(tmp_path, error, task_id="generate.generate_shard", map_index=3, label=None))
    retried, final = _lines(tmp_path)
    assert retried["retried"] is True and retried["shard"] == 3 and "retried" not in final
    message = failures.outcome_message({"generate.generate_shard_3": "failed"},
                                       read_failures(tmp_path / "manual__1" / "failures.jsonl"))
    assert message.splitlines()[1].startswith("- generate.generate_shard[3]: [shard 3] the first 20 results")


def test_on_an_object_store_each_failure_is_appended_to_the_runs_object(object_store, store_prefix, monkeypatch,
                                                                          tmp_path):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", store_prefix)
    context = _context(tmp_path, ConfigError("no fleet", hint="set fleet_file"), task_id="load_fleet", map_index=-1,
                       label=None)
    context["params"] = {"output_root": store_prefix, "storage_conn_id": "fleetgen_test_store"}
    failures.describe_failure(context)
    failures.describe_retry(context)
    lines = [json.loads(line) for line in object_store.get("manual__1/failures.jsonl").splitlines()]
    assert [(line["task"], line["first_line"], line.get("retried")) for line in lines] == [
        ("load_fleet", "no fleet", None), ("load_fleet", "no fleet", True)]
    assert not (tmp_path / "manual__1").exists()


def test_a_store_that_refuses_the_failure_line_leaves_it_in_the_log(seaweedfs, store_prefix, monkeypatch, tmp_path,
                                                                     caplog):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", f"s3://no-such-bucket-here/{store_prefix.rsplit('/', 1)[1]}")
    context = _context(tmp_path, ConfigError("no fleet"), task_id="load_fleet", map_index=-1, label=None)
    context["params"] = {"output_root": f"s3://no-such-bucket-here/{store_prefix.rsplit('/', 1)[1]}",
                         "storage_conn_id": "fleetgen_test_store"}
    failures.describe_failure(context)
    assert "could not append the failure summary" in caplog.text and '"task": "load_fleet"' in caplog.text
