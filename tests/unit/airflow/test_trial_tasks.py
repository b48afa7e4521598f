"""The tuning trial's tasks (fleetgen.airflow.trial_tasks) called as Airflow calls them, with a fake task context:
tonight's split on three simulated B200 servers of the seed model, the decision from metrics rows written as the
shards write them, and the hand-over to the relaunch round."""

from __future__ import annotations

import json
import math
import logging
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetgen.airflow import context as task_context_module
from fleetgen.airflow import trial_tasks
from fleetgen.airflow.run_config import RunConfig
from fleetgen.nodes.fleet import fleet_from_json, parse_fleet
from fleetgen.outputs import RunLayout, record_server_time, trial_history_file
from fleetgen.tuning import Workload
from fleetgen.tuning.fleet_plan import FleetPlanRun
from fleetgen.tuning.model_files import ModelFiles
from fleetgen.tuning.trial_history import TrialHistory, TrialKey
from fleetgen.tuning.trial_plan import read_trial_plan

RUN_ID = "manual__2026-01-02T00:00:00+00:00"
SEED_CONFIG = Path(__file__).resolve().parents[1] / "tuning" / "configs" / "seed-qwen3.6-27b.json"
SEED_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--reasoning-parser", "qwen3"]
# the seed job's prompt count: its 3 % trial measures every server (tuning_trial_share's default)
WORKLOAD = Workload(max_output_tokens=4096, prompt_tokens_mean=270.0, prompt_tokens_max=1900, prompt_count=913_786)
IDENTITY = {"path": "/models/seed", "parts": {"weights": "w" * 64, "config": "c" * 64, "launch_args": "a" * 64,
                                              "sglang": "0.5.23"}}


def _fleet(gpus=3, args=SEED_ARGS) -> dict:
    return parse_fleet({"model": {"path": "/models/seed", "served_name": "seed"},
                        "server": {"python": "/venv/bin/python", "extra_args": list(args)},
                        "nodes": [{"name": "n0", "ssh_conn_id": "ssh_n0", "address": "10.0.0.5",
                                   "gpus": list(range(gpus)), "base_port": 30000}]}).to_dict()


def _inventories(gpus=3) -> dict:
    return {"n0": {"host": "n0", "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA B200", "total_mib": 183_359, "used_mib": 500,
         "free_mib": 183_359 - 500, "processes": []} for i in range(gpus)]}}


MODEL = ModelFiles(config=json.loads(SEED_CONFIG.read_text()), weights_bytes=54 * 10**9, hf_quant_config=None,
                   weights_source="index")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETGEN_OUTPUT_ROOT", str(tmp_path))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(100)))
    defaults = {spec.name: spec.default_value() for spec in RunConfig.settings()}
    state = SimpleNamespace(params={**defaults, "fleet_file": "", "prompts_path": str(prompts),
                                    "output_root": str(tmp_path / "out")}, tmp=tmp_path, prompts=prompts)

    def call(task, *args, **params):
        context = {"params": {**state.params, **params}, "run_id": RUN_ID, "ti": None}
        monkeypatch.setattr(task_context_module, "task_context", lambda: context)
        state.config = RunConfig.from_params(context["params"])
        state.layout = state.config.layout(RUN_ID)
        return task(*args)

    state.call = call
    return state


def _tonight(run, *, gpus=3, identity=IDENTITY, args=SEED_ARGS, reused_in_trial=None, **params):
    """tonights_plans as derive_plan calls it, inside the run's context."""
    def plan():
        _, config, layout = task_context_module.run_context()
        spec = fleet_from_json(_fleet(gpus, args))
        reuse = {"reused_in_trial": reused_in_trial} if reused_in_trial else {}
        return trial_tasks.tonights_plans(spec, _inventories(gpus), MODEL, WORKLOAD, config, layout,
                                          FleetPlanRun(config.inputs.output_root, layout,
                                                       run_on_node=lambda node, command: ""), identity, **reuse)
    return run.call(plan, **params)


# --- tonight's split ----------------------------------------------------------------------------------------------

def test_three_servers_run_the_incumbent_on_two_and_the_first_challenger_on_the_last(run):
    plans, notes = _tonight(run)
    assert [(p.port, p.candidate) for p in plans] == [(30000, "incumbent"), (30001, "incumbent"),
                                                      (30002, "no_speculation")]
    assert plans[2].extra_args == ["--reasoning-parser", "qwen3"] and plans[0].extra_args == SEED_ARGS
    trial = read_trial_plan(run.layout)
    assert trial.split.challengers == ("no_speculation",) and trial.key is None  # no earlier run measured the workload
    assert trial.key_parts == {"gpu": "NVIDIA B200", "model": trial.key_parts["model"], "sglang_version": "0.5.23"}
    assert set(trial.plans) == {"incumbent", "no_speculation", "draft_minus_1", "cap_3_4", "cap_1_2", "sglang_auto"}
    assert all(set(by_server) == {"n0:30000", "n0:30001", "n0:30002"} for by_server in trial.plans.values())
    assert notes[0] == ("tuning trial: incumbent on 2 server(s), no_speculation on n0:30002; not tried tonight: "
                        "draft_minus_1, cap_3_4, cap_1_2, sglang_auto")
    assert "candidate cap_1_2: the request cap at 0.5 of what memory holds" in notes
    assert notes[-1] == ("the trial's history key waits for its own completions (no earlier run measured the "
                         "workload)")
    # the workload mode's record holds what runs tonight: the challenger's own cap on its server
    record = json.loads(run.layout.workload_plan.read_text())
    assert record["n0:30002"]["max_running_requests"] == plans[2].expected["max_running_requests"]


@pytest.mark.parametrize("gpus, params, why", [
    (2, {}, "no tuning trial: 2 server(s), and a trial needs at least 3"),
    (3, {"tuning": "sglang_defaults"}, "no tuning trial: the tuning mode is sglang_defaults"),
    (3, {"sample_interval_s": 0}, "no tuning trial: the DAG parameter sample_interval_s is 0"),
    (3, {"sample_interval_s": 60, "tuning_trial_window_s": 60}, "no tuning trial: sample_interval_s 60 is not shorter"),
    (3, {"tuning_trial_window_s": 60, "tuning_trial_max_s": 239},
     "no tuning trial: tuning_trial_max_s 239 cannot hold a warm-up and 3 windows of tuning_trial_window_s 60 (at "
     "least 240 s; 0 lifts the cap)"),
])
def test_without_a_trial_every_server_runs_the_fleets_own_plan_and_the_notes_say_why(run, gpus, params, why):
    plans, notes = _tonight(run, gpus=gpus, **params)
    assert {p.candidate for p in plans} == {"incumbent"} and len(plans) == gpus
    assert len(notes) == 1 and notes[0].startswith(why)
    assert not run.layout.candidate_plans.exists()


@pytest.mark.parametrize("max_s", [0, 240])
def test_a_time_cap_that_holds_a_warm_up_and_three_windows_or_no_cap_runs_the_trial(run, max_s):
    plans, _ = _tonight(run, tuning_trial_window_s=60, tuning_trial_max_s=max_s)
    assert {p.candidate for p in plans} == {"incumbent", "no_speculation"}


def test_a_trial_share_too_small_to_measure_the_servers_runs_no_trial_and_says_what_to_raise(run):
    from fleetgen.tuning.trial_plan import prompts_needed

    plans, _ = _tonight(run)
    trial = read_trial_plan(run.layout)
    needed = prompts_needed(trial.split, trial.plans)
    caps = [plan.expected["max_running_requests"] for plan in plans]
    assert needed == 4 * sum(caps)  # a warm-up turnover and three windows' worth per server
    share = (needed - 1) / WORKLOAD.prompt_count
    plans, notes = _tonight(run, tuning_trial_share=share)
    assert {p.candidate for p in plans} == {"incumbent"}
    assert notes[0] == (f"no tuning trial: its {needed - 1} prompt(s) cannot measure these servers (their caps need "
                        f"{needed} for a warm-up and the windows a decision needs); raise tuning_trial_share")
    assert "raise tuning_trial_share" in notes[0] and not read_trial_plan(run.layout).split.trial
    plans, _ = _tonight(run, tuning_trial_share=needed / WORKLOAD.prompt_count)
    assert {p.candidate for p in plans} == {"incumbent", "no_speculation"}


def test_a_trial_turned_off_plans_as_before_and_notes_nothing(run, caplog):
    with caplog.at_level("INFO", logger="fleetgen"):
        plans, notes = _tonight(run, tuning_trial=False)
    assert notes == [] and {p.candidate for p in plans} == {"incumbent"}
    assert "no tuning trial: the DAG parameter tuning_trial is off" in caplog.text


def test_the_next_night_starts_from_the_recorded_winner_and_tries_the_next_challenger(run):
    from fleetgen.tuning.trial import decide

    _tonight(run)  # the key parts of this fleet
    parts = read_trial_plan(run.layout).key_parts
    previous = run.tmp / "out" / "last-night" / "report"
    previous.mkdir(parents=True)
    previous.joinpath("report.json").write_text(json.dumps({
        "schema": 1, "run_succeeded": True, "prompt_tokens": {"mean": 270.0}, "completion_tokens": {"mean": 2500.0}}))
    key = TrialKey(**parts, workload="out2048-short")
    won = decide({"incumbent": [100.0] * 5, "no_speculation": [130.0] * 5}, incumbent="incumbent", min_gain=0.03)
    TrialHistory(trial_history_file(run.tmp / "out")).record(key, won, run_id="last-night")
    plans, notes = _tonight(run, gpus=5)
    assert [p.candidate for p in plans] == ["no_speculation"] * 4 + ["draft_minus_1"]
    assert read_trial_plan(run.layout).key == key
    assert "incumbent no_speculation: the winner of the last trial" in notes[0]


def test_without_a_model_identity_the_trial_runs_but_cannot_be_recorded(run):
    from fleetgen.tuning.trial import decide

    other = TrialKey(gpu="NVIDIA B200", model="other@0123456789ab", sglang_version="0.5.23", workload="out1024-short")
    won = decide({"incumbent": [100.0] * 5, "cap_1_2": [130.0] * 5}, incumbent="incumbent", min_gain=0.03)
    TrialHistory(trial_history_file(run.tmp / "out")).record(other, won, run_id="last-night")  # another model's
    plans, notes = _tonight(run, identity=None)
    assert {p.candidate for p in plans} == {"incumbent", "no_speculation"}
    assert notes[-1] == "the trial is not recorded for later nights: derive_plan was given no model identity"
    assert read_trial_plan(run.layout).key_parts == {}


def test_a_fleet_without_speculation_is_offered_only_the_caps(run):
    plans, notes = _tonight(run, args=["--reasoning-parser", "qwen3"])
    trial = read_trial_plan(run.layout)
    assert set(trial.plans) == {"incumbent", "cap_3_4", "cap_1_2", "sglang_auto"}
    assert [p.candidate for p in plans] == ["incumbent", "incumbent", "cap_3_4"]
    # speculation off is no candidate at all there, not one planned and left out for launching the incumbent
    assert trial.skipped == {} and not any("no_speculation" in note for note in notes), (trial.skipped, notes)


def test_the_candidate_plans_survive_their_file_and_a_broken_one_says_what_to_clear(run):
    from fleetgen.errors import ConfigError
    from fleetgen.tuning.trial_plan import TrialPlan

    _tonight(run)
    trial = read_trial_plan(run.layout)
    assert TrialPlan.from_dict(trial.to_dict()) == trial and trial.skipped == {} and trial.described
    with pytest.raises(ConfigError) as missing:
        trial.plan_for("cap_1_2", "n9:30000")
    assert missing.value.message == "the run's candidate plans hold no plan of cap_1_2 for n9:30000"
    assert missing.value.server == "n9:30000"
    assert missing.value.hint == "the plans were derived for another fleet: clear the run's derive_plan"
    with pytest.raises(ConfigError, match="not a tuning trial's candidate plans: AttributeError"):
        TrialPlan.from_dict({**trial.to_dict(), "plans": None})  # a hand edit: null where the plans stand
    with pytest.raises(ConfigError) as keyless:
        TrialPlan.from_dict({key: value for key, value in trial.to_dict().items() if key != "skipped"})
    assert keyless.value.message == "not a tuning trial's candidate plans: KeyError 'skipped'"
    assert keyless.value.hint == "derive_plan writes them; clear the run's derive_plan"
    run.layout.candidate_plans.write_text("{not json")
    with pytest.raises(ConfigError) as broken:
        read_trial_plan(run.layout)
    assert broken.value.message.startswith(f"{run.layout.candidate_plans} is not JSON: ")
    assert broken.value.path == str(run.layout.candidate_plans)
    assert broken.value.hint == "derive_plan writes it; clear the run's derive_plan"


def test_a_split_without_its_trial_keeps_its_incumbent_and_every_note_but_the_trials():
    from fleetgen.tuning.candidates import TrialSplit
    from fleetgen.tuning.trial_plan import without_trial

    split = TrialSplit("no_speculation", {"n0:30000": "no_speculation", "n0:30001": "cap_1_2"}, ("cap_1_2",),
                       ("incumbent no_speculation: the winner", "candidate note", "tuning trial: ..."))
    off = without_trial(split, "no tuning trial: too few prompts")
    assert off == TrialSplit("no_speculation", {"n0:30000": "no_speculation", "n0:30001": "no_speculation"}, (),
                             ("incumbent no_speculation: the winner", "candidate note",
                              "no tuning trial: too few prompts"))


# --- the shards ---------------------------------------------------------------------------------------------------

def test_the_trial_takes_its_share_of_the_first_prompts_only_with_a_challenger(run):
    two = [{"candidate": "incumbent"}, {"candidate": "cap_1_2"}]
    run.call(lambda: None, tuning_trial_share=0.03)
    assert trial_tasks.trial_prompt_count(run.config, two, 1000) == 30
    assert trial_tasks.trial_prompt_count(run.config, two, 10) == 1  # at least one prompt
    assert trial_tasks.trial_prompt_count(run.config, two, 1) == 0  # never every prompt
    assert trial_tasks.trial_prompt_count(run.config, [{"candidate": "incumbent"}] * 3, 1000) == 0
    assert trial_tasks.trial_prompt_count(run.config, None, 1000) == 0
    run.call(lambda: None, tuning_trial_share=0.5)
    assert trial_tasks.trial_prompt_count(run.config, two, 3) == 2


def test_the_trial_shards_come_first_and_the_rest_follows_with_the_next_ids(run, monkeypatch):
    from airflow.sdk import conf

    from fleetgen.airflow import generate_tasks
    from fleetgen.prompts.scan import scan_prompts

    monkeypatch.setattr(conf, "getint", lambda section, key: 1024)
    scan = scan_prompts(run.prompts).to_dict()
    plans = [{"candidate": "incumbent"}, {"candidate": "incumbent"}, {"candidate": "no_speculation"}]
    trial = run.call(generate_tasks.plan_trial_shards, scan, plans, shard_size=4, tuning_trial_share=0.1)
    rest = run.call(generate_tasks.plan_shards, scan, plans, shard_size=4, tuning_trial_share=0.1,
                    tuning_trial_max_s=0)
    assert [(s["shard_id"], s["first"], s["count"]) for s in trial] == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]
    assert [s["shard_id"] for s in rest] == list(range(3, 3 + 23)) and rest[0]["first"] == 10
    assert sum(s["count"] for s in trial + rest) == 100
    # with a time cap, generate_shard is also given the trial's shards, to finish what the cap left of them
    capped = run.call(generate_tasks.plan_shards, scan, plans, shard_size=4, tuning_trial_share=0.1,
                      tuning_trial_max_s=600)
    assert capped == trial + rest
    # no challenger: no trial shards, the shards of today
    assert run.call(generate_tasks.plan_trial_shards, scan, plans[:1] * 3, shard_size=4) == []
    assert [s["shard_id"] for s in run.call(generate_tasks.plan_shards, scan, None, shard_size=4)] == list(range(25))


# --- the decision -------------------------------------------------------------------------------------------------

def _metrics(layout: RunLayout, shard_id: int, rates: dict[str, float], *, seconds=40.0, cap=20, seed=0):
    """Rows as the shards sample them: each server at its cap, its counters rising at ``rates`` tokens/s (noise of
    about 1 %), one request finishing every 0.25 s."""
    noise = random.Random(seed)
    path = layout.shard_file("metrics", shard_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for server, rate in rates.items():
        tokens = 0.0
        for step in range(int(seconds / 0.5)):
            tokens += rate * 0.5 * noise.uniform(0.99, 1.01)
            rows.append({"t": 1000.0 + step * 0.5, "server": server, "cap": cap, "running": cap, "queue": 5,
                         "generation_tokens": round(tokens), "requests": step * 2})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _decide(run, plans, rates, *, shards=({"shard_id": 0},), **params):
    _metrics(run.layout, 0, rates)
    readiness = [{"server": f"{p['host']}:{p['port']}", "effective_max_running_requests": 20, "relaunches": 0,
                  "flags": p["flags"], "expected": p["expected"]} for p in plans]
    return run.call(trial_tasks.decide, plans, readiness, list(shards), tuning_trial_window_s=4,
                    sample_interval_s=0.5, **params)


def test_a_clearly_faster_challenger_wins_and_every_server_moves_to_it(run, caplog):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    with caplog.at_level("INFO", logger="fleetgen"):
        final = _decide(run, plans, {"n0:30000": 1000.0, "n0:30001": 1010.0, "n0:30002": 1500.0})
    assert [p["candidate"] for p in final] == ["no_speculation"] * 3
    trial = read_trial_plan(run.layout)
    assert final[0] == trial.plan_for("no_speculation", "n0:30000").to_dict()
    assert final[2] == plans[2]  # the challenger's own server keeps its plan: the relaunch round keeps it running
    decision = json.loads(run.layout.trial_decision.read_text())
    assert decision["winner"] == "no_speculation" and decision["incumbent"] == "incumbent"
    assert decision["window_s"] == 4 and decision["auto_sizing"] is None  # SGLang's own sizing did not run
    assert decision["servers"]["n0:30002"] == {"candidate": "no_speculation", "cap": 20, "gpus": 1,
                                               "trial_seconds": 39.5}
    assert decision["scores"]["no_speculation"]["median"] == pytest.approx(1500, rel=0.02)
    assert "no_speculation replaces incumbent" in caplog.text and "(winner)" in caplog.text
    assert trial_tasks.relaunch_needed(plans, final) is True
    # recorded for the next night under the key of the trial's own completions (none here: not recorded)
    assert "not recorded for later nights" in caplog.text
    record = json.loads(run.layout.workload_plan.read_text())
    assert record["n0:30000"]["max_running_requests"] == final[0]["expected"]["max_running_requests"]


def test_swapped_speeds_keep_the_incumbent_and_move_the_challengers_server_back(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    final = _decide(run, plans, {"n0:30000": 1500.0, "n0:30001": 1510.0, "n0:30002": 1000.0})
    assert [p["candidate"] for p in final] == ["incumbent"] * 3
    assert final[:2] == plans[:2] and final[2] == read_trial_plan(run.layout).plan_for(
        "incumbent", "n0:30002").to_dict()
    assert json.loads(run.layout.trial_decision.read_text())["winner"] == "incumbent"
    assert trial_tasks.relaunch_needed(plans, final) is True


def test_within_the_minimum_gain_the_incumbent_is_kept(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    final = _decide(run, plans, {"n0:30000": 1000.0, "n0:30001": 1000.0, "n0:30002": 1020.0})
    assert {p["candidate"] for p in final} == {"incumbent"}


def test_the_decision_is_recorded_under_the_key_of_the_trials_own_completions(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    stats = run.layout.shard_file("stats", 0)
    stats.parent.mkdir(parents=True, exist_ok=True)
    stats.write_text("".join(json.dumps({"id": f"p{i}", "prompt_tokens": 300, "completion_tokens": 900}) + "\n"
                             for i in range(10)))
    _decide(run, plans, {"n0:30000": 1000.0, "n0:30001": 1000.0, "n0:30002": 1500.0})
    parts = read_trial_plan(run.layout).key_parts
    history = TrialHistory(trial_history_file(run.tmp / "out"))
    key = TrialKey(**parts, workload="out1024-short")
    assert history.latest_winner(key) == "no_speculation" and history.tried(key) == {"incumbent", "no_speculation"}


def test_a_trial_that_measured_nothing_keeps_the_incumbent_and_is_not_recorded(run, caplog):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    stats = run.layout.shard_file("stats", 0)
    stats.parent.mkdir(parents=True, exist_ok=True)
    stats.write_text(json.dumps({"id": "p0", "prompt_tokens": 300, "completion_tokens": 900}) + "\n")
    with caplog.at_level("WARNING", logger="fleetgen"):
        final = run.call(trial_tasks.decide, plans, [], [{"shard_id": 0}])  # no metrics rows at all
    assert {p["candidate"] for p in final} == {"incumbent"}
    assert "it scored no candidate" in caplog.text
    assert not trial_history_file(run.tmp / "out").exists()


def test_a_server_backed_off_on_the_winner_keeps_the_flags_it_runs(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    _metrics(run.layout, 0, {"n0:30000": 1500.0, "n0:30001": 1500.0, "n0:30002": 1000.0})
    smaller = {**plans[1]["flags"], "--max-running-requests": 7}
    readiness = [{"server": f"n0:{p['port']}", "effective_max_running_requests": 20, "relaunches": 0,
                  "flags": p["flags"], "expected": p["expected"]} for p in plans]
    readiness[1] = {**readiness[1], "relaunches": 1, "flags": smaller,
                    "expected": {**plans[1]["expected"], "max_running_requests": 7}}
    final = run.call(trial_tasks.decide, plans, readiness, [{"shard_id": 0}], tuning_trial_window_s=4,
                     sample_interval_s=0.5)
    assert final[1]["flags"] == smaller and final[1]["attempt"] == 1 and final[0] == plans[0]


def test_no_trial_keeps_tonights_plans_and_says_why_in_the_decision_file(run, caplog):
    plans = [plan.to_dict() for plan in _tonight(run, gpus=2)[0]]
    with caplog.at_level("INFO", logger="fleetgen"):
        final = run.call(trial_tasks.decide, plans, [], [])
    assert final == plans and trial_tasks.relaunch_needed(plans, final) is False
    skipped = json.loads(run.layout.trial_decision.read_text())["skipped"]
    assert skipped.startswith("no tuning trial: derive_plan planned none")
    assert "every server keeps tonight's plan" in caplog.text


def test_the_rest_of_the_job_runs_on_the_relaunch_rounds_servers_when_it_ran(caplog):
    first, again = [{"server": "n0:30000", "pid": 1}], [{"server": "n0:30000", "pid": 2}]
    with caplog.at_level(logging.INFO, logger="fleetgen"):
        assert trial_tasks.servers_in_use(first, again) == again
        assert trial_tasks.servers_in_use(first, []) == first
    assert "(relaunch round)" in caplog.text and "(first round)" in caplog.text


def test_sglang_own_sizing_runs_as_the_last_default_challenger_and_the_decision_names_it(run):
    plans = [plan.to_dict() for plan in _tonight(run, gpus=11)[0]]
    assert [p["candidate"] for p in plans[6:]] == ["no_speculation", "draft_minus_1", "cap_3_4", "cap_1_2",
                                                   "sglang_auto"]
    auto = plans[10]
    assert auto["mode"] == "sglang_defaults" and auto["extra_args"] == SEED_ARGS and plans[0]["mode"] == "tuned"
    rates = {f"n0:{30000 + n}": 1000.0 for n in range(11)}
    _decide(run, plans, rates)
    decision = json.loads(run.layout.trial_decision.read_text())
    assert decision["auto_sizing"] == "sglang_auto" and decision["servers"]["n0:30010"]["candidate"] == "sglang_auto"
    assert decision["winner"] == "incumbent"


# --- prompts an earlier run fills -----------------------------------------------------------------------------

def _previous_run(run, *, requests_per_s, servers=("n0:30000", "n0:30001", "n0:30002"), folder="scheduled__night1"):
    """An earlier successful run's report under the output root: its servers each finished ``requests_per_s``."""
    from fleetgen.report.previous import REPORT_SCHEMA

    layout = RunLayout(run.tmp / "out" / folder)
    layout.report_json.parent.mkdir(parents=True, exist_ok=True)
    layout.report_json.write_text(json.dumps({
        "schema": REPORT_SCHEMA, "run_succeeded": True, "generated_at_epoch": 1.0,
        "timing": {"generation_seconds": 100.0},
        "per_server": {server: {"completions": int(requests_per_s * 100)} for server in servers},
        "prompt_tokens": {"mean": 270.0}, "completion_tokens": {"mean": 2600.0}}))


def test_with_an_earlier_runs_pace_the_trial_needs_time_for_each_servers_warm_up_windows_and_drain(run):
    from fleetgen.tuning.trial_plan import TrialPace, prompts_needed

    _tonight(run)
    trial = read_trial_plan(run.layout)
    caps = [trial.plans[candidate][server].expected["max_running_requests"]
            for server, candidate in trial.split.assignment.items()]
    turnovers = prompts_needed(trial.split, trial.plans)
    # fast requests: windows of 60 s need many turnovers; the largest cap's turnover is the longest
    fast = TrialPace(requests_per_s=100.0, window_s=60.0, source="r")
    assert prompts_needed(trial.split, trial.plans, fast) == math.ceil(3 * 100.0 * (2 * max(caps) / 100.0 + 180))
    # slow requests: a turnover outlasts a window, and the turnover count is the larger
    slow = TrialPace(requests_per_s=0.01, window_s=60.0, source="r")
    assert prompts_needed(trial.split, trial.plans, slow) == turnovers
    # under one request a second but long windows: the time still rules
    long_windows = TrialPace(requests_per_s=0.5, window_s=600.0, source="r")
    assert prompts_needed(trial.split, trial.plans, long_windows) == math.ceil(3 * 0.5 * (2 * max(caps) / 0.5 + 1800))
    assert prompts_needed(trial.split, trial.plans, long_windows) > turnovers
    # a pace of nothing measured nothing: the turnovers
    nothing = TrialPace(requests_per_s=0.0, window_s=60.0, source="r")
    assert prompts_needed(trial.split, trial.plans, nothing) == turnovers


def test_a_trial_too_short_at_the_last_nights_pace_runs_none_and_says_whose_pace(run):
    _previous_run(run, requests_per_s=100.0)
    plans, notes = _tonight(run)  # 27,414 prompts (3 %): 3 servers at 100 requests/s need ~3 minutes' worth
    assert {p.candidate for p in plans} == {"incumbent"}
    assert notes[0].startswith("no tuning trial: its 27414 prompt(s) cannot measure these servers")
    assert notes[0].endswith("the windows a decision needs, at run scheduled__night1's 100 requests/s per server); "
                             "raise tuning_trial_share")


@pytest.mark.parametrize("previous", [
    {"requests_per_s": 10.0},                                        # slow enough: the trial holds its windows
    {"requests_per_s": 100.0, "servers": ("n0:30000", "n0:30001")},  # another fleet's pace is not tonight's
])
def test_a_pace_that_fits_or_another_fleets_lets_the_trial_run(run, previous):
    _previous_run(run, **previous)
    plans, _ = _tonight(run)
    assert {p.candidate for p in plans} == {"incumbent", "no_speculation"}


def test_a_trial_whose_prompts_an_earlier_run_fills_cannot_measure_the_split_and_runs_none_saying_so(run):
    from fleetgen.tuning.trial_plan import prompts_needed

    _tonight(run)
    trial = read_trial_plan(run.layout)
    needed = prompts_needed(trial.split, trial.plans)
    head = trial_tasks.trial_share_of(run.config, WORKLOAD.prompt_count)
    asked = []

    def reused(count):
        asked.append(count)
        return head - needed + 1, "scheduled__night1"

    plans, notes = _tonight(run, reused_in_trial=reused)
    assert asked == [head] and {p.candidate for p in plans} == {"incumbent"}
    assert notes[0].startswith(f"no tuning trial: its {needed - 1} prompt(s) cannot measure these servers")
    assert notes[1] == (f"{head - needed + 1} of the trial's {head} prompt(s) have unchanged completions in run "
                         f"scheduled__night1, which this run reuses: the trial generates {needed - 1}")
    # as many fresh prompts as the split needs: the trial runs, and the note says how many it generates
    plans, notes = _tonight(run, reused_in_trial=lambda count: (head - needed, "scheduled__night1"))
    assert len({p.candidate for p in plans}) == 2
    assert notes[1].endswith(f"the trial generates {needed}")


def _head_hashes(run, count):
    from fleetgen.generate.reuse import prompt_hash
    from fleetgen.prompts.planned import iter_shard

    return [prompt_hash(prompt) for prompt in iter_shard(run.prompts, 0, count)]


class _Source:
    def __init__(self, held):
        self.held, self.run_folder, self.closed, self.asked = set(held), "scheduled__night1", False, []

    def find(self, digests):
        self.asked.append(len(digests))
        return [(0, 0, 0, 0) if digest in self.held else None for digest in digests]

    def close(self):
        self.closed = True


def test_the_trials_reused_prompts_are_those_of_its_head_the_earlier_run_holds(run, monkeypatch):
    from fleetgen.generate import reuse
    from fleetgen.prompts.scan import scan_prompts

    # the earlier run holds p0..p5 and p50 (not in the head of 10)
    source = _Source(_head_hashes(run, 6) + _head_hashes(run, 51)[50:])
    looked = []
    monkeypatch.setattr(reuse, "look_up_reuse", lambda root, folder, material, log=None: looked.append(
        (root, folder, material)) or SimpleNamespace(source=source))
    run.call(lambda: None)
    spec = fleet_from_json(_fleet())
    scan = scan_prompts(run.prompts).to_dict()
    assert trial_tasks.reused_trial_prompts(run.config, spec, run.layout, scan, IDENTITY, 10) == (
        6, "scheduled__night1")
    assert source.asked == [10] and source.closed
    [(root, folder, material)] = looked
    assert (root, folder) == (run.config.inputs.output_root, run.layout.root.name)
    assert material["model"] == IDENTITY["parts"]
    # nothing to reuse from, no identity to key it, or no trial prompts: none reused, nothing looked up
    monkeypatch.setattr(reuse, "look_up_reuse", lambda *a, **k: SimpleNamespace(source=None))
    assert trial_tasks.reused_trial_prompts(run.config, spec, run.layout, scan, IDENTITY, 10) == (0, None)
    monkeypatch.setattr(reuse, "look_up_reuse", lambda *a, **k: pytest.fail("looked up"))
    assert trial_tasks.reused_trial_prompts(run.config, spec, run.layout, scan, None, 10) == (0, None)
    assert trial_tasks.reused_trial_prompts(run.config, spec, run.layout, scan, IDENTITY, 0) == (0, None)


# --- whether the relaunch round pays -------------------------------------------------------------------------------

def _first_round(run, seconds):
    for port in (30000, 30001, 30002):
        record_server_time(run.layout, f"n0:{port}", "launched", at=1000.0)
        record_server_time(run.layout, f"n0:{port}", "ready", at=1000.0 + seconds)


def _decide_job(run, plans, rates, prompts, **params):
    _metrics(run.layout, 0, rates)
    readiness = [{"server": f"{p['host']}:{p['port']}", "effective_max_running_requests": 20, "relaunches": 0,
                  "flags": p["flags"], "expected": p["expected"]} for p in plans]
    return run.call(trial_tasks.decide, plans, readiness, [{"shard_id": 0}], {"count": prompts},
                    tuning_trial_window_s=4, sample_interval_s=0.5, **params)


# 3 servers x a 60 s round = 180 server-s; the challenger's server is 1 - 1400/1500 = 6.7 % short for the rest. The
# trial finished 3 x 158 requests in 39.5 s: 2,000 prompts leave ~127 s (a gain of ~8 server-s), 100,000 ~8,280 s.
SLOWER_CHALLENGER = {"n0:30000": 1500.0, "n0:30001": 1500.0, "n0:30002": 1400.0}


def test_a_relaunch_that_costs_the_fleet_more_than_it_gains_is_left_out_and_the_loser_keeps_its_plan(run, caplog):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    _first_round(run, 60.0)
    with caplog.at_level("INFO", logger="fleetgen"):
        final = _decide_job(run, plans, SLOWER_CHALLENGER, 2000)
    assert final == plans and trial_tasks.relaunch_needed(plans, final) is False
    relaunch = json.loads(run.layout.trial_decision.read_text())["relaunch"]
    assert relaunch["moved"] == {"n0:30002": "no_speculation"} and relaunch["pays"] is False
    assert relaunch["round_s"] == 60.0 and relaunch["cost_server_s"] == 180.0 and relaunch["gain_server_s"] < 10
    assert relaunch["policy"] == "when_it_pays"
    assert "n0:30002 stays on no_speculation; relaunched: none" in caplog.text
    assert json.loads(run.layout.trial_decision.read_text())["winner"] == "incumbent"  # the record is the decision


def test_a_relaunch_that_pays_over_a_long_rest_and_one_asked_always_move_the_loser(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    _first_round(run, 60.0)
    moved = read_trial_plan(run.layout).plan_for("incumbent", "n0:30002").to_dict()
    assert _decide_job(run, plans, SLOWER_CHALLENGER, 100_000)[2] == moved
    assert json.loads(run.layout.trial_decision.read_text())["relaunch"]["pays"] is True
    assert _decide_job(run, plans, SLOWER_CHALLENGER, 2000, tuning_trial_relaunch="always")[2] == moved
    relaunch = json.loads(run.layout.trial_decision.read_text())["relaunch"]
    assert relaunch["pays"] is False and relaunch["policy"] == "always"


def test_without_a_measured_first_round_the_loser_is_relaunched_as_decided(run):
    plans = [plan.to_dict() for plan in _tonight(run)[0]]
    final = _decide_job(run, plans, SLOWER_CHALLENGER, 2000)
    assert final[2]["candidate"] == "incumbent"
    assert "not measured" in json.loads(run.layout.trial_decision.read_text())["relaunch"]["reason"]
