"""WaitReadyOperator's decisions on a readiness event: relaunch smaller, or fail with SGLang's line."""

import json
import pathlib

import pytest

from fleetgen.airflow.operators import WaitReadyOperator
from fleetgen.airflow.readiness_event import ReadinessEvent, ReadinessStatus
from fleetgen.errors import FailureKind, ServerError, ServerStartupError
from fleetgen.tuning import LaunchOptions, ServerPlan, TunerBounds, Workload, backoff, plan_server, profile_model
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
