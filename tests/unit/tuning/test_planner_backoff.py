"""Closing the loop: reading back /server_info and backing off after a memory failure."""

import json

import pytest

from fleetgen.errors import PlanError
from fleetgen.errors import ServerError
from fleetgen.nodes.readiness import parse_server_info
from fleetgen.tuning import MAX_BACKOFF_ATTEMPTS, ServerPlan, TunerBounds, backoff, compare_expected, plan_server


@pytest.fixture
def seed_plan(cases, seed_profile, seed_options):
    return plan_server(host="gpu-node-1", gpu_ids=[2], port=30002, gpus=[cases.gpu_row(2)], profile=seed_profile,
                       options=seed_options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds())


def _server_info(plan, **overrides):
    return parse_server_info(_server_info_body(plan, **overrides), server=plan.server)


def _server_info_body(plan, **overrides):
    state = {"effective_max_running_requests_per_dp": plan.expected["max_running_requests"],
             "max_mamba_cache_size": plan.expected["max_mamba_cache_size"], "max_running_requests": 999}
    info = {"max_running_requests": 999, "max_total_num_tokens": plan.expected["max_total_num_tokens"],
            "internal_states": [state]}
    for key, value in overrides.items():
        if key in state:
            state[key] = value
        else:
            info[key] = value
    return info


def test_agreeing_server_info_gives_no_lines(seed_plan):
    assert compare_expected(seed_plan, _server_info(seed_plan)) == []


def test_mismatches_name_the_field_and_the_source(seed_plan):
    lines = compare_expected(seed_plan, _server_info(seed_plan, effective_max_running_requests_per_dp=40,
                                                     max_total_num_tokens=123))
    assert len(lines) == 2
    assert lines[0].startswith("gpu-node-1:30002: max_running_requests: expected ")
    assert "SGLang reports 40 (internal_states[0].effective_max_running_requests_per_dp)" in lines[0]
    assert "max_total_num_tokens" in lines[1] and "SGLang reports 123" in lines[1]


def test_missing_fields_are_reported(seed_plan):
    with pytest.raises(ServerError, match="no internal_states"):
        parse_server_info({}, server=seed_plan.server)
    body = _server_info_body(seed_plan)
    del body["internal_states"][0]["max_mamba_cache_size"]
    lines = compare_expected(seed_plan, parse_server_info(body, server=seed_plan.server))
    assert lines == [f"{seed_plan.server}: max_mamba_cache_size: expected {seed_plan.expected['max_mamba_cache_size']}, "
                     "/server_info has no internal_states[0].max_mamba_cache_size"]


def test_more_than_planned_is_a_mismatch_too(seed_plan):
    more = seed_plan.expected["max_running_requests"] + 1
    lines = compare_expected(seed_plan, _server_info(seed_plan, effective_max_running_requests_per_dp=more))
    assert lines == [f"{seed_plan.server}: max_running_requests: expected {more - 1}, SGLang reports {more} "
                     "(internal_states[0].effective_max_running_requests_per_dp)"]


def test_every_data_parallel_rank_is_read_and_checked(seed_plan):
    body = _server_info_body(seed_plan)
    del body["max_total_num_tokens"]
    rank = dict(body["internal_states"][0], max_total_num_tokens=seed_plan.expected["max_total_num_tokens"])
    body["internal_states"] = [rank, dict(rank, effective_max_running_requests_per_dp=7, max_mamba_cache_size=35)]
    info = parse_server_info(body, server=seed_plan.server)
    assert info.effective_max_running_requests == seed_plan.expected["max_running_requests"] + 7
    assert info.max_mamba_cache_size == seed_plan.expected["max_mamba_cache_size"] + 35
    assert info.max_total_num_tokens == 2 * seed_plan.expected["max_total_num_tokens"]
    lines = compare_expected(seed_plan, info)
    assert [line.split("(")[-1] for line in lines] == ["internal_states[1].effective_max_running_requests_per_dp)",
                                                      "internal_states[1].max_mamba_cache_size)"]


@pytest.mark.parametrize("kind", ["oom_kv", "oom_mamba"])
def test_request_failures_step_down_ten_percent(seed_plan, kind):
    smaller = backoff(seed_plan, kind)
    before = seed_plan.expected["max_running_requests"]
    assert smaller.attempt == 1
    assert smaller.expected["max_running_requests"] == int(before * 0.9)
    assert smaller.flags["--max-mamba-cache-size"] == 5 * smaller.expected["max_running_requests"]
    assert smaller.port == seed_plan.port and smaller.gpu_ids == seed_plan.gpu_ids
    assert any(f"backed off after {kind}" in note for note in smaller.notes)


@pytest.mark.parametrize("kind", ["oom_cuda_graph", "oom_runtime"])
def test_activation_failures_free_more_memory(seed_plan, kind):
    smaller = backoff(seed_plan, kind)
    assert smaller.flags["--mem-fraction-static"] < seed_plan.flags["--mem-fraction-static"]
    assert smaller.expected["max_running_requests"] <= seed_plan.expected["max_running_requests"]
    margin = next(r["bytes"] for r in smaller.budget if r["item"].strip() == "user margin")
    assert margin == (1024 << 20) + (2 << 30)


def test_weights_failure_assumes_less_free_memory(seed_plan):
    smaller = backoff(seed_plan, "oom_weights")
    pre = [next(r["bytes"] for r in p.budget if r["item"].startswith("pre-load free")) for p in (seed_plan, smaller)]
    assert pre[1] == pre[0] - (2 << 30)
    assert smaller.expected["max_running_requests"] < seed_plan.expected["max_running_requests"]


def test_backoff_survives_the_xcom_round_trip_and_gives_up_after_three(seed_plan):
    plan = seed_plan
    for attempt in range(1, MAX_BACKOFF_ATTEMPTS + 1):
        plan = backoff(ServerPlan.from_dict(json.loads(json.dumps(plan.to_dict()))), "oom_mamba")
        assert plan.attempt == attempt
    with pytest.raises(PlanError, match="after 3 smaller relaunches"):
        backoff(plan, "oom_mamba")


def test_backoff_refuses_what_it_cannot_shrink(cases, seed_plan, seed_profile, seed_options):
    with pytest.raises(PlanError, match="unknown failure kind"):
        backoff(seed_plan, "segfault")
    one = plan_server(host="h", gpu_ids=[0], port=1, gpus=[cases.gpu_row(0)], profile=seed_profile,
                      options=seed_options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds(max_running_requests=1))
    with pytest.raises(PlanError, match="even with 1 running request"):
        backoff(one, "oom_kv")
    auto = plan_server(host="h", gpu_ids=[0], port=1, gpus=[cases.gpu_row(0)], profile=seed_profile,
                       options=seed_options, workload=cases.SEED_WORKLOAD, bounds=TunerBounds(mode="sglang_defaults"))
    with pytest.raises(PlanError, match="automatic sizing"):
        backoff(auto, "oom_kv")
