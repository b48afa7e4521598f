"""The tuner's data types: the workload, the user's bounds, a server's plan and its command-line flags."""

import math

import pytest

from fleetgen.errors import ConfigError, PlanError
from fleetgen.tuning.plan import ServerPlan, TunerBounds, Workload, format_flag_value

EXPECTED = {"max_running_requests": 48, "max_mamba_cache_size": None, "max_total_num_tokens": 530_968}
BUDGET = [{"item": "weights", "bytes": 54_000_000_000, "note": "index"},
          {"item": "  pre-load free (SGLang baseline)", "bytes": 180_000 << 20, "note": ""}]


def _plan(**changes) -> ServerPlan:
    values = dict(host="node-a", gpu_ids=[0, 1], port=30001, flags={"--mem-fraction-static": 0.85},
                  expected=dict(EXPECTED), budget=[dict(row) for row in BUDGET])
    return ServerPlan(**{**values, **changes})


def _workload(**changes) -> Workload:
    values = dict(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900, prompt_count=10)
    return Workload(**{**values, **changes})


def test_one_request_grows_to_its_longest_prompt_plus_the_whole_output_budget():
    assert _workload().full_context_tokens == 1900 + 4096
    assert _workload().to_dict() == {"max_output_tokens": 4096, "prompt_tokens_mean": 270.0,
                                     "prompt_tokens_max": 1900, "prompt_count": 10}


def test_a_workload_at_its_limits_is_accepted():
    # one output token, every prompt as long as the longest, no prompt at all yet
    workload = _workload(max_output_tokens=1, prompt_tokens_mean=1900, prompt_count=0)
    assert workload.full_context_tokens == 1901
    assert _workload(prompt_tokens_max=1, prompt_tokens_mean=1).prompt_tokens_mean == 1


@pytest.mark.parametrize("changes, message", [
    ({"max_output_tokens": 0}, "workload: max_output_tokens must be a positive integer, got 0"),
    ({"max_output_tokens": 10.0}, "workload: max_output_tokens must be a positive integer, got 10.0"),
    ({"prompt_tokens_max": 0, "prompt_tokens_mean": 0.5}, "workload: prompt_tokens_max must be a positive integer, "
                                                          "got 0"),
    ({"prompt_tokens_mean": 1900.5}, "workload: prompt_tokens_mean must lie in (0, prompt_tokens_max=1900], "
                                     "got 1900.5"),
    ({"prompt_tokens_mean": 0}, "workload: prompt_tokens_mean must lie in (0, prompt_tokens_max=1900], got 0"),
    ({"prompt_tokens_mean": math.nan}, "workload: prompt_tokens_mean must lie in (0, prompt_tokens_max=1900], "
                                       "got nan"),
    ({"prompt_tokens_mean": math.inf, "prompt_tokens_max": 10**9}, "workload: prompt_tokens_mean must lie in "
                                                                  "(0, prompt_tokens_max=1000000000], got inf"),
    ({"prompt_tokens_mean": "270"}, "workload: prompt_tokens_mean must lie in (0, prompt_tokens_max=1900], "
                                    "got '270'"),
    ({"prompt_count": -1}, "workload: prompt_count must be a non-negative integer, got -1"),
    ({"prompt_count": 1.0}, "workload: prompt_count must be a non-negative integer, got 1.0"),
])
def test_a_workload_outside_its_limits_is_a_config_error(changes, message):
    with pytest.raises(ConfigError) as error:
        _workload(**changes)
    assert str(error.value) == message


@pytest.mark.parametrize("name", ["max_output_tokens", "prompt_tokens_max", "prompt_count"])
def test_a_json_true_is_not_a_token_count(name):
    # a plan's inputs come back from JSON: true there is a mistake, not the count 1
    changes = {name: True, "prompt_tokens_mean": 1} if name == "prompt_tokens_max" else {name: True}
    with pytest.raises(ConfigError, match=f"{name} must be a"):
        _workload(**changes)


def test_default_bounds_keep_a_gibibyte_and_plan_every_request_at_full_context():
    bounds = TunerBounds()
    assert (bounds.margin_mib, bounds.max_running_requests, bounds.context_length, bounds.mode) == \
        (1024, None, None, "tuned")
    assert not bounds.bf16_ssm_state and not bounds.no_buffer_radix
    assert bounds.kv_tokens_needed(3, 6000) == 18_000
    assert bounds.kv_tokens_needed(0, 6000) == 0


def test_the_workload_modes_kv_demand_adds_z_standard_deviations_of_the_sum():
    bounds = TunerBounds(kv_tokens_mean=1000.0, kv_tokens_std=300.0, kv_overflow_z=2.0)
    # 16 x 1000 + 2 x sqrt(16) x 300 = 18,400, whatever the full context
    assert bounds.kv_tokens_needed(16, 6000) == 18_400
    # rounded up: 3 x 100.5 = 301.5
    assert TunerBounds(kv_tokens_mean=100.5).kv_tokens_needed(3, 6000) == 302
    assert TunerBounds(kv_tokens_mean=100.0, kv_tokens_std=50.0).kv_tokens_needed(4, 6000) == 400


def test_bounds_at_their_limits_are_accepted():
    bounds = TunerBounds(margin_mib=0, max_running_requests=1, context_length=1, mode="sglang_defaults",
                         kv_tokens_mean=0.5, kv_tokens_std=0, kv_overflow_z=0)
    assert bounds.to_dict()["margin_mib"] == 0 and bounds.to_dict()["mode"] == "sglang_defaults"


@pytest.mark.parametrize("changes, message", [
    ({"margin_mib": -1}, "margin_mib must be a non-negative integer, got -1"),
    ({"margin_mib": 1.5}, "margin_mib must be a non-negative integer, got 1.5"),
    ({"margin_mib": True}, "margin_mib must be a non-negative integer, got True"),
    ({"max_running_requests": 0}, "max_running_requests must be a positive integer, got 0"),
    ({"max_running_requests": True}, "max_running_requests must be a positive integer, got True"),
    ({"context_length": 0}, "context_length must be a positive integer, got 0"),
    ({"context_length": 8192.0}, "context_length must be a positive integer, got 8192.0"),
    ({"mode": "fast"}, "mode must be one of ('tuned', 'sglang_defaults'), got 'fast'"),
    ({"kv_tokens_mean": 0}, "kv_tokens_mean must be a positive number, got 0"),
    ({"kv_tokens_mean": math.inf}, "kv_tokens_mean must be a positive number, got inf"),
    ({"kv_tokens_mean": math.nan}, "kv_tokens_mean must be a positive number, got nan"),
    ({"kv_tokens_std": -0.1}, "kv_tokens_std must be a non-negative number, got -0.1"),
    ({"kv_tokens_std": math.nan}, "kv_tokens_std must be a non-negative number, got nan"),
    ({"kv_tokens_std": math.inf}, "kv_tokens_std must be a non-negative number, got inf"),
    ({"kv_overflow_z": -1}, "kv_overflow_z must be a non-negative number, got -1"),
    ({"kv_overflow_z": "2"}, "kv_overflow_z must be a non-negative number, got '2'"),
])
def test_bounds_outside_their_limits_are_config_errors(changes, message):
    with pytest.raises(ConfigError) as error:
        TunerBounds(**changes)
    assert str(error.value) == f"tuner bounds: {message}"


def test_a_plan_names_its_server_and_round_trips_through_a_dict():
    plan = _plan(attempt=2, mode="sglang_defaults", notes=["a note"], inputs={"options": {"tp_size": 2}})
    assert plan.server == "node-a:30001"
    data = plan.to_dict()
    assert data == {"host": "node-a", "gpu_ids": [0, 1], "port": 30001, "flags": {"--mem-fraction-static": 0.85},
                    "expected": EXPECTED, "budget": BUDGET, "attempt": 2, "mode": "sglang_defaults",
                    "notes": ["a note"], "inputs": {"options": {"tp_size": 2}}, "candidate": "incumbent",
                    "extra_args": None}
    assert ServerPlan.from_dict(data) == plan
    challenger = _plan(candidate="no_speculation", extra_args=["--reasoning-parser", "qwen3"])
    assert ServerPlan.from_dict(challenger.to_dict()) == challenger
    assert challenger.to_dict()["extra_args"] == ["--reasoning-parser", "qwen3"]
    # a plan written before candidates existed is the fleet file's own configuration
    older = {key: value for key, value in data.items() if key not in ("candidate", "extra_args")}
    assert ServerPlan.from_dict(older) == plan
    # the dict is a copy: changing it leaves the plan alone
    data["flags"]["--x"] = 1
    data["gpu_ids"].append(7)
    assert plan.flags == {"--mem-fraction-static": 0.85} and plan.gpu_ids == [0, 1]


def test_a_plan_read_without_its_optional_fields_takes_their_defaults():
    data = {"host": "node-a", "gpu_ids": ["0"], "port": "30001", "flags": {}, "expected": EXPECTED, "budget": []}
    plan = ServerPlan.from_dict(data)
    assert (plan.gpu_ids, plan.port, plan.attempt, plan.mode, plan.notes, plan.inputs) == \
        ([0], 30001, 0, "tuned", [], {})


@pytest.mark.parametrize("data", [{}, {"host": "h"}, None,
                                  {"host": "h", "gpu_ids": [0], "port": "x", "flags": {}, "expected": {},
                                   "budget": []}])
def test_what_is_not_a_plan_is_a_plan_error(data):
    with pytest.raises(PlanError) as error:
        ServerPlan.from_dict(data)
    assert str(error.value).startswith("not a server plan: ")


def test_a_plan_in_an_unknown_mode_or_without_an_expected_value_is_refused():
    with pytest.raises(PlanError) as error:
        _plan(mode="fast")
    assert error.value.host == "node-a"
    assert str(error.value) == "[host node-a] plan mode must be one of ('tuned', 'sglang_defaults'), got 'fast'"
    expected = {"max_total_num_tokens": 1}
    with pytest.raises(PlanError) as error:
        _plan(expected=expected)
    assert str(error.value) == ("[host node-a] plan for port 30001 lacks expected value(s) "
                                "['max_mamba_cache_size', 'max_running_requests']")


def test_a_budget_row_is_found_by_its_name_whatever_its_indentation():
    plan = _plan()
    assert plan.budget_row("pre-load free (SGLang baseline)") == 180_000 << 20
    assert plan.budget_row("weights") == 54_000_000_000
    with pytest.raises(PlanError) as error:
        plan.budget_row("kv cache")
    assert str(error.value) == "[host node-a, server node-a:30001] the plan's budget has no row 'kv cache'"


def test_command_args_are_sorted_with_switches_bare_and_unset_flags_left_out():
    plan = _plan(flags={"--mem-fraction-static": 0.85, "--disable-overlap-schedule": True, "--page-size": 64,
                        "--cuda-graph-max-bs-decode": None, "--enable-metrics": False,
                        "--attention-backend": "triton"})
    assert plan.command_args() == ["--attention-backend", "triton", "--disable-overlap-schedule",
                                   "--mem-fraction-static", "0.85", "--page-size", "64"]


@pytest.mark.parametrize("value, text", [(0.85, "0.85"), (0.8, "0.8"), (0.9, "0.9"), (0.1234, "0.123"),
                                         (0.5, "0.5"), (2.0, "2"), (0.0, "0"), (64, "64"), ("triton", "triton"),
                                         (1.05, "1.05"), (2.0001, "2"), (0.9999, "1")])
def test_flag_values_are_written_as_sglang_reads_them(value, text):
    assert format_flag_value(value) == text
