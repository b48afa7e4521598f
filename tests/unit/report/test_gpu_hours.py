"""GPU-hours and cost: each server's time from launch to release split into loading, generating and idle, on a run
folder with known timestamps, priced by GPU name, and per configuration at the trial's steady rates."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_hours_fixtures import B200, H100, events, plan_entry, record, stats, trial_payoff, where

from fleetgen.outputs import RunLayout
from fleetgen.report.gpu_hours import busy_seconds, gpu_hours, server_span
from fleetgen.report.prices import GpuHourPrice

USD_6 = GpuHourPrice(currency="USD", per_gpu_hour={B200: 6.0})


def test_a_servers_time_runs_from_its_launch_to_its_release_split_into_loading_generating_and_idle(tmp_path):
    layout = RunLayout(tmp_path / "run")
    # an earlier run's server stopped before tonight's launch is no time of tonight's
    record(layout, "n0:30000", ("stopped", 900.0), ("launched", 1000.0), ("ready", 1100.0), ("stopped", 2000.0))
    plan = [plan_entry("n0", 30000, [B200, B200])]
    # in flight 1200-1400 (two overlapping requests count once) and 1600-1700; 600 output tokens
    rows = stats(("n0:30000", 1300.0, 100.0, 100), ("n0:30000", 1400.0, 150.0, 200), ("n0:30000", 1700.0, 100.0, 300))
    result = gpu_hours(layout, stats=rows, plan=plan, server_gpus=where(plan), prices=USD_6, now=5000.0)
    server = result["per_server"]["n0:30000"]
    assert server["seconds"] == {"held": 1000.0, "loading": 100.0, "generating": 300.0, "idle": 600.0}
    assert server["gpu_hours"] == {"held": 0.555556, "loading": 0.055556, "generating": 0.166667, "idle": 0.333333}
    assert (server["start"], server["ready"], server["end"], server["end_basis"], server["kept"]) == (
        1000.0, 1100.0, 2000.0, "released", False)
    assert (server["gpus"], server["gpu_names"], server["price_per_hour"]) == (2, [B200, B200], 12.0)
    assert (server["cost"], server["cost_per_million_tokens"]) == (3.3333, 5555.5556)  # 12/h x 1000 s; / 600 tokens
    assert (result["cost"], result["cost_per_million_tokens"], result["currency"]) == (3.3333, 5555.5556, "USD")
    assert result["gpu_hours"] == server["gpu_hours"] and result["gpu_hours_per_million_tokens"] == 925.9259
    assert (result["ends"], result["unpriced"], result["unused_prices"], result["not_recorded"]) == (
        ["released"], {}, [], [])


def test_a_server_still_up_counts_to_the_report_and_one_kept_running_from_when_this_run_took_it_over():
    still_up = server_span(events(("launched", 0.0), ("ready", 60.0)), now=1000.0)
    assert (still_up["end"], still_up["end_basis"], still_up["loading_s"]) == (1000.0, "report", 60.0)
    kept = server_span(events(("stopped", 5.0), ("kept", 10.0), ("ready", 12.0)), now=500.0)
    assert (kept["start"], kept["kept"], kept["loading_s"], kept["end"]) == (10.0, True, 0.0, 500.0)
    assert server_span(events(("stopped", 5.0)), now=500.0) is None  # only stopped: a server of an earlier run


def test_a_back_off_relaunch_is_still_loading_and_the_gap_of_the_trials_relaunch_is_not():
    trial = server_span(events(("launched", 0.0), ("launched", 50.0), ("ready", 120.0), ("stopped", 500.0),
                               ("launched", 510.0), ("kept", 560.0), ("ready", 600.0)), now=1000.0)
    assert (trial["loading_s"], trial["end"], trial["end_basis"], trial["ready"]) == (210.0, 1000.0, "report", 120.0)
    never_ready = server_span(events(("launched", 0.0), ("stopped", 300.0)), now=1000.0)
    assert (never_ready["loading_s"], never_ready["end"], never_ready["ready"]) == (300.0, 300.0, None)
    still_loading = server_span(events(("launched", 100.0)), now=400.0)
    assert (still_loading["loading_s"], still_loading["end_basis"]) == (300.0, "report")


@pytest.mark.parametrize("starts, ends, expected", [
    ([], [], 0.0),
    ([0.0, 5.0, 20.0], [10.0, 8.0, 30.0], 20.0),   # one inside another, then a gap
    ([20.0, 0.0], [30.0, 25.0], 30.0),             # out of order, overlapping
    ([-50.0, 90.0], [10.0, 200.0], 20.0),          # clipped to [0, 100]
])
def test_the_busy_time_is_the_union_of_the_requests_in_flight_within_the_span(starts, ends, expected):
    assert busy_seconds(np.array(starts), np.array(ends), 0.0, 100.0) == expected


def test_without_a_price_the_gpu_hours_stay_and_money_is_hidden(tmp_path):
    layout = RunLayout(tmp_path / "run")
    record(layout, "n0:30000", ("launched", 0.0), ("ready", 360.0))
    plan = [plan_entry("n0", 30000, [B200])]
    result = gpu_hours(layout, stats=stats(("n0:30000", 720.0, 360.0, 1000)), plan=plan, server_gpus=where(plan),
                       prices=GpuHourPrice(), now=3600.0)
    server = result["per_server"]["n0:30000"]
    assert server["gpu_hours"] == {"held": 1.0, "loading": 0.1, "generating": 0.1, "idle": 0.8}
    assert (server["cost"], result["cost"], result["priced"], result["currency"], result["unpriced"]) == (
        None, None, False, None, {})
    assert result["gpu_hours_per_million_tokens"] == 1000.0


def test_a_gpu_of_the_fleet_without_a_price_is_named_and_the_run_gets_no_cost(tmp_path):
    layout = RunLayout(tmp_path / "run")
    for server in ("n0:30000", "n1:30000", "n2:30000"):
        record(layout, server, ("launched", 0.0), ("ready", 10.0), ("stopped", 3600.0))
    plan = [plan_entry("n0", 30000, [B200]), plan_entry("n1", 30000, [H100])]
    known = {**where(plan), "n3:30000": {"host": "n3", "gpu_ids": [0]}}  # ready but its launch not recorded
    prices = GpuHourPrice(currency="EUR", per_gpu_hour={B200: 5.0, "NVIDIA H100": 2.0})
    result = gpu_hours(layout, stats=stats(("n0:30000", 100.0, 10.0, 50)), plan=plan, server_gpus=known,
                       prices=prices, now=9999.0)
    assert result["per_server"]["n0:30000"]["cost"] == 5.0 and result["per_server"]["n1:30000"]["cost"] is None
    assert result["per_server"]["n2:30000"]["gpu_names"] == [] and result["per_server"]["n2:30000"]["gpus"] == 1
    assert result["unpriced"] == {H100: ["n1:30000"], "GPU not named by the plan": ["n2:30000"]}
    assert result["unused_prices"] == ["NVIDIA H100"]  # spelt otherwise than nvidia-smi prints it
    assert result["not_recorded"] == ["n3:30000"] and result["cost"] is None
    assert result["gpu_hours"]["held"] == 3.0  # every recorded server's GPU time, priced or not


def test_each_configuration_costs_per_million_tokens_at_its_steady_rate_and_the_chosen_one_saves(tmp_path):
    layout = RunLayout(tmp_path / "run")
    plan = [plan_entry(host, 1, [B200]) for host in "abcd"]
    for server in where(plan):
        record(layout, server, ("launched", 0.0), ("ready", 10.0))
    prices = GpuHourPrice(currency="USD", per_gpu_hour={B200: 3.6})
    result = gpu_hours(layout, stats=stats(), plan=plan, server_gpus=where(plan), prices=prices, now=100.0,
                       payoff=trial_payoff())
    rows = {row["name"]: row for row in result["configurations"]["rows"]}
    # 10^6 tokens at 1000 tokens/s per GPU: 1000 s = 0.277778 GPU-hours, at 3.6 an hour 1.0
    assert (rows["incumbent"]["gpu_hours_per_million_tokens"], rows["incumbent"]["cost_per_million_tokens"]) == (
        0.277778, 1.0)
    assert (rows["cap-3/4"]["gpu_hours_per_million_tokens"], rows["cap-3/4"]["cost_per_million_tokens"]) == (
        0.222222, 0.8)
    assert rows["no-spec"]["cost_per_million_tokens"] is None and rows["in use (cap-3/4)"]["cost_per_million_tokens"] \
        == 0.8
    assert result["configurations"]["savings"] == [
        {"configuration": "cap-3/4", "against": "the incumbent (incumbent)", "same": False,
         "gpu_hours_per_million_tokens": 0.055556, "cost_per_million_tokens": 0.2},
        {"configuration": "the configuration in use (cap-3/4)", "same": False,
         "against": "SGLang's automatic sizing (run night3 (tuning mode sglang_defaults))",
         "gpu_hours_per_million_tokens": 0.125, "cost_per_million_tokens": 0.45}]


def test_a_trial_that_kept_the_incumbent_saves_nothing_against_it(tmp_path):
    layout = RunLayout(tmp_path / "run")
    plan = [plan_entry(host, 1, [B200]) for host in "abc"]
    payoff = trial_payoff()
    payoff["decision"]["winner"] = "incumbent"
    for row in payoff["candidates"]:
        row["winner"] = row["name"] == "incumbent"
    result = gpu_hours(layout, stats=stats(), plan=plan, server_gpus=where(plan), prices=GpuHourPrice(), now=1.0,
                       payoff=payoff)
    assert result["configurations"]["savings"][0] == {
        "configuration": "incumbent", "against": "the incumbent (incumbent)", "same": True,
        "gpu_hours_per_million_tokens": 0.0, "cost_per_million_tokens": None}


def test_without_a_trial_or_a_price_the_configuration_in_use_still_has_its_gpu_hours_per_million(tmp_path):
    layout = RunLayout(tmp_path / "run")
    plan = [plan_entry("a", 1, [B200])]
    record(layout, "a:1", ("launched", 0.0))
    payoff = {"candidates": [], "decision": None, "in_use": {"candidate": None, "score": {"median": 2000.0}},
              "vs_auto_sizing": {"measured": False, "why": "no earlier run"}}
    result = gpu_hours(layout, stats=stats(), plan=plan, server_gpus=where(plan), prices=GpuHourPrice(), now=1.0,
                       payoff=payoff)
    assert result["configurations"] == {"rows": [
        {"name": "in use", "tokens_per_s_per_gpu": 2000.0, "price_per_gpu_hour": None,
         "gpu_hours_per_million_tokens": 0.138889, "cost_per_million_tokens": None, "winner": None,
         "incumbent": None}], "savings": []}
    assert gpu_hours(layout, stats=stats(), plan=plan, server_gpus=where(plan), prices=GpuHourPrice(),
                     now=1.0)["configurations"] == {"rows": [], "savings": []}


def test_a_server_kept_again_in_the_trials_relaunch_round_counts_once_from_its_first_launch(tmp_path):
    layout = RunLayout(tmp_path / "run")
    # launched tonight, kept by relaunch.stop_servers / launch_servers and read again by relaunch.wait_ready
    record(layout, "a:1", ("launched", 1000.0), ("ready", 1100.0), ("kept", 2000.0), ("ready", 2010.0))
    # taken over from an earlier run in the first round, kept again in the relaunch round
    record(layout, "b:1", ("kept", 1000.0), ("ready", 1005.0), ("kept", 2000.0), ("ready", 2005.0))
    plan = [plan_entry("a", 1, [B200]), plan_entry("b", 1, [B200])]
    rows = stats(("a:1", 1900.0, 700.0, 100), ("a:1", 4000.0, 1900.0, 100), ("b:1", 4000.0, 2900.0, 100))
    result = gpu_hours(layout, stats=rows, plan=plan, server_gpus=where(plan), prices=USD_6, now=5000.0)
    launched, kept = result["per_server"]["a:1"], result["per_server"]["b:1"]
    assert launched["seconds"] == {"held": 4000.0, "loading": 100.0, "generating": 2600.0, "idle": 1300.0}
    assert (launched["start"], launched["ready"], launched["kept"], launched["end_basis"]) == (
        1000.0, 1100.0, False, "report")
    assert kept["seconds"] == {"held": 4000.0, "loading": 0.0, "generating": 2900.0, "idle": 1100.0}
    assert (kept["start"], kept["ready"], kept["kept"]) == (1000.0, 1005.0, True)
    assert result["gpu_hours"]["held"] == round(8000.0 / 3600, 6)  # each server once


def test_a_loser_relaunched_on_the_winner_loads_twice_and_its_gap_between_stop_and_launch_is_idle(tmp_path):
    layout = RunLayout(tmp_path / "run")
    # the trial on a challenger, stopped by relaunch.stop_servers once its memory is back, launched on the winner
    record(layout, "c:1", ("launched", 1000.0), ("ready", 1100.0), ("stopped", 2000.0), ("launched", 2030.0),
           ("ready", 2200.0), ("stopped", 4500.0))
    record(layout, "d:1", ("launched", 1000.0), ("ready", 1100.0), ("stopped", 2000.0), ("launched", 2030.0),
           ("ready", 2200.0))  # still up at the report (the DAG's release_servers runs after it)
    plan = [plan_entry("c", 1, [B200, B200]), plan_entry("d", 1, [B200])]
    # the trial shard 1200-1900 on the challenger, the job's shards 2300-4000 on the winner
    rows = stats(("c:1", 1900.0, 700.0, 100), ("c:1", 4000.0, 1700.0, 500))
    result = gpu_hours(layout, stats=rows, plan=plan, server_gpus=where(plan), prices=USD_6, now=5000.0)
    server = result["per_server"]["c:1"]
    # loading 100 + 170; the 30 s between the stop and the launch stay the slot's GPUs: idle, not left out
    assert server["seconds"] == {"held": 3500.0, "loading": 270.0, "generating": 2400.0, "idle": 830.0}
    assert (server["start"], server["ready"], server["end"], server["end_basis"], server["kept"]) == (
        1000.0, 1100.0, 4500.0, "released", False)
    assert server["cost"] == round(12.0 * 3500.0 / 3600, 4) and server["completion_tokens"] == 600
    still_up = result["per_server"]["d:1"]
    assert still_up["seconds"] == {"held": 4000.0, "loading": 270.0, "generating": 0.0, "idle": 3730.0}
    assert (still_up["end"], still_up["end_basis"]) == (5000.0, "report")
