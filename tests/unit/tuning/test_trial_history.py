"""The tuning trials across nights (tuning/trial_history.py): one record per decision and key, the latest
winner the next night starts from, and the candidates already tried."""

import json

import pytest

from fleetgen.outputs import trial_history_file
from fleetgen.tuning.trial import decide
from fleetgen.tuning.trial_history import (TrialHistory, TrialKey, model_identity_key, nearest_power_of_two,
                                           workload_bucket)

KEY = TrialKey(gpu="NVIDIA B200", model="qwen3.6-27b@0123456789ab", sglang_version="0.5.23", workload="out1024-short")
OTHER_GPU = TrialKey(gpu="NVIDIA H200", model=KEY.model, sglang_version=KEY.sglang_version, workload=KEY.workload)


def decision(incumbent: str, rates: dict[str, list[float]]):
    return decide(rates, incumbent=incumbent, min_gain=0.03)


def test_before_any_trial_there_is_no_winner_and_nothing_tried(tmp_path):
    history = TrialHistory(trial_history_file(tmp_path))
    assert history.latest_winner(KEY) is None and history.tried(KEY) == set() and history.records(KEY) == []


def test_the_next_night_starts_from_the_last_winner_of_the_same_key_only(tmp_path):
    history = TrialHistory(trial_history_file(tmp_path))
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "no-spec": [130.0] * 3}), run_id="night1")
    history.record(KEY, decision("no-spec", {"no-spec": [130.0] * 3, "cap-3/4": [131.0] * 3}), run_id="night2")
    history.record(OTHER_GPU, decision("mtp", {"mtp": [100.0] * 3}), run_id="night2")
    assert history.latest_winner(KEY) == "no-spec"  # night 2 kept it (+0.8 % is within the 3 %)
    assert history.tried(KEY) == {"mtp", "no-spec", "cap-3/4"}
    assert history.latest_winner(OTHER_GPU) == "mtp" and history.tried(OTHER_GPU) == {"mtp"}
    assert [record["run_id"] for record in history.records(KEY)] == ["night1", "night2"]


def test_a_challenger_that_gave_too_few_windows_counts_as_tried(tmp_path):
    history = TrialHistory(tmp_path / "trials.jsonl")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "mtp-2": [90.0]}), run_id="night1")
    assert history.tried(KEY) == {"mtp", "mtp-2"} and history.latest_winner(KEY) == "mtp"


def test_a_retried_decide_replaces_its_runs_record_and_keeps_the_others(tmp_path):
    history = TrialHistory(tmp_path / "trials.jsonl")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3}), run_id="night1")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "no-spec": [150.0] * 3}), run_id="night2")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "no-spec": [101.0] * 3}), run_id="night2")
    assert [record["run_id"] for record in history.records(KEY)] == ["night1", "night2"]
    assert history.latest_winner(KEY) == "mtp"


def test_each_record_names_its_key_run_and_the_whole_decision(tmp_path):
    path = tmp_path / "trials.jsonl"
    chosen = decision("mtp", {"mtp": [100.0] * 3, "no-spec": [130.0] * 3})
    entry = TrialHistory(path).record(KEY, chosen, run_id="night1")
    (line,) = path.read_text().splitlines()
    assert json.loads(line) == entry
    assert {key: entry[key] for key in ("key", "gpu", "model", "sglang_version", "workload", "run_id")} == {
        "key": "NVIDIA B200|0.5.23|qwen3.6-27b@0123456789ab|out1024-short", "gpu": "NVIDIA B200",
        "model": KEY.model, "sglang_version": "0.5.23", "workload": "out1024-short", "run_id": "night1"}
    assert TrialHistory(path).decisions(KEY) == [chosen]


def test_records_read_oldest_first_whatever_their_order_in_the_file(tmp_path):
    path = tmp_path / "trials.jsonl"
    history = TrialHistory(path)
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3}), run_id="night1")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "no-spec": [200.0] * 3}), run_id="night2")
    first, second = path.read_text().splitlines()
    undated = {**json.loads(first), "run_id": "by-hand"}
    del undated["recorded_at"]
    path.write_text("\n".join([second, first, json.dumps(undated)]) + "\n")  # two files merged by hand
    assert [record["run_id"] for record in history.records(KEY)] == ["by-hand", "night1", "night2"]
    assert history.latest_winner(KEY) == "no-spec"


def test_the_first_record_makes_the_folders_of_its_file(tmp_path):
    history = TrialHistory(tmp_path / "out" / "trials" / "history.jsonl")
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3}), run_id="night1")
    assert history.latest_winner(KEY) == "mtp"


def test_a_line_that_is_not_a_record_is_skipped_and_the_records_around_it_stand(tmp_path):
    path = tmp_path / "trials.jsonl"
    history = TrialHistory(path)
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3}), run_id="night1")
    first = path.read_text()
    history.record(KEY, decision("mtp", {"mtp": [100.0] * 3, "no-spec": [200.0] * 3}), run_id="night2")
    second = path.read_text().splitlines()[1]
    path.write_text(first + '{"key": "NVIDIA B200|0.5\n' + '["not", "a record"]\n' + second + "\n")  # a hand edit
    assert history.latest_winner(KEY) == "no-spec" and len(history.records(KEY)) == 2
    history.record(KEY, decision("no-spec", {"no-spec": [200.0] * 3}), run_id="night3")
    assert len(path.read_text().splitlines()) == 3  # the next write keeps the records, not the rest


@pytest.mark.parametrize(("prompt", "output", "bucket"), [
    (300.0, 1000.0, "out1024-short"), (4096.0, 1024.0, "out1024-long"), (1024.0, 1024.0, "out1024-short"),
    (200.0, 700.0, "out512-short"), (200.0, 760.0, "out1024-short"), (10.0, 0.4, "out1-long"),
    (10.0, 0.0, "out1-long")])
def test_the_workload_bucket_is_the_mean_output_to_a_power_of_two_and_the_prompts_against_it(prompt, output, bucket):
    assert workload_bucket(prompt, output) == bucket


def test_nearest_power_of_two_rounds_in_log_scale():
    assert [nearest_power_of_two(value) for value in (1, 1.4, 1.5, 2, 3, 5.5, 6, 1400, 1500, 0.2, 0)] == [
        1, 1, 2, 2, 4, 4, 8, 1024, 2048, 1, 1]


def test_the_model_key_follows_what_changes_speed_not_the_tokenizer_or_the_template():
    identity = {"path": "/models/qwen3.6-27b/", "parts": {"weights": "w1", "config": "c1", "launch_args": "a1",
                                                           "tokenizer": "t1", "chat_template": "h1"}}
    key = model_identity_key(identity)
    assert key.startswith("qwen3.6-27b@") and len(key.split("@")[1]) == 12
    same = {**identity, "parts": {**identity["parts"], "tokenizer": "t2", "chat_template": "h2"}}
    assert model_identity_key(same) == key
    for part in ("weights", "config", "launch_args"):
        assert model_identity_key({**identity, "parts": {**identity["parts"], part: "other"}}) != key


def test_the_model_key_of_an_identity_is_the_same_in_every_release():
    # a key already in last night's history file must read the same after an upgrade, or the history is lost
    identity = {"path": "/models/qwen3.6-27b/", "parts": {"weights": "w1", "config": "c1", "launch_args": "a1"}}
    assert model_identity_key(identity) == "qwen3.6-27b@b3b2280714c4"
    assert model_identity_key({"parts": {"weights": "w1"}}) == "@e536d3929ad4"  # no path: its parts alone
