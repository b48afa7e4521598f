"""The report's Tuning payoff (report/payoff.py and its section in report/markdown.py): each candidate's measured
tokens/s per GPU next to its cap, the decision, the configuration in use against SGLang's automatic sizing and the
previous night, and the trial's cost."""

import json
from pathlib import Path

import pytest

from fleetgen.outputs import RunLayout
from fleetgen.report import build as build_module
from fleetgen.report.build import build_report
from fleetgen.report.markdown import _payoff_section
from fleetgen.report.payoff import tuning_payoff
from fleetgen.tuning.plan_notes import write_plan_notes
from fleetgen.tuning.trial import decide, decision_record, pooled_rates, skipped_record, steady_window_rates
from validate_fixtures import good_row, write_jsonl, write_run

T0 = 1_764_400_000.0
TRIAL_END = T0 + 300.0
WINDOW_S = 30.0
# candidate -> (servers, cap, output tokens/s per GPU): one tp-1 server each but the incumbent's
FLEET = {"incumbent": (["a:1", "a:2", "a:3"], 80, 1000.0), "no_speculation": (["b:1"], 100, 1300.0),
         "cap_1_2": (["c:1"], 40, 700.0)}


def metrics_rows(server: str, *, cap: int, rate: float, start: float, end: float, tokens0: float = 0.0,
                 requests0: float = 0.0, step: float = 5.0) -> list[dict]:
    """A server at its cap sampled every ``step`` s, making ``rate`` output tokens/s within 2 % from one sample to
    the next (100 tokens a request)."""
    rows, tokens, at, index = [], tokens0, start, 0
    while at <= end:
        rows.append({"t": at, "server": server, "cap": cap, "running": cap, "generation_tokens": round(tokens, 1),
                     "requests": requests0 + round(tokens / 100.0, 1) - tokens0 / 100.0, "sent": cap})
        tokens += rate * step * (1.0 + 0.004 * ((index * 7919) % 11 - 5))
        at += step
        index += 1
    return rows


def trial_run(root: Path, *, relaunched_rate: float = 1300.0, auto_sizing: str | None = None,
              window_s: float | None = None) -> RunLayout:
    """A run whose trial ran the FLEET for 300 s, then every server on the winner at ``relaunched_rate``."""
    layout = RunLayout(root)
    samples = [row for name, (servers, cap, rate) in FLEET.items() for server in servers
               for row in metrics_rows(server, cap=cap, rate=rate, start=T0, end=TRIAL_END)]
    candidate_of = {server: name for name, (servers, _, _) in FLEET.items() for server in servers}
    gpus = dict.fromkeys(candidate_of, 1)
    rates = steady_window_rates(samples, window_s=WINDOW_S, gpus_per_server=gpus)
    decision = decide(pooled_rates(rates, candidate_of), incumbent="incumbent", min_gain=0.03)
    record = decision_record(decision, servers={server: {"candidate": name, "cap": FLEET[name][1], "gpus": 1}
                                                for server, name in candidate_of.items()},
                             samples=samples, decided_at=TRIAL_END + 1.0, auto_sizing=auto_sizing, window_s=window_s)
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.trial_decision.write_text(json.dumps(record))
    after = [row for server in candidate_of for row in metrics_rows(
        server, cap=100, rate=relaunched_rate, start=TRIAL_END + 20.0, end=TRIAL_END + 400.0,
        tokens0=0.0 if candidate_of[server] != "no_speculation" else 500_000.0,
        requests0=0.0 if candidate_of[server] != "no_speculation" else 5000.0)]
    write_jsonl(layout.shard_file("metrics", 0), samples + after)
    return layout


def payoff_of(layout: RunLayout, **kwargs) -> dict:
    gpus = {server: 1 for servers, _, _ in FLEET.values() for server in servers}
    return tuning_payoff(layout, plan=kwargs.pop("plan", None), gpus_per_server=gpus,
                         simulated=kwargs.pop("simulated", False), generation_seconds=kwargs.pop("seconds", 700.0),
                         **kwargs)


def test_each_candidate_shows_its_rate_and_interval_next_to_its_cap_and_the_decision(tmp_path):
    payoff = payoff_of(trial_run(tmp_path / "run"))
    assert payoff["trial"] == "ran" and payoff["decision"]["winner"] == "no_speculation"
    rows = {row["name"]: row for row in payoff["candidates"]}
    assert list(rows) == ["incumbent", "cap_1_2", "no_speculation"]  # the incumbent first
    assert rows["incumbent"]["score"]["median"] == pytest.approx(1000.0, rel=0.01)
    assert rows["no_speculation"]["score"]["median"] == pytest.approx(1300.0, rel=0.01)
    assert rows["incumbent"]["score"]["lower"] < rows["incumbent"]["score"]["median"]
    assert (rows["no_speculation"]["cap"], rows["no_speculation"]["concurrency_x"]) == (100.0, 1.25)
    assert rows["no_speculation"]["throughput_x"] == pytest.approx(1.3, rel=0.01)
    assert rows["cap_1_2"]["concurrency_x"] == 0.5 and rows["cap_1_2"]["throughput_x"] == pytest.approx(0.7, rel=0.01)
    assert rows["incumbent"]["windows"] == 3 * rows["cap_1_2"]["windows"]  # pooled over its three servers
    assert rows["no_speculation"]["winner"] and not rows["incumbent"]["winner"]


def test_the_configuration_in_use_is_measured_after_the_decision(tmp_path):
    payoff = payoff_of(trial_run(tmp_path / "run", relaunched_rate=1250.0))
    in_use = payoff["in_use"]
    assert in_use["candidate"] == "no_speculation" and in_use["source"] == "after the decision"
    assert in_use["score"]["median"] == pytest.approx(1250.0, rel=0.01) and in_use["cap"] == 100.0
    assert in_use["servers"] == 5 and payoff["window_s"] == 30.0
    longer = payoff_of(trial_run(tmp_path / "longer", relaunched_rate=1250.0, window_s=60.0))
    assert longer["window_s"] == 60.0 and longer["in_use"]["windows"] < in_use["windows"]  # the trial's own windows


def test_the_trial_costs_the_gpu_time_a_slower_challenger_lost_and_nothing_for_a_faster_one(tmp_path):
    payoff = payoff_of(trial_run(tmp_path / "run"), seconds=700.0)
    cost = payoff["cost"]
    slow = next(row for row in cost["per_server"] if row["server"] == "c:1")
    assert slow["gpu_seconds"] == 300.0
    lost_share = 1 - payoff["candidates"][1]["score"]["median"] / payoff["candidates"][0]["score"]["median"]
    assert slow["gpu_minutes_lost"] == pytest.approx(lost_share * 300.0 / 60, abs=0.001)  # about 0.3 x 5 min
    assert [row["gpu_minutes_lost"] for row in cost["per_server"] if row["server"] == "b:1"] == [0.0]
    assert cost["gpu_minutes"] == pytest.approx(slow["gpu_minutes_lost"], abs=0.001)
    assert cost["share_of_job"] == pytest.approx(lost_share * 300.0 / (5 * 700.0), rel=0.01)


def test_a_trial_candidate_that_is_sglangs_sizing_answers_whether_more_concurrency_bought_throughput(tmp_path):
    payoff = payoff_of(trial_run(tmp_path / "run", auto_sizing="cap_1_2", relaunched_rate=1300.0))
    auto = payoff["vs_auto_sizing"]
    assert auto["measured"] and auto["source"] == "trial candidate cap_1_2, tonight"
    assert auto["concurrency_x"] == 2.5  # cap 100 in use against 40
    assert auto["throughput_x"] == pytest.approx(1300 / 700, rel=0.01)
    assert auto["ratio_of_ratios"] == pytest.approx(1300 / 700 / 2.5, rel=0.01)
    assert auto["gain"] == pytest.approx(1300 / 700 - 1, rel=0.01)
    text = "\n".join(_payoff_section(payoff))
    assert "2.50x the running requests gave 1.86x the throughput (0.74 of proportional)" in text


def test_without_a_measure_of_sglangs_sizing_the_page_says_it_is_not_measured_and_how_to_get_one(tmp_path):
    payoff = payoff_of(trial_run(tmp_path / "run"))
    assert payoff["vs_auto_sizing"]["measured"] is False
    assert "sglang_defaults" in payoff["vs_auto_sizing"]["why"]
    assert "Against SGLang's automatic sizing: not measured (no trial candidate" in "\n".join(_payoff_section(payoff))


def test_the_gain_over_the_previous_night_compares_the_configurations_in_use(tmp_path):
    previous = {"run_id": "night1", "tuning_payoff": {"in_use": {"score": {"median": 1000.0}, "cap": 80.0}}}
    payoff = payoff_of(trial_run(tmp_path / "run"), previous=previous)
    night = payoff["vs_previous"]
    assert night["previous_run_id"] == "night1" and night["gain"] == pytest.approx(0.3, rel=0.02)
    assert "Against the previous night (run night1): +30" in "\n".join(_payoff_section(payoff))
    assert payoff_of(trial_run(tmp_path / "other"))["vs_previous"] is None


def test_without_a_decision_file_the_section_says_no_trial_ran_and_measures_the_whole_run(tmp_path):
    layout = RunLayout(tmp_path / "run")
    write_jsonl(layout.shard_file("metrics", 0), [row for server in ("a:1", "a:2") for row in metrics_rows(
        server, cap=80, rate=900.0, start=T0, end=T0 + 300.0)])
    payoff = payoff_of(layout, plan=[{"candidate": "incumbent", "mode": "tuned"}])
    assert payoff["trial"] == "absent" and "trial was off" in payoff["why"]
    assert payoff["in_use"]["score"]["median"] == pytest.approx(900.0, rel=0.01)
    assert payoff["in_use"]["candidate"] == "incumbent" and payoff["cost"] is None
    text = "\n".join(_payoff_section(payoff))
    assert "No tuning trial in this run: the run has no trial decision" in text and "| candidate |" not in text


def test_a_skipped_or_unusable_decision_file_says_why(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.trial_decision.write_text(json.dumps(skipped_record("the fleet has 2 servers; a trial needs 3")))
    payoff = payoff_of(layout)
    assert (payoff["trial"], payoff["why"]) == ("skipped", "the fleet has 2 servers; a trial needs 3")
    assert "No tuning trial in this run: the fleet has 2 servers; a trial needs 3." in _payoff_section(payoff)
    assert payoff["in_use"]["score"] is None and "not measured (0 steady windows" in "\n".join(_payoff_section(payoff))
    layout.trial_decision.write_text('{"incumbent": "incumbent"}')
    broken = payoff_of(layout)
    assert broken["trial"] == "unusable" and "trial-decision.json is not usable" in broken["why"]


def test_without_a_trial_the_section_gives_the_plans_own_reasons_and_with_one_none(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    too_few = ("no tuning trial: 2 server(s), and a trial needs at least 3 (the incumbent on most, each challenger "
               "on one)")
    write_plan_notes(layout, nodes_left_out={}, long_prompt=None, tuning_trial=[too_few])
    # what trial.decide writes when derive_plan planned no trial: it does not know why
    layout.trial_decision.write_text(json.dumps(skipped_record(
        "no tuning trial: derive_plan planned none (see its log for why)")))
    payoff = payoff_of(layout)
    assert payoff["plan_notes"] == [too_few]
    lines = _payoff_section(payoff)
    assert lines[lines.index("The plan's notes on the trial (derive_plan):") + 2] == f"- {too_few}"
    # a note that is the decision file's reason itself is not said twice
    layout.trial_decision.write_text(json.dumps(skipped_record(too_few)))
    assert "The plan's notes on the trial (derive_plan):" not in _payoff_section(payoff_of(layout))
    ran = trial_run(tmp_path / "ran")
    write_plan_notes(ran, nodes_left_out={}, long_prompt=None, tuning_trial=["candidate cap_1_2: the cap at 1/2"])
    assert payoff_of(ran)["plan_notes"] == [] and "derive_plan" not in "\n".join(_payoff_section(payoff_of(ran)))


def test_simulated_figures_are_marked_in_the_section(tmp_path):
    text = "\n".join(_payoff_section(payoff_of(trial_run(tmp_path / "run"), simulated=True)))
    assert "> **Simulated**: these rates come from the simulator's speed model" in text
    assert "Simulated" not in "\n".join(_payoff_section(payoff_of(trial_run(tmp_path / "real"))))


def test_the_section_tables_each_candidate_and_states_the_decision_and_the_cost(tmp_path):
    text = "\n".join(_payoff_section(payoff_of(trial_run(tmp_path / "run"))))
    assert "## Tuning payoff" in text and "Decision: no_speculation replaces incumbent" in text
    assert ("| candidate | servers | running requests (cap) | tokens/s per GPU | interval | windows | concurrency x | "
            "throughput x | result |") in text
    assert "| no_speculation | 1 | 100 | 1,30" in text and "| 1.25x | 1.30x | **chosen** |" in text
    assert "| cap_1_2 | 1 | 40 | 70" in text and "| 0.50x | 0.70x | lost |" in text
    assert "- Trial cost: 1.50 GPU-minutes at the challengers' lower speed (2." in text


def test_a_relaunch_left_out_because_it_would_not_pay_is_stated_with_its_figures(tmp_path):
    layout = trial_run(tmp_path / "run")
    record = json.loads(layout.trial_decision.read_text())
    record["relaunch"] = {"moved": {"c:1": "cap_1_2"}, "policy": "when_it_pays", "pays": False,
                          "reason": "relaunching would idle 5 server(s) for ~60 s (the first round's launch-to-ready) "
                                    "= 300 server-s, to gain 120 server-s over the ~400 s left at the trial's pace: "
                                    "keeping c:1 on cap_1_2 for the rest of the job"}
    layout.trial_decision.write_text(json.dumps(record))
    payoff = payoff_of(layout)
    assert payoff["relaunch"] == record["relaunch"]
    text = "\n".join(_payoff_section(payoff))
    assert ("- Relaunch round (when_it_pays): relaunching would idle 5 server(s) for ~60 s (the first round's "
            "launch-to-ready) = 300 server-s, to gain 120 server-s over the ~400 s left at the trial's pace: keeping "
            "c:1 on cap_1_2 for the rest of the job.") in text
    record["relaunch"] = {**record["relaunch"], "moved": {}, "reason": "no server moves"}
    layout.trial_decision.write_text(json.dumps(record))
    assert "Relaunch round" not in "\n".join(_payoff_section(payoff_of(layout)))


PLAN_INPUTS = {"gpus": [{"name": "NVIDIA B200"}], "profile": {"architecture": "Qwen3_5ForCausalLM",
                                                               "weights_bytes_total": 54_000_000_000}}


def test_a_report_finds_the_earlier_run_on_sglangs_sizing_of_the_same_fleet_and_compares(tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "write_plots", lambda report, folder: {})
    validation = {"success": True, "expectations": []}

    def plan(mode: str) -> list[dict]:
        return [{"host": server.split(":")[0], "port": int(server.split(":")[1]), "gpu_ids": [0], "flags": {},
                 "expected": {}, "mode": mode, "inputs": PLAN_INPUTS, "candidate": name}
                for name, (servers, _, _) in FLEET.items() for server in servers]

    auto = RunLayout(tmp_path / "auto")
    write_run(auto.root, [good_row(index) for index in range(30)])
    write_jsonl(auto.shard_file("metrics", 0), [row for servers, _, _ in FLEET.values() for server in servers
                                                for row in metrics_rows(server, cap=50, rate=800.0, start=T0,
                                                                        end=T0 + 300.0)])
    build_report(auto.root, run_id="auto", plan=plan("sglang_defaults"), readiness=None, shard_results=None,
                 validation=validation, previous_report=None)
    tonight = trial_run(tmp_path / "tonight")
    write_run(tonight.root, [good_row(index) for index in range(30)])
    brief = build_report(tonight.root, run_id="tonight", plan=plan("tuned"), readiness=None, shard_results=None,
                         validation=validation, previous_report=None)
    report = json.loads(Path(brief["report_json"]).read_text())
    auto_sizing = report["tuning_payoff"]["vs_auto_sizing"]
    assert auto_sizing["source"] == "run auto (tuning mode sglang_defaults)"
    assert auto_sizing["concurrency_x"] == 2.0 and auto_sizing["throughput_x"] == pytest.approx(1300 / 800, rel=0.01)
    assert "## Tuning payoff" in Path(brief["report_md"]).read_text()
    other_fleet = [{**item, "inputs": {**PLAN_INPUTS, "gpus": [{"name": "NVIDIA H200"}]}} for item in plan("tuned")]
    brief = build_report(tonight.root, run_id="tonight", plan=other_fleet, readiness=None, shard_results=None,
                         validation=validation, previous_report=None)
    assert json.loads(Path(brief["report_json"]).read_text())["tuning_payoff"]["vs_auto_sizing"]["measured"] is False
