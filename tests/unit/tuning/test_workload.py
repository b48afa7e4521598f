"""Workload mode: the KV demand, the night-by-night step (bounded, step back, pin) and its table rows."""

import math
import random

import pytest

from fleetgen.errors import ConfigError
from fleetgen.tuning.budget import render_budget_table
from fleetgen.tuning.planner import TunerBounds, plan_server
from fleetgen.tuning.workload import (OVERFLOW_Z, RETRACTION_BOUND, KvDemand, RunObservation, decode_reserve_tokens,
                                      next_cap, plan_workload_server, step_size)


def _seed_demand() -> KvDemand:
    rng = random.Random(7)
    prompts = [rng.randint(150, 450) for _ in range(3000)]
    outputs = [min(4096, max(2, round(rng.gammavariate(4.0, 660.0)))) for _ in range(3000)]
    return KvDemand.from_lengths(prompts, outputs, page_size=1, reserve_tokens=8)


def _planner(cases, profile, options):
    def plan_with(bounds):
        return plan_server(host="gpu-node-1", gpu_ids=[0], port=30000, gpus=[cases.gpu_row(0)], profile=profile,
                           options=options, workload=cases.SEED_WORKLOAD, bounds=bounds)
    return plan_with


def _observation(cap, *, peak_per_request=2000, retracted=0, finished=2800, pool=10**6):
    return RunObservation(max_running_requests=cap, max_total_num_tokens=pool, peak_used_tokens=cap * peak_per_request,
                          retracted_requests=retracted, finished_requests=finished)


def test_demand_is_length_biased_and_page_rounded():
    # one request of 100 + 1000 output and one of 100 + 3000: weights 1000 and 3000
    demand = KvDemand.from_lengths([100, 100], [1000, 3000], page_size=64, reserve_tokens=8)
    first = (1000 * (100 + 500) + 3000 * (100 + 1500)) / 4000
    assert demand.mean == pytest.approx(first + 8 + 32)
    second = (1000 * (100**2 + 100 * 1000 + 1000**2 / 3) + 3000 * (100**2 + 100 * 3000 + 3000**2 / 3)) / 4000
    assert demand.std == pytest.approx(math.sqrt(second - first**2 + 64**2 / 12))
    assert demand.needed(100) == math.ceil(100 * demand.mean + OVERFLOW_Z * 10 * demand.std)
    with pytest.raises(ConfigError):
        KvDemand.from_lengths([], [], page_size=1, reserve_tokens=1)


def test_decode_reserve_follows_sglang():
    assert decode_reserve_tokens(0, 0, 0, 64) == 1
    assert decode_reserve_tokens(3, 1, 4, 64) == 8     # 2 x max(3 x 1, 4)
    assert decode_reserve_tokens(3, 4, 8, 64) == 1024  # tree drafts on pages: 2 x (2 pages x 64 x 4 branches)


def test_unseen_fleet_runs_the_full_context_plan():
    step = next_cap(full_context_cap=63, target_cap=80, previous=None, ceiling=None, pool_tokens_at=lambda n: 10**9)
    assert (step.cap, step.settled) == (63, False)


def test_one_bounded_step_per_run_until_settled():
    caps = [63]
    for _ in range(4):
        step = next_cap(full_context_cap=63, target_cap=120, previous=_observation(caps[-1]), ceiling=None,
                        pool_tokens_at=lambda n: 10**9)
        assert step.cap - caps[-1] <= step_size(caps[-1])
        caps.append(step.cap)
    assert caps == [63, 63 + 16, 79 + 20, 99 + 21, 120]
    settled = next_cap(full_context_cap=63, target_cap=120, previous=_observation(120), ceiling=None,
                       pool_tokens_at=lambda n: 10**9)
    assert settled.cap == 120 and settled.settled


def test_observed_peak_bounds_the_step():
    # 3,000 tokens per running request at the last peak; the pool at n holds 330,000 - 1,500 n:
    # 3,000 n fits up to n = 73, short of the full step to 79
    step = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63, peak_per_request=3000),
                    ceiling=None, pool_tokens_at=lambda n: 330_000 - 1_500 * n)
    assert step.cap == 73 and "peak" in step.reason and not step.settled


def test_retractions_above_the_bound_step_back_and_set_a_ceiling():
    over = _observation(99, retracted=math.ceil(2800 * RETRACTION_BOUND) + 1)
    back = next_cap(full_context_cap=63, target_cap=120, previous=over, ceiling=None, pool_tokens_at=lambda n: 10**9)
    assert back.cap == 99 - step_size(99) and back.ceiling == 99 and "step back" in back.reason
    # the next run is clean: it climbs again, but never to the ceiling
    again = next_cap(full_context_cap=63, target_cap=120, previous=_observation(back.cap), ceiling=back.ceiling,
                     pool_tokens_at=lambda n: 10**9)
    assert back.cap < again.cap <= 98
    # retractions at the full-context plan never go below it, nor forbid climbing later
    low = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63, retracted=500), ceiling=None,
                   pool_tokens_at=lambda n: 10**9)
    assert (low.cap, low.ceiling) == (63, None)
    # a target below the full-context plan (a heavy workload) keeps the full-context plan
    heavy = next_cap(full_context_cap=63, target_cap=50, previous=_observation(63), ceiling=None,
                     pool_tokens_at=lambda n: 10**9)
    assert heavy.cap == 63 and heavy.settled
    # a ceiling right above the full-context cap pins the plan there
    pinned = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63), ceiling=64,
                      pool_tokens_at=lambda n: 10**9)
    assert pinned.cap == 63
    # retractions under the bound keep climbing
    fine = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63, retracted=10), ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert fine.cap == 79


def test_seed_workload_plan_target_tonight_and_table(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    demand = _seed_demand()
    first = plan_workload_server(plan_with, TunerBounds(), demand=demand, previous=None)
    full = plan_with(TunerBounds())
    assert first.flags == full.flags  # unseen fleet: the full-context plan
    rows = {row["plan"]: row for row in first.inputs["workload_mode"]["rows"]}
    assert list(rows) == ["full-context plan", "tonight's plan", "target"]
    full_cap = full.expected["max_running_requests"]
    target = rows["target"]
    assert rows["full-context plan"]["max_running_requests"] == full_cap
    assert target["max_running_requests"] > full_cap
    # the target's pool holds its requests' workload demand at the bound, not their full context
    assert demand.needed(target["max_running_requests"]) <= target["max_total_num_tokens"] \
        < target["max_running_requests"] * 8192
    assert target["expected_retraction_rate"] < RETRACTION_BOUND
    second = plan_workload_server(plan_with, TunerBounds(), demand=demand,
                                  previous=_observation(full_cap, peak_per_request=1500))
    tonight = second.expected["max_running_requests"]
    assert full_cap < tonight <= full_cap + step_size(full_cap)
    assert second.flags["--max-running-requests"] == tonight
    assert second.flags["--max-mamba-cache-size"] == 5 * tonight
    text = render_budget_table(second)
    for name in ("full-context plan", "tonight's plan", "target", "retractions", "one step"):
        assert name in text


def test_pin_keeps_the_full_context_plan(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    full = plan_with(TunerBounds())
    pinned = plan_workload_server(plan_with, TunerBounds(), demand=_seed_demand(),
                                  previous=_observation(full.expected["max_running_requests"]), pin_full_context=True)
    assert pinned.flags == full.flags and pinned.expected == full.expected
    assert pinned.inputs["workload_mode"]["step"]["reason"] == "pinned to the full-context plan"


def test_bounds_reject_bad_demand():
    with pytest.raises(ConfigError):
        TunerBounds(kv_tokens_mean=-1.0)
    with pytest.raises(ConfigError):
        TunerBounds(kv_tokens_mean=100.0, kv_overflow_z=float("nan"))
    assert TunerBounds().kv_tokens_needed(10, 8192) == 81920
    assert TunerBounds(kv_tokens_mean=100.0, kv_tokens_std=10.0, kv_overflow_z=2.0).kv_tokens_needed(100, 8192) == 10200


def test_demand_from_a_stats_table_and_metrics_text():
    import pandas as pd

    from fleetgen.outputs import STATS_COLUMNS
    from fleetgen.tuning.workload import parse_metrics

    stats = pd.DataFrame([{"prompt_tokens": 100, "completion_tokens": 1000},
                          {"prompt_tokens": 100, "completion_tokens": 3000},
                          {"prompt_tokens": None, "completion_tokens": None}], columns=list(STATS_COLUMNS))
    assert KvDemand.from_stats(stats, page_size=64, reserve_tokens=8) == \
        KvDemand.from_lengths([100, 100], [1000, 3000], page_size=64, reserve_tokens=8)
    text = ('# TYPE sglang:num_retracted_requests_total counter\n'
            'sglang:num_retracted_requests_total{model_name="m",dp_rank="0"} 3\n'
            'sglang:num_retracted_requests_total{model_name="m",dp_rank="1"} 2\n'
            'sglang:num_used_tokens{model_name="m"} 1234.0\n')
    assert parse_metrics(text) == {"sglang:num_retracted_requests_total": 5.0, "sglang:num_used_tokens": 1234.0}
