"""bench/tuning_trial.py: its small mode (the trial, the arms without it, the tie) and its figures; how it fixes the
trial's winner from the start and gives every arm every DAG parameter."""

import importlib.util
import math

import pytest

WORDS = ("chosen", "tie_kept_incumbent")
# The smoke run's 3 servers spare one challenger, the first default one: speculation off (tuning/candidates.py).
SMOKE_CANDIDATES = {"incumbent", "no_speculation"}
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--reasoning-parser", "qwen3"]


@pytest.fixture(scope="module")
def bench(bench_folder):
    """bench/tuning_trial.py as a module (it imports _common from its own folder, as a script does)."""
    import sys

    sys.path.insert(0, str(bench_folder))
    try:
        spec = importlib.util.spec_from_file_location("fleetgen_bench_tuning_trial", bench_folder / "tuning_trial.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(bench_folder))


def _plan(extra_args, cap_bound=None):
    return {"extra_args": extra_args, "inputs": {"bounds": {"max_running_requests": cap_bound}}}


def test_a_winner_that_edits_the_args_becomes_the_fleets_own_args(bench):
    fleet = {"server": {"extra_args": list(SEED_ARGS)}, "nodes": []}
    fixed, params = bench.fixed_fleet(fleet, _plan(["--reasoning-parser", "qwen3"]), _plan(SEED_ARGS))
    assert fixed["server"]["extra_args"] == ["--reasoning-parser", "qwen3"] and params == {}
    assert fleet["server"]["extra_args"] == SEED_ARGS  # the trial's fleet is left as it was


def test_a_cap_winner_becomes_the_max_running_requests_parameter(bench):
    fleet = {"server": {"extra_args": list(SEED_ARGS)}, "nodes": []}
    fixed, params = bench.fixed_fleet(fleet, _plan(SEED_ARGS, cap_bound=53), _plan(SEED_ARGS))
    assert fixed["server"]["extra_args"] == SEED_ARGS and params == {"max_running_requests": 53}


def test_every_arm_gives_every_dag_parameter_so_no_run_inherits_an_earlier_ones(bench):
    from fleetgen.airflow.run_config import RunConfig

    conf = bench.full_conf(tuning="sglang_defaults", shard_size=7)
    assert set(conf) == RunConfig.param_names()
    assert conf["tuning"] == "sglang_defaults" and conf["shard_size"] == 7
    assert bench.full_conf()["tuning"] == "tuned" and bench.full_conf()["tuning_candidates"] == []


@pytest.mark.slow
def test_tuning_trial_smoke_reports_the_choice_its_gains_its_share_and_the_tie(run_bench, tmp_path):
    figures = run_bench("tuning_trial", "--dir", str(tmp_path / "arms"), words=WORDS)
    assert set(figures) == {"chosen", "gain_vs_incumbent", "gain_vs_auto", "trial_share", "whole_job_ratio",
                            "tie_kept_incumbent"}, figures
    assert figures["chosen"] in SMOKE_CANDIDATES, figures
    for name in ("gain_vs_incumbent", "gain_vs_auto", "whole_job_ratio"):
        assert len(figures[name]) == 1 and 0 < figures[name][0] < 100 and math.isfinite(figures[name][0]), figures
    assert 0 < figures["trial_share"][0] < 1, figures
    # the tie's challengers change nothing the simulator's speed reads: the incumbent is kept
    assert figures["tie_kept_incumbent"] == "yes", figures


def test_the_trials_cost_is_its_share_at_its_fleets_speed_and_the_round_the_fleet_waited(bench):
    figures = {"winner": "fast", "share": 0.1, "round_s": 10.0, "job_s": 500.0,
               "servers": {"incumbent": 3, "fast": 1},
               "scores": {"incumbent": {"median": 80.0}, "fast": {"median": 100.0}}}
    costs = bench.trial_costs(figures)
    # the fleet ran at (3 x 0.8 + 1) / 4 = 0.85 of the winner over a tenth of the job; the round was 2 % of it
    assert costs["trial"] == pytest.approx(0.1 * 0.15) and costs["round"] == pytest.approx(0.02)
    assert costs["expected_ratio"] == pytest.approx(1 - 0.015 - 0.02)
    unjudged = {**figures, "servers": {"incumbent": 3, "fast": 1, "slow": 1}}
    assert bench.trial_costs(unjudged)["trial"] == pytest.approx(0.1 * (1 - 4.4 / 5))  # counted at the winner's
    assert bench.trial_costs({**figures, "winner": "other"}) is None
