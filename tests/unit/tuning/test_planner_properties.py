"""The plan search takes the tightest cap; the read-back flags any difference, more as well as less."""

import pytest

from fleetgen.nodes.readiness import parse_server_info
from fleetgen.tuning.planner import TunerBounds, compare_expected, plan_server


def _plan(cases, profile, options, bounds):
    return plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                       options=options, workload=cases.SEED_WORKLOAD, bounds=bounds)


@pytest.mark.parametrize("bound, mamba_cache, requests", [(24, 100, 20), (24, 102, 20), (24, 200, 24), (18, 500, 18)])
def test_the_tightest_of_several_caps_binds(cases, seed_profile, seed_options, bound, mamba_cache, requests):
    # The seed model keeps 5 state slots per request: --max-mamba-cache-size K caps requests at K // 5.
    options = seed_options.replace(max_mamba_cache_size=mamba_cache)
    plan = _plan(cases, seed_profile, options, TunerBounds(max_running_requests=bound))
    assert plan.expected["max_running_requests"] == requests
    assert plan.flags["--max-running-requests"] == requests
    assert type(plan.expected["max_running_requests"]) is int


def _agreeing(plan):
    state = {"effective_max_running_requests_per_dp": plan.expected["max_running_requests"],
             "max_mamba_cache_size": plan.expected["max_mamba_cache_size"]}
    return {"max_total_num_tokens": plan.expected["max_total_num_tokens"], "internal_states": [state]}


def _compare(plan, body):
    return compare_expected(plan, parse_server_info(body, server=plan.server))


@pytest.fixture
def seed_plan(cases, seed_profile, seed_options):
    return _plan(cases, seed_profile, seed_options, TunerBounds())


@pytest.mark.parametrize("delta", [-1, +1])
@pytest.mark.parametrize("field, where", [
    ("effective_max_running_requests_per_dp", "internal_states"),
    ("max_mamba_cache_size", "internal_states"),
    ("max_total_num_tokens", "top"),
])
def test_more_than_planned_is_flagged_as_well_as_less(seed_plan, field, where, delta):
    info = _agreeing(seed_plan)
    holder = info["internal_states"][0] if where == "internal_states" else info
    holder[field] += delta
    name = {"effective_max_running_requests_per_dp": "max_running_requests"}.get(field, field)
    source = f"internal_states[0].{field}" if where == "internal_states" else field
    assert _compare(seed_plan, info) == [
        f"gpu-node-1:30000: {name}: expected {holder[field] - delta}, SGLang reports {holder[field]} ({source})"]


def test_every_data_parallel_rank_is_compared(seed_plan):
    info = _agreeing(seed_plan)
    rank_one = dict(info["internal_states"][0], effective_max_running_requests_per_dp=1)
    info["internal_states"].append(rank_one)
    assert _compare(seed_plan, info) == [
        f"gpu-node-1:30000: max_running_requests: expected {seed_plan.expected['max_running_requests']}, "
        "SGLang reports 1 (internal_states[1].effective_max_running_requests_per_dp)"]


def test_rank_token_count_is_used_only_without_a_top_level_one(seed_plan):
    info = _agreeing(seed_plan)
    info["internal_states"][0]["max_total_num_tokens"] = 1
    assert _compare(seed_plan, info) == []
    del info["max_total_num_tokens"]
    assert _compare(seed_plan, info) == [
        f"gpu-node-1:30000: max_total_num_tokens: expected {seed_plan.expected['max_total_num_tokens']}, "
        "SGLang reports 1 (internal_states[0].max_total_num_tokens)"]
