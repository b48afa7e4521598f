"""WaitReadyOperator's decisions on a readiness event: relaunch smaller, or fail with SGLang's line."""

import json
import logging
import pathlib
from types import SimpleNamespace

import pytest

from fleetgen.airflow.operators import WaitReadyOperator
from fleetgen.airflow.readiness_event import ReadinessEvent, ReadinessStatus
from fleetgen.errors import (AuthenticationRefused, ConfigError, FailureKind, HostKeyMismatch, HostUnreachable,
                             PlanError, ServerError, ServerNotReady, ServerStartupError)
from fleetgen.nodes import readiness
from fleetgen.nodes.fleet import ServerSlot
from fleetgen.outputs import RunLayout, read_server_times
from fleetgen.generate.settings import shard_endpoints
from fleetgen.tuning import (LaunchOptions, ServerPlan, TunerBounds, Workload, backoff, plan_server, profile_model,
                             render_budget_table)
from fleetgen.tuning import planner

SEED_CONFIG = pathlib.Path(__file__).parents[1] / "tuning" / "configs" / "seed-qwen3.6-27b.json"
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--mamba-radix-cache-strategy", "extra_buffer",
             "--context-length", "8192"]
B200 = {"index": 0, "uuid": "GPU-0000", "name": "NVIDIA B200", "total_mib": 183_359, "used_mib": 0,
        "free_mib": 183_359, "processes": []}


def _plan(relaunches: int) -> ServerPlan:
    options = LaunchOptions.from_args(SEED_ARGS)
    plan = plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[B200],
                       profile=profile_model(json.loads(SEED_CONFIG.read_text()), 54_000_000_000, options),
                       options=options, workload=Workload(max_output_tokens=4096, prompt_tokens_mean=270.0,
                                                          prompt_tokens_max=1900, prompt_count=10_000),
                       bounds=TunerBounds())
    for _ in range(relaunches):
        plan = backoff(plan, "oom_kv")
    return plan


def _fatal(plan: ServerPlan, kind: str, line: str) -> dict:
    launched = {"name": "gpu-node-1:30000", "node": "gpu-node-1", "gpu_ids": [0], "pid": 4242,
                "log_path": "/tmp/fleetgen/sglang-30000.log", "plan": plan.to_dict()}
    return ReadinessEvent(status=ReadinessStatus.FATAL, server={"name": launched["name"]},
                          log_path=launched["log_path"], pid=4242, waited_s=12.5,
                          context={"launched": launched, "attempt": plan.attempt}, kind=FailureKind(kind),
                          fatal_line=line, log_tail=["loading", line]).payload()


@pytest.fixture
def operator(monkeypatch):
    op = WaitReadyOperator(task_id="wait_ready", server={}, fleet={})
    relaunched = []
    monkeypatch.setattr(op, "_relaunch_smaller", lambda launched, smaller, line: relaunched.append(smaller))
    # the GPUs looked at again after a memory failure hold nothing foreign (the tests below of that look say)
    monkeypatch.setattr(op, "_fail_if_foreign_holds_memory", lambda *args: None)
    op.relaunched = relaunched
    return op


def test_a_memory_failure_relaunches_one_step_smaller(operator):
    operator.execute_complete({}, _fatal(_plan(0), "oom_kv", "RuntimeError: Not enough memory for KV cache"))
    [smaller] = operator.relaunched
    assert smaller.attempt == 1 and smaller.expected["max_running_requests"] < _plan(0).expected[
        "max_running_requests"]


def test_when_the_planner_has_no_smaller_plan_the_task_fails_with_the_line_and_why(operator):
    plan = _plan(planner.MAX_BACKOFF_ATTEMPTS)
    with pytest.raises(ServerStartupError) as failed:
        operator.execute_complete({}, _fatal(plan, "oom_kv", "RuntimeError: Not enough memory for KV cache"))
    message = str(failed.value)
    assert "died while starting: RuntimeError: Not enough memory for KV cache" in message
    assert f"after {planner.MAX_BACKOFF_ATTEMPTS} relaunch(es); no smaller plan: the server still fails" in message
    assert "check for processes that took GPU memory" in message and not operator.relaunched
    assert failed.value.hint.startswith(FailureKind.OOM_KV.hint)  # still the DAG parameter to change


def test_the_planners_limit_is_the_only_relaunch_limit(operator, monkeypatch):
    monkeypatch.setattr(planner, "MAX_BACKOFF_ATTEMPTS", planner.MAX_BACKOFF_ATTEMPTS + 2)
    plan = _plan(3)
    operator.execute_complete({}, _fatal(plan, "oom_kv", "RuntimeError: Not enough memory for KV cache"))
    assert [smaller.attempt for smaller in operator.relaunched] == [4]


def test_a_failure_no_smaller_plan_can_fix_is_not_relaunched(operator):
    with pytest.raises(ServerStartupError, match="error: unrecognized arguments: --turbo") as failed:
        operator.execute_complete({}, _fatal(_plan(0), "bad_args", "error: unrecognized arguments: --turbo"))
    assert not operator.relaunched and "after 0 relaunch(es);" in str(failed.value)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_the_operator_relaunches_exactly_the_kinds_the_backoff_takes(operator, kind):
    line = f"the {kind.value} line"
    if kind.can_back_off():
        operator.execute_complete({}, _fatal(_plan(0), kind.value, line))
        assert [smaller.attempt for smaller in operator.relaunched] == [1]
    else:
        with pytest.raises(ServerStartupError) as failure:
            operator.execute_complete({}, _fatal(_plan(0), kind.value, line))
        assert operator.relaunched == [] and failure.value.kind == kind.value and failure.value.hint == kind.hint
        assert line in str(failure.value)


@pytest.mark.parametrize("broken, what", [
    ({"status": "starting"}, "ValueError: 'starting' is not a valid ReadinessStatus"),
    ({"kind": "oom_everything"}, "ValueError: 'oom_everything' is not a valid FailureKind"),
    ({"fatal_line": None}, "the readiness event (fatal) lacks fatal_line"),
    ({"context": {"attempt": 0}}, "lacks context.launched, context.attempt"),
    ({"context": {"launched": {}, "attempt": True}}, "lacks context.launched, context.attempt"),
])
def test_an_event_that_cannot_be_read_is_refused_naming_the_server_and_what_is_missing(operator, broken, what):
    event = {**_fatal(_plan(0), "oom_kv", "RuntimeError: Not enough memory"), **broken}
    event = {key: value for key, value in event.items() if value is not None}
    with pytest.raises(ServerError) as refused:
        operator.execute_complete({}, event)
    assert what in str(refused.value) and "gpu-node-1:30000" in str(refused.value)
    assert "same fleetgen version" in str(refused.value) and not operator.relaunched


def test_an_event_survives_the_json_round_trip_with_its_types():
    payload = json.loads(json.dumps(_fatal(_plan(0), "oom_mamba", "RuntimeError: state cache too small")))
    event = ReadinessEvent.from_payload(payload)
    assert event.status is ReadinessStatus.FATAL and event.kind is FailureKind.OOM_MAMBA
    assert (event.attempt, event.launched["pid"], event.waited_s) == (0, 4242, 12.5)
    assert "server_info" not in payload and ReadinessEvent.from_payload(event.payload()) == event


# --- each status decided on arrival, and the relaunch itself ----------------------------------------------------

FLEET = {"nodes": [{"name": "gpu-node-1", "ssh_conn_id": "ssh_node1", "address": "10.0.0.7", "gpus": [0, 1]}],
         "model": {"path": "/models/qwen3.6-27b/"}, "server": {"api_key_conn_id": "sglang_api"}}
LOAD_LINE = "[2026-12-01 14:51:26] Load weight begin. avail mem=160.00 GB"


def _launched(plan: ServerPlan, **changes) -> dict:
    return {"name": "gpu-node-1:30000", "node": "gpu-node-1", "gpu_ids": [0], "pid": 4242, "port": 30000,
            "url": "http://10.0.0.7:30000", "address": "10.0.0.7", "ssh_conn_id": "ssh_node1",
            "log_path": "/tmp/fleetgen/sglang-30000.log", "plan": plan.to_dict(), **changes}


def _event(status: str, *, attempt: int = 0, launched: dict | None = None, **fields) -> dict:
    launched = launched or _launched(_plan(attempt))
    return ReadinessEvent(status=ReadinessStatus(status), server={"name": launched["name"]},
                          log_path=launched["log_path"], pid=launched["pid"], waited_s=fields.pop("waited_s", 95.4),
                          context={"launched": launched, "attempt": attempt}, **fields).payload()


def _server_info(expected: dict, **top) -> dict:
    rank = {"effective_max_running_requests_per_dp": expected["max_running_requests"],
            "max_total_num_tokens": expected["max_total_num_tokens"],
            "max_mamba_cache_size": expected["max_mamba_cache_size"]}
    return {"internal_states": [rank], "max_total_num_tokens": expected["max_total_num_tokens"],
            "context_length": 8192, "version": "0.5.23", "_model_info": {"served_model_name": "qwen"}, **top}


@pytest.fixture
def run_outputs(tmp_path, monkeypatch):
    """Where a readback's calibration is recorded: the output root's shared file and the run's own."""
    from fleetgen.airflow import context

    layout = RunLayout(tmp_path / "run")
    outputs = SimpleNamespace(shared=tmp_path / "calibration.json", run=layout.calibration, layout=layout)
    config = SimpleNamespace(inputs=SimpleNamespace(output_root=str(tmp_path)))
    monkeypatch.setattr(context, "run_context", lambda: ({}, config, layout))
    return outputs


def _ready(event: dict, **operator_kwargs) -> dict:
    operator = WaitReadyOperator(task_id="wait_ready", server={}, fleet=FLEET, **operator_kwargs)
    return operator.execute_complete({}, event)


def test_a_ready_server_gives_its_effective_limits_and_where_it_runs(run_outputs):
    plan = _plan(2)
    result = _ready(_event("ready", attempt=2, launched=_launched(plan), server_info=_server_info(plan.expected),
                           log_tail=[LOAD_LINE, "fired up"]))
    assert {key: result[key] for key in ("server", "host", "port", "url", "gpu_ids", "pid")} == {
        "server": "gpu-node-1:30000", "host": "gpu-node-1", "port": 30000, "url": "http://10.0.0.7:30000",
        "gpu_ids": [0], "pid": 4242}
    assert (result["effective_max_running_requests"], result["max_total_num_tokens"]) == (
        plan.expected["max_running_requests"], plan.expected["max_total_num_tokens"])
    assert result["relaunches"] == 2 and result["expected"] == plan.expected and result["mismatches"] == []
    assert (result["model"], result["kept"], result["waited_s"], result["flags"]) == ("qwen", False, 95.4, plan.flags)
    assert result["launch_id"] is None  # it reported no weight_version: its completions are not checked
    # when it got ready: the end of its loading in the report's GPU-hours
    assert [(e["event"], e["pid"]) for e in read_server_times(run_outputs.layout)["gpu-node-1:30000"]] == [
        ("ready", 4242)]


def test_a_ready_server_gives_the_launch_identity_it_answers_with(run_outputs):
    plan = _plan(0)
    info = _server_info(plan.expected, weight_version="fleetgen/scheduled__1", model_path="/models/qwen")
    result = _ready(_event("ready", launched=_launched(plan), server_info=info, log_tail=[LOAD_LINE]))
    assert result["launch_id"] == "fleetgen/scheduled__1"
    endpoint, = shard_endpoints([result], headroom=1.0, parallel_shards=1)
    assert endpoint.launch_id == "fleetgen/scheduled__1"
    # what the shards re-read from /server_info: the model path, the identity and each planned flag's field
    assert endpoint.launch_fields == result["launch_fields"] == readiness.launch_fields(info, plan.flags)
    assert (result["launch_fields"]["weight_version"], result["launch_fields"]["model_path"]) == \
        ("fleetgen/scheduled__1", "/models/qwen")


def test_a_ready_server_that_differs_from_its_plan_says_how(run_outputs):
    plan = _plan(0)
    info = _server_info({**plan.expected, "max_running_requests": plan.expected["max_running_requests"] - 1})
    result = _ready(_event("ready", launched=_launched(plan, kept=True), server_info=info))
    assert result["mismatches"] == [f"gpu-node-1:30000: max_running_requests: expected "
                                    f"{plan.expected['max_running_requests']}, SGLang reports "
                                    f"{plan.expected['max_running_requests'] - 1} (internal_states[0]."
                                    f"effective_max_running_requests_per_dp)"]
    assert result["kept"] is True and result["relaunches"] == 0


def test_a_server_info_without_a_model_info_has_no_model_name(run_outputs):
    plan = _plan(0)
    info = {key: value for key, value in _server_info(plan.expected).items() if key != "_model_info"}
    assert _ready(_event("ready", launched=_launched(plan), server_info=info))["model"] is None


def test_the_readback_is_recorded_for_the_next_plan_and_for_the_run(run_outputs):
    plan = _plan(0)
    result = _ready(_event("ready", launched=_launched(plan), server_info=_server_info(plan.expected),
                           log_tail=["starting", LOAD_LINE, "fired up"]))
    calibration = result["calibration"]
    key = "NVIDIA B200|0.5.23|qwen3.6-27b|tp1"
    assert calibration["logged_pre_load_bytes"] == 160 * 1024 ** 3 and calibration["gpu_name"] == "NVIDIA B200"
    assert calibration["model"] == "qwen3.6-27b" and calibration["report_line"].startswith(key)
    shared, run = json.loads(run_outputs.shared.read_text()), json.loads(run_outputs.run.read_text())
    assert list(shared) == [key] and list(run) == ["gpu-node-1:30000"]
    assert shared[key]["correction_bytes"] == calibration["correction_bytes"] == run["gpu-node-1:30000"][
        "correction_bytes"]


def test_a_readback_that_cannot_be_recorded_still_leaves_the_server_ready(run_outputs, caplog):
    run_outputs.shared.mkdir()  # a folder where the file should be: the record fails with an OSError
    plan = _plan(0)
    result = _ready(_event("ready", launched=_launched(plan), server_info=_server_info(plan.expected)))
    assert result["calibration"] is None and result["effective_max_running_requests"] > 0
    assert "no calibration for gpu-node-1:30000" in caplog.text


def test_a_server_info_without_limits_fails_naming_the_server(run_outputs):
    with pytest.raises(ServerError, match="internal_states") as failed:
        _ready(_event("ready", server_info={"version": "0.5.23"}))
    assert failed.value.server == "gpu-node-1:30000"


def test_a_host_key_mismatch_fails_the_task_for_good_with_both_fingerprints():
    from airflow.sdk.exceptions import AirflowFailException

    event = _event("host_key_mismatch", error="Host key is not trusted", address="10.0.0.7",
                   expected="ssh-ed25519 SHA256:aaa", received="ssh-ed25519 SHA256:bbb")
    with pytest.raises(AirflowFailException) as failed:
        _ready(event)
    mismatch = failed.value.__cause__
    assert isinstance(mismatch, HostKeyMismatch) and str(failed.value) == str(mismatch)
    assert mismatch.message == ("the host key of 10.0.0.7 does not match connection 'ssh_node1': expected "
                                "ssh-ed25519 SHA256:aaa, received ssh-ed25519 SHA256:bbb")
    assert mismatch.host == "gpu-node-1"


def test_a_key_file_the_triggerer_cannot_read_fails_as_configuration_naming_file_and_connection():
    with pytest.raises(ConfigError) as failed:
        _ready(_event("ssh_credentials", error="No such file or directory", key_file="/keys/id_ed25519"))
    error = failed.value
    assert (error.host, error.path) == ("gpu-node-1", "/keys/id_ed25519")
    assert error.message == ("the key file /keys/id_ed25519 of SSH connection 'ssh_node1' cannot be read on this "
                             "machine: No such file or directory")
    assert "key_file in the extra of the Airflow connection 'ssh_node1'" in error.hint


def test_a_refused_login_fails_naming_the_connection_to_fix_not_the_node_being_down():
    with pytest.raises(AuthenticationRefused) as failed:
        _ready(_event("ssh_credentials", error="Permission denied for user fleet on host 10.0.0.7"))
    error = failed.value
    assert error.message == ("the node refused the login of SSH connection 'ssh_node1': Permission denied for user "
                             "fleet on host 10.0.0.7")
    assert "the Airflow connection 'ssh_node1'" in error.hint and "is the node up" not in error.hint


def test_an_unreachable_node_fails_naming_the_server_and_what_to_raise():
    with pytest.raises(HostUnreachable) as failed:
        _ready(_event("unreachable", error="lost SSH to gpu-node-1 ... last error: OSError: down"))
    error = failed.value
    assert type(error) is HostUnreachable and (error.host, error.server) == ("gpu-node-1", "gpu-node-1:30000")
    assert error.message == ("cannot watch gpu-node-1:30000 (GPU [0], pid 4242): lost SSH to gpu-node-1 ... last "
                             "error: OSError: down")
    assert error.hint == ("is the node up and its sshd running? The server may still be loading: raise wait_ready's "
                          "ssh_reconnect_attempts / ssh_reconnect_budget_s to ride out longer outages")


def test_a_timeout_fails_with_the_wait_and_the_logs_last_lines():
    with pytest.raises(ServerNotReady) as failed:
        _ready(_event("timeout", waited_s=1800.4, log_tail=["loading shard 11 of 12"]))
    error = failed.value
    assert error.message.startswith("gpu-node-1:30000 (GPU [0], pid 4242) not ready after 1800 s; the log last "
                                    "said:\n") and "loading shard 11 of 12" in error.message
    assert (error.host, error.server) == ("gpu-node-1", "gpu-node-1:30000")
    assert error.hint == ("read /tmp/fleetgen/sglang-30000.log on gpu-node-1; raise the DAG parameter "
                          "ready_timeout_s if the model loads slowly")


@pytest.mark.parametrize("status, fields, failure", [
    ("host_key_mismatch", {"error": "e", "address": "a", "expected": "x", "received": "y"}, "AirflowFailException"),
    ("unreachable", {"error": "e"}, "HostUnreachable"),
    ("ssh_credentials", {"error": "e"}, "AuthenticationRefused"),
    ("ssh_credentials", {"error": "e", "key_file": "/k"}, "ConfigError"),
    ("timeout", {}, "ServerNotReady"),
    ("fatal", {"kind": "bad_args", "fatal_line": "error: argument --x"}, "ServerStartupError"),
])
def test_each_status_fails_the_way_it_says(operator, status, fields, failure):
    with pytest.raises(Exception) as failed:
        operator.execute_complete({}, _event(status, **fields))
    assert type(failed.value).__name__ == failure and not operator.relaunched


def test_a_fatal_failure_carries_its_line_kind_tail_and_relaunches():
    launched = _launched(_plan(1))
    event = _event("fatal", attempt=1, launched=launched, kind="port_in_use", fatal_line="Address already in use",
                   log_tail=["starting", "Address already in use"])
    with pytest.raises(ServerStartupError) as failed:
        _ready(event)
    error = failed.value
    assert (error.host, error.server, error.kind, error.fatal_line) == ("gpu-node-1", "gpu-node-1:30000",
                                                                       "port_in_use", "Address already in use")
    assert error.log_tail == ["starting", "Address already in use"] and error.hint == FailureKind.PORT_IN_USE.hint
    assert error.message.startswith("gpu-node-1:30000 (GPU [0], pid 4242) died while starting: Address already in "
                                    "use\n(log /tmp/fleetgen/sglang-30000.log, after 1 relaunch(es); last 2 lines:)")


def test_the_last_relaunch_the_planner_allows_is_made(operator):
    plan = _plan(planner.MAX_BACKOFF_ATTEMPTS - 1)
    operator.execute_complete({}, _fatal(plan, "oom_kv", "RuntimeError: Not enough memory for KV cache"))
    assert [smaller.attempt for smaller in operator.relaunched] == [planner.MAX_BACKOFF_ATTEMPTS]


def test_without_a_hint_from_the_planner_the_kinds_hint_stands(operator, monkeypatch):
    import fleetgen.tuning

    def no_smaller(plan, kind):
        raise PlanError("nothing smaller fits")

    monkeypatch.setattr(fleetgen.tuning, "backoff", no_smaller)
    with pytest.raises(ServerStartupError) as failed:
        operator.execute_complete({}, _fatal(_plan(0), "oom_kv", "RuntimeError: Not enough memory"))
    assert failed.value.hint == FailureKind.OOM_KV.hint and "; no smaller plan: nothing smaller fits" in str(
        failed.value)


def test_a_memory_failure_stops_the_server_and_relaunches_it_smaller_on_the_same_slot(monkeypatch, caplog, tmp_path):
    from airflow.sdk.exceptions import TaskDeferred

    from fleetgen.airflow import lifecycle, node_shell

    calls = []

    class Shell:
        def __init__(self, node, ssh_conn_id):
            calls.append(("shell", node, ssh_conn_id))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append(("closed",))

    def launch(shell, fleet, slot, plan, key, *, run_id):
        assert isinstance(shell, Shell) and fleet.server.api_key_conn_id == "sglang_api"
        calls.append(("launch", slot, plan["attempt"], key, run_id))
        return _launched(ServerPlan.from_dict(plan), pid=5151)

    monkeypatch.setattr(node_shell, "NodeShell", Shell)
    def stop(shell, fleet, ports):
        assert isinstance(shell, Shell) and fleet.model.path == "/models/qwen3.6-27b/"
        calls.append(("stop", ports))

    monkeypatch.setattr(lifecycle, "stop_ports", stop)
    monkeypatch.setattr(lifecycle, "launch_server", launch)
    monkeypatch.setattr(lifecycle, "probe_node", lambda shell, fleet, node: _inventory([]))
    monkeypatch.setattr(lifecycle, "api_key", lambda fleet: f"key of {fleet.server.api_key_conn_id}")
    from fleetgen.airflow import context as airflow_context

    layout = RunLayout(tmp_path / "night_2")
    monkeypatch.setattr(airflow_context, "run_context", lambda: ({"run_id": "night_2"}, None, layout))
    operator = WaitReadyOperator(task_id="wait_ready", server={}, fleet=FLEET, timeout_s=600)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute_complete({}, _event("fatal", attempt=1, launched=_launched(_plan(1)), kind="oom_kv",
                                             fatal_line="RuntimeError: Not enough memory for KV cache"))
    slot = ServerSlot("gpu-node-1", "ssh_node1", "10.0.0.7", (0,), 30000)
    assert calls == [("shell", "gpu-node-1", "ssh_node1"), ("closed",),  # the GPUs looked at again
                     ("shell", "gpu-node-1", "ssh_node1"), ("stop", [30000]), ("launch", slot, 2, "key of sglang_api", "night_2"),
                     ("closed",)]
    smaller = backoff(_plan(1), "oom_kv")
    assert (f"Relaunching gpu-node-1:30000 with a smaller plan (attempt 2 of {planner.MAX_BACKOFF_ATTEMPTS}) after: "
            f"RuntimeError: Not enough memory for KV cache\n{render_budget_table(smaller)}") in caplog.messages
    trigger = deferred.value.trigger
    assert deferred.value.method_name == "execute_complete"
    assert trigger.pid == 5151 and trigger.context["attempt"] == 2 and trigger.context["launched"]["pid"] == 5151
    # launched again, still loading (the report counts its loading from the first launch)
    assert [(e["event"], e["pid"]) for e in read_server_times(layout)["gpu-node-1:30000"]] == [("launched", 5151)]


def test_execute_defers_the_first_launch_as_attempt_zero():
    from airflow.sdk.exceptions import TaskDeferred

    launched = _launched(_plan(0))
    operator = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=FLEET, timeout_s=600)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({})
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.trigger.context == {"launched": launched, "attempt": 0}


def test_the_trigger_gets_the_launch_and_the_templated_settings_as_numbers():
    launched = _launched(_plan(0))
    operator = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=FLEET, timeout_s="900", poll_s=2.5,
                                 ssh_reconnect_attempts="3", ssh_reconnect_budget_s="60",
                                 ssh_command_timeout_s="7")
    trigger = operator._trigger(launched, 2)
    assert trigger.server == {"node": "gpu-node-1", "name": "gpu-node-1:30000", "url": "http://10.0.0.7:30000",
                              "port": 30000, "gpu_ids": [0]}
    assert (trigger.ssh_conn_id, trigger.log_path, trigger.pid) == ("ssh_node1", "/tmp/fleetgen/sglang-30000.log",
                                                                     4242)
    assert (trigger.watch.timeout_s, trigger.watch.poll_s, trigger.api_key_conn_id) == (900.0, 2.5, "sglang_api")
    assert (trigger.watch.reconnect_attempts, trigger.watch.reconnect_budget_s,
            trigger.watch.command_timeout_s) == (3, 60.0, 7.0)
    assert trigger.context == {"launched": launched, "attempt": 2}


def test_the_operator_defaults_are_the_reconnect_modules_and_the_runs_ready_timeout(monkeypatch):
    from fleetgen.airflow import context as airflow_context
    from fleetgen.airflow.run_config import RunConfig
    from fleetgen.nodes import reconnect

    params = {spec.name: spec.default_value() for spec in RunConfig.settings()} | {"ready_timeout_s": 1234}
    monkeypatch.setattr(airflow_context, "run_context", lambda: ({}, RunConfig.from_params(params), None))
    launched = _launched(_plan(0))
    trigger = WaitReadyOperator(task_id="wait_ready", server=launched, fleet=FLEET)._trigger(launched, 0)
    assert (trigger.watch.timeout_s, trigger.watch.poll_s) == (1234.0, 1.0)
    assert (trigger.watch.reconnect_attempts, trigger.watch.reconnect_budget_s, trigger.watch.command_timeout_s) == (
        reconnect.DEFAULT_RECONNECT_ATTEMPTS, reconnect.DEFAULT_RECONNECT_BUDGET_S, reconnect.DEFAULT_COMMAND_TIMEOUT_S)


# --- what the task log says: its first lines are what a person reads of a failed or slow server -----------------

@pytest.fixture
def task_log(caplog):
    caplog.set_level(logging.INFO, logger="fleetgen.airflow.operators")
    return caplog


def test_the_wait_starts_by_naming_the_server_and_its_log(task_log):
    from airflow.sdk.exceptions import TaskDeferred

    operator = WaitReadyOperator(task_id="wait_ready", server=_launched(_plan(0)), fleet=FLEET, timeout_s=600)
    with pytest.raises(TaskDeferred):
        operator.execute({})
    assert task_log.messages == ["Waiting for gpu-node-1:30000 (GPU [0], pid 4242) to become ready; watching "
                                 "/tmp/fleetgen/sglang-30000.log"]


def test_a_ready_server_logs_its_effective_limits_beside_the_expected_ones_and_the_readback(run_outputs, task_log):
    plan = _plan(0)
    expected = plan.expected
    info = _server_info({**expected, "max_total_num_tokens": expected["max_total_num_tokens"] + 16})
    result = _ready(_event("ready", launched=_launched(plan), server_info=info))
    [mismatch] = result["mismatches"]
    assert task_log.messages[0] == f"expected vs effective on gpu-node-1:30000: {mismatch}"
    assert task_log.messages[1] == (
        f"gpu-node-1:30000 ready after 95 s: effective max_running_requests={expected['max_running_requests']}, "
        f"max_total_num_tokens={expected['max_total_num_tokens'] + 16}, max_mamba_cache_size="
        f"{expected['max_mamba_cache_size']} (expected {expected['max_running_requests']}, "
        f"{expected['max_total_num_tokens']}, {expected['max_mamba_cache_size']})")
    assert task_log.messages[2] == f"readback of gpu-node-1:30000: {result['calibration']['report_line']}"


def test_a_readback_that_cannot_be_recorded_is_logged_with_why(run_outputs, task_log):
    run_outputs.shared.mkdir()
    plan = _plan(0)
    _ready(_event("ready", launched=_launched(plan), server_info=_server_info(plan.expected)))
    [warning] = [record.getMessage() for record in task_log.records if record.levelno == logging.WARNING]
    assert warning.startswith(f"no calibration for gpu-node-1:30000: [{run_outputs.shared}] calibration file is "
                              "not readable JSON: [Errno 21] Is a directory")


def test_a_failed_start_logs_the_line_and_what_to_change_first(operator, task_log):
    with pytest.raises(ServerStartupError):
        operator.execute_complete({}, _fatal(_plan(0), "bad_args", "error: unrecognized arguments: --turbo"))
    assert task_log.messages[0] == ("gpu-node-1:30000 (GPU [0], pid 4242) failed to start (bad_args): error: "
                                    f"unrecognized arguments: --turbo\nWhat to change: {FailureKind.BAD_ARGS.hint}")


def test_with_no_smaller_plan_the_log_shows_the_plan_last_launched(operator, task_log):
    plan = _plan(planner.MAX_BACKOFF_ATTEMPTS)
    with pytest.raises(ServerStartupError):
        operator.execute_complete({}, _fatal(plan, "oom_kv", "RuntimeError: Not enough memory for KV cache"))
    assert task_log.messages[1] == f"The plan gpu-node-1:30000 was last launched with:\n{render_budget_table(plan)}"


def test_the_task_shows_its_documentation_unless_given_another():
    from fleetgen.airflow.operators import WAIT_READY_DOC

    assert WaitReadyOperator(task_id="wait_ready", server={}, fleet={}).doc_md == WAIT_READY_DOC
    assert WaitReadyOperator(task_id="wait_ready", server={}, fleet={}, doc_md="mine").doc_md == "mine"


class _NoShell:
    def __init__(self, node, ssh_conn_id):
        self.node = node

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("on_port, replaced", [(5151, True), (4242, False), (None, False)])
def test_a_pid_gone_while_a_later_launch_holds_the_port_says_the_run_was_replaced(monkeypatch, on_port, replaced):
    from fleetgen.airflow import lifecycle, node_shell

    asked = []
    monkeypatch.setattr(node_shell, "NodeShell", _NoShell)
    monkeypatch.setattr(lifecycle, "live_server_of_ours",
                        lambda shell, fleet, port: asked.append((shell.node, port)) or on_port)
    operator = WaitReadyOperator(task_id="wait_ready", server={}, fleet=FLEET)
    event = _event("fatal", kind="exited", fatal_line="the server process exited without a recognised error line")
    with pytest.raises(ServerError) as failed:
        operator.execute_complete({}, event)
    assert asked == [("gpu-node-1", 30000)]
    if replaced:
        assert type(failed.value) is ServerError and "pid file names pid 5151" in str(failed.value)
        assert "replaced by a later run; re-run with a new run" in failed.value.hint
    else:
        assert isinstance(failed.value, ServerStartupError) and "died while starting" in str(failed.value)


def test_a_memory_failure_does_not_ask_who_holds_the_port(monkeypatch, operator):
    from fleetgen.airflow import lifecycle

    monkeypatch.setattr(lifecycle, "live_server_of_ours", lambda *args: pytest.fail("asked the node"))
    operator.execute_complete({}, _event("fatal", kind="oom_kv", fatal_line="RuntimeError: Not enough memory"))
    assert len(operator.relaunched) == 1


def _inventory(processes: list[dict]) -> dict:
    return {"host": "gpu-node-1", "gpus": [{**B200, "processes": processes}]}


@pytest.mark.parametrize("processes, foreign", [
    ([{"pid": 777, "process_name": "python3 train.py", "used_mib": 90_000, "ours": False, "port": None}], True),
    ([{"pid": 4243, "process_name": "sglang::scheduler", "used_mib": 90_000, "ours": True, "port": 30000},
      {"pid": 778, "process_name": "idle", "used_mib": 0, "ours": False, "port": None}], False),
])
def test_a_memory_failure_while_a_foreign_process_holds_the_gpu_fails_at_once_naming_it(monkeypatch, processes,
                                                                                        foreign):
    from fleetgen.airflow import lifecycle, node_shell

    monkeypatch.setattr(node_shell, "NodeShell", _NoShell)
    monkeypatch.setattr(lifecycle, "probe_node", lambda shell, fleet, node: _inventory(processes))
    operator = WaitReadyOperator(task_id="wait_ready", server={}, fleet=FLEET)
    relaunched = []
    monkeypatch.setattr(operator, "_relaunch_smaller", lambda launched, smaller, line: relaunched.append(smaller))
    event = _event("fatal", kind="oom_kv", fatal_line="RuntimeError: Not enough memory for KV cache")
    if not foreign:
        operator.execute_complete({}, event)
        assert len(relaunched) == 1
        return
    with pytest.raises(ServerStartupError) as failed:
        operator.execute_complete({}, event)
    assert relaunched == []
    assert "pid 777 (python3 train.py, 90000 MiB on GPU 0)" in str(failed.value)
    assert failed.value.hint.startswith("free the GPUs (stop pid 777") and failed.value.kind == "oom_kv"
