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


def test_decode_reserve_without_pages_or_with_one_branch_is_twice_the_larger_draft():
    assert decode_reserve_tokens(3, 4, 8, 1) == 24       # 2 x max(3 x 4, 8): no pages to round to
    assert decode_reserve_tokens(5, 1, 8, 64) == 16      # 2 x max(5 x 1, 8)
    assert decode_reserve_tokens(0, 0, 3, 1) == 6        # steps and top-k count at least 1
    assert decode_reserve_tokens(2, 2, 16, 16) == 128    # 2 x max(2 pages x 16 x 2 branches, 16)
    assert decode_reserve_tokens(1, 2, 100, 16) == 200   # the draft tokens win over one page x 2 branches


def test_demand_leaves_out_unfinished_and_unmeasured_requests():
    demand = KvDemand.from_lengths([100, 200, 300, float("nan"), 50], [1000, 0, -5, 10, float("inf")],
                                   page_size=1, reserve_tokens=0)
    assert demand.requests == 1 and demand.prompt_tokens_mean == 100 and demand.output_tokens_mean == 1000
    assert demand.mean == pytest.approx(100 + 500 + 0.5)
    two = KvDemand.from_lengths([100, 300], [1000, 3000], page_size=1, reserve_tokens=0)
    assert (two.requests, two.prompt_tokens_mean, two.output_tokens_mean) == (2, 200, 2000)


def test_overflow_probability_is_the_normal_tail_of_the_pool():
    demand = KvDemand(mean=1000.0, std=100.0, requests=10, prompt_tokens_mean=0, output_tokens_mean=2000)
    # 4 requests: mean 4,000, deviation 2 x 100 = 200; a pool one deviation above the mean
    assert demand.overflow_probability(4, 4200) == pytest.approx(0.158655, abs=1e-6)
    assert demand.overflow_probability(4, 4000) == pytest.approx(0.5)
    # retraction rate: overflow x steps a request lives / requests, capped at 1
    assert demand.expected_retraction_rate(4, 4200) == pytest.approx(min(1.0, 0.158655 * 2000 / 4), abs=1e-3)
    assert demand.expected_retraction_rate(400, 10**9) == pytest.approx(0.0, abs=1e-12)
    rare = KvDemand(mean=1000.0, std=100.0, requests=10, prompt_tokens_mean=0, output_tokens_mean=1.0)
    assert rare.expected_retraction_rate(4, 4200) == pytest.approx(0.158655 / 4, abs=1e-6)


def test_a_demand_without_spread_overflows_only_past_the_pool():
    fixed = KvDemand(mean=1000.0, std=0.0, requests=1, prompt_tokens_mean=0, output_tokens_mean=10)
    assert fixed.overflow_probability(4, 4000) == 0.0  # exactly full still fits
    assert fixed.overflow_probability(4, 3999) == 1.0
    assert fixed.needed(4) == 4000


def test_demand_bounds_carry_the_mean_the_deviation_and_the_overflow_z():
    demand = KvDemand(mean=1000.0, std=100.0, requests=10, prompt_tokens_mean=0, output_tokens_mean=10)
    bounds = demand.bounds(TunerBounds(margin_mib=2048))
    assert (bounds.kv_tokens_mean, bounds.kv_tokens_std, bounds.kv_overflow_z, bounds.margin_mib) == \
        (1000.0, 100.0, OVERFLOW_Z, 2048)
    assert OVERFLOW_Z == pytest.approx(3.719, abs=1e-3)  # P = 1e-4 per decode step
    assert bounds.kv_tokens_needed(16, 8192) == demand.needed(16)


def test_a_run_that_finished_nothing_counts_its_retractions_against_one_request():
    assert RunObservation(10, 1000, 500, 3, 0).retraction_rate == 3
    assert RunObservation(10, 1000, 500, 3, 300).retraction_rate == 0.01
    assert RunObservation(10, 1000, 500, 3, 300).to_dict()["finished_requests"] == 300


def test_retractions_exactly_at_the_bound_keep_climbing():
    at_bound = _observation(63, retracted=28, finished=2800)  # 1.00 %: not above the bound
    step = next_cap(full_context_cap=63, target_cap=120, previous=at_bound, ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert step.cap == 79
    over = _observation(99, retracted=29, finished=2800)
    back = next_cap(full_context_cap=63, target_cap=120, previous=over, ceiling=None, pool_tokens_at=lambda n: 10**9)
    assert back.cap == 74 and back.previous_cap == 99 and not back.settled
    assert back.reason == "29 retractions in 2800 requests (1.04% > 1%): one step back from 99"


def test_a_new_ceiling_below_the_old_one_replaces_it_and_a_higher_one_does_not():
    over = _observation(90, retracted=100)
    lower = next_cap(full_context_cap=63, target_cap=120, previous=over, ceiling=110, pool_tokens_at=lambda n: 10**9)
    assert lower.ceiling == 90
    higher = next_cap(full_context_cap=63, target_cap=120, previous=over, ceiling=80, pool_tokens_at=lambda n: 10**9)
    assert higher.ceiling == 80
    # a step back never goes below the full-context plan
    near = next_cap(full_context_cap=63, target_cap=120, previous=_observation(70, retracted=100), ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert near.cap == 63 and near.ceiling == 70


def test_the_climb_stops_one_below_the_ceiling_and_at_the_target():
    below = next_cap(full_context_cap=63, target_cap=120, previous=_observation(79), ceiling=90,
                     pool_tokens_at=lambda n: 10**9)
    assert below.cap == 89 and below.target_cap == 120 and below.ceiling == 90
    assert below.reason == "one step (+25%) from 79 toward 89"
    short = next_cap(full_context_cap=63, target_cap=70, previous=_observation(63), ceiling=None,
                     pool_tokens_at=lambda n: 10**9)
    assert short.cap == 70 and not short.settled
    down = next_cap(full_context_cap=63, target_cap=70, previous=_observation(99), ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert down.cap == 70 and down.reason == "target 70 at or below last run's 99" and not down.settled


def test_a_peak_that_fits_exactly_allows_the_step():
    # 2,000 tokens per request at the last peak: 79 requests need exactly 158,000
    exact = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63), ceiling=None,
                     pool_tokens_at=lambda n: 158_000)
    assert exact.cap == 79 and "peak" not in exact.reason
    short = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63), ceiling=None,
                     pool_tokens_at=lambda n: 157_999)
    assert short.cap == 78
    assert short.reason == "last run's peak 126000 KV tokens at cap 63 (2,000/request) bounds the step to 78"
    # no room at all: the cap stays where it was, settled
    none = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63), ceiling=None,
                    pool_tokens_at=lambda n: 0)
    assert none.cap == 63 and none.settled


def test_step_size_is_a_quarter_rounded_up_and_at_least_one():
    assert [step_size(cap) for cap in (1, 3, 4, 5, 63, 64)] == [1, 1, 1, 2, 16, 16]


def test_metrics_text_skips_comments_blank_lines_and_unreadable_values():
    from fleetgen.tuning.workload import parse_metrics

    text = "# HELP x\n\nsglang:a 1\nsglang:a{x=\"1\"} 2.5\nsglang:b NaN-ish\nsglang:c{l=\"a b\"} 4\n"
    assert parse_metrics(text) == {"sglang:a": 3.5, "sglang:c": 4.0}


def test_the_workload_table_shows_each_plan_and_dashes_without_statistics():
    from fleetgen.tuning.workload import render_workload_table

    workload = {"step": {"reason": "one step", "settled": True},
                "rows": [{"plan": "full-context plan", "max_running_requests": 63, "max_total_num_tokens": 530968,
                          "kv_needed_tokens": 123456, "expected_retraction_rate": 0.00123},
                         {"plan": "target", "max_running_requests": 120, "max_total_num_tokens": 1000,
                          "kv_needed_tokens": None, "expected_retraction_rate": None}]}
    lines = render_workload_table(workload).split("\n")
    assert lines[0] == "  workload mode: one step (settled)"
    assert lines[1].split() == ["plan", "requests", "KV", "pool", "KV", "needed", "retractions"]
    assert lines[2].split() == ["full-context", "plan", "63", "530,968", "123,456", "0.123%"]
    assert lines[3].split() == ["target", "120", "1,000", "-", "-"]
    unsettled = render_workload_table({**workload, "step": {"reason": "r", "settled": False}})
    assert unsettled.split("\n")[0] == "  workload mode: r"


def test_without_statistics_the_full_context_plan_runs_and_remembers_the_last_cap(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    full = plan_with(TunerBounds())
    plan = plan_workload_server(plan_with, TunerBounds(), demand=None, previous=_observation(70), ceiling=99)
    assert plan.expected == full.expected
    workload = plan.inputs["workload_mode"]
    assert workload["step"]["reason"] == "no workload statistics yet: the full-context plan"
    assert (workload["step"]["previous_cap"], workload["step"]["ceiling"]) == (70, 99)
    assert workload["demand"] is None and workload["previous"]["max_running_requests"] == 70
    assert [row["kv_needed_tokens"] for row in workload["rows"]] == [None, None, None]
    unseen = plan_workload_server(plan_with, TunerBounds(), demand=None, previous=None)
    assert unseen.inputs["workload_mode"]["step"]["previous_cap"] is None
    assert unseen.inputs["workload_mode"]["previous"] is None


def test_the_workload_plans_rows_hold_each_plans_demand_and_flags(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    demand = _seed_demand()
    full_cap = plan_with(TunerBounds()).expected["max_running_requests"]
    plan = plan_workload_server(plan_with, TunerBounds(), demand=demand,
                                previous=_observation(full_cap, peak_per_request=1500), ceiling=None)
    workload = plan.inputs["workload_mode"]
    tonight = {row["plan"]: row for row in workload["rows"]}["tonight's plan"]
    cap = plan.expected["max_running_requests"]
    assert tonight["max_running_requests"] == cap and tonight["kv_needed_tokens"] == demand.needed(cap)
    assert tonight["expected_retraction_rate"] == demand.expected_retraction_rate(
        cap, plan.expected["max_total_num_tokens"])
    assert tonight["flags"] == " ".join(plan.command_args())
    assert workload["demand"]["mean"] == demand.mean and workload["step"]["cap"] == cap
    assert plan.inputs["bounds"]["kv_tokens_mean"] == demand.mean  # tonight's pool is sized for the workload


def test_an_unseen_fleet_says_why_it_runs_the_full_context_plan():
    step = next_cap(full_context_cap=63, target_cap=80, previous=None, ceiling=70, pool_tokens_at=lambda n: 0)
    assert step.reason == "no previous run on this fleet: the full-context plan"
    assert (step.previous_cap, step.target_cap, step.ceiling, step.full_context_cap) == (None, 80, 70, 63)
    assert step.to_dict()["cap"] == 63


def test_decode_reserve_on_pages_rounds_each_branchs_steps_up_to_whole_pages():
    assert decode_reserve_tokens(3, 4, 8, 2) == 32    # 2 x max(ceil((1 + 3 + 1) / 2) pages... = 2 x 2 x 4, 8)
    assert decode_reserve_tokens(1, 2, 4, 16) == 64   # one step fits one page of 16 per branch: 2 x (16 x 2)
    assert decode_reserve_tokens(1, 4, 2, 1) == 8     # one step x four branches


def test_every_step_names_the_full_context_cap_the_last_cap_and_the_target():
    back = next_cap(full_context_cap=63, target_cap=120, previous=_observation(99, retracted=100), ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert (back.full_context_cap, back.previous_cap, back.target_cap, back.settled) == (63, 99, 120, False)
    climb = next_cap(full_context_cap=63, target_cap=120, previous=_observation(63), ceiling=None,
                     pool_tokens_at=lambda n: 10**9)
    assert (climb.full_context_cap, climb.previous_cap, climb.target_cap, climb.settled) == (63, 63, 120, False)
    at_target = next_cap(full_context_cap=63, target_cap=120, previous=_observation(120), ceiling=None,
                         pool_tokens_at=lambda n: 10**9)
    assert at_target.reason == "target 120 at or below last run's 120" and at_target.settled is True


def test_a_cap_never_drops_below_one_request():
    step = next_cap(full_context_cap=1, target_cap=1, previous=_observation(5), ceiling=None,
                    pool_tokens_at=lambda n: 10**9)
    assert step.cap == 1


def test_pinned_and_statistics_free_steps_hold_the_full_context_cap_everywhere(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    full_cap = plan_with(TunerBounds()).expected["max_running_requests"]
    demand = _seed_demand()
    pinned = plan_workload_server(plan_with, TunerBounds(), demand=demand, previous=None, pin_full_context=True)
    step = pinned.inputs["workload_mode"]["step"]
    assert (step["full_context_cap"], step["cap"], step["target_cap"], step["settled"]) == \
        (full_cap, full_cap, full_cap, False)
    rows = pinned.inputs["workload_mode"]["rows"]
    assert [row["kv_needed_tokens"] for row in rows] == [demand.needed(full_cap)] * 3
    bare = plan_workload_server(plan_with, TunerBounds(), demand=None, previous=None)
    assert bare.inputs["workload_mode"]["step"]["settled"] is False
    assert bare.inputs["workload_mode"]["step"]["full_context_cap"] == full_cap


def test_the_ceiling_and_the_last_peak_bound_tonights_plan(cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    full_cap = plan_with(TunerBounds()).expected["max_running_requests"]
    demand = _seed_demand()
    capped = plan_workload_server(plan_with, TunerBounds(), demand=demand, previous=_observation(full_cap),
                                  ceiling=full_cap + 2)
    assert capped.expected["max_running_requests"] == full_cap + 1
    assert capped.inputs["workload_mode"]["previous"] == _observation(full_cap).to_dict()
    # a peak of 8,000 tokens per request at last night's cap: tonight's pool at the new cap must hold it
    heavy = plan_workload_server(plan_with, TunerBounds(), demand=demand,
                                 previous=_observation(full_cap, peak_per_request=8000))
    cap = heavy.expected["max_running_requests"]
    assert "bounds the step" in heavy.inputs["workload_mode"]["step"]["reason"]
    assert full_cap <= cap < full_cap + step_size(full_cap)
    assert 8000 * cap <= heavy.expected["max_total_num_tokens"]
    # and one request more would not have held it at that cap's own pool
    import dataclasses

    one_more = plan_with(dataclasses.replace(demand.bounds(TunerBounds()), max_running_requests=cap + 1))
    assert 8000 * (cap + 1) > one_more.expected["max_total_num_tokens"]


def test_a_one_token_output_counts_with_its_tiny_spread():
    # one request of 100 + 1: held KV uniform over [100, 101] (variance 1/12) plus a page of 1 (1/12)
    demand = KvDemand.from_lengths([100], [1], page_size=1, reserve_tokens=0)
    assert demand.requests == 1 and demand.mean == pytest.approx(100.5 + 0.5)
    assert demand.std == pytest.approx(math.sqrt(1 / 12 + 1 / 12))


def test_no_finished_request_is_refused_with_the_way_out():
    with pytest.raises(ConfigError) as error:
        KvDemand.from_lengths([100], [0], page_size=1, reserve_tokens=0)
    assert str(error.value) == ("workload mode: the previous run's stats have no finished request with its prompt and "
                                "output lengths\nWhat to check next: run once with pin_full_context_plan")


def test_a_label_holding_a_brace_and_a_comment_ending_in_a_number_are_read_right():
    from fleetgen.tuning.workload import parse_metrics

    text = '# HELP sglang:a some help 7\nsglang:a{path="{x}"} 2\n'
    assert parse_metrics(text) == {"sglang:a": 2.0}


def test_an_unseen_fleet_runs_the_full_context_plan_itself_and_a_seen_one_its_capped_plan(
        cases, seed_profile, seed_options):
    plan_with = _planner(cases, seed_profile, seed_options)
    full = plan_with(TunerBounds())
    demand = _seed_demand()
    unseen = plan_workload_server(plan_with, TunerBounds(), demand=demand, previous=None)
    assert unseen.inputs["bounds"] == full.inputs["bounds"] and unseen.expected == full.expected
    # seen, and stepped back to the full-context cap: tonight is the capped plan sized for the workload
    back = plan_workload_server(plan_with, TunerBounds(), demand=demand,
                                previous=_observation(full.expected["max_running_requests"], retracted=500))
    assert back.expected["max_running_requests"] == full.expected["max_running_requests"]
    assert back.inputs["bounds"]["kv_tokens_mean"] == demand.mean
    assert back.inputs["bounds"]["max_running_requests"] == full.expected["max_running_requests"]
