"""The tuning trial's measurement and decision (tuning/trial.py): steady-state windows from the servers' counters,
the conservative score, and a decision that keeps the incumbent unless a challenger is clearly faster."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.errors import ConfigError
from fleetgen.tuning.trial import (MAD_SCALE, MIN_WINDOWS, RateScore, TrialDecision, decide, decision_record,
                                   pooled_rates, score, skipped_record, steady_window_rates)


def rows(server: str = "n:1", *, cap: int = 10, seconds: int = 60, rate: float = 100.0, start: float = 1000.0,
         running=None, per_request: float = 50.0, tokens0: float = 0.0, requests0: float = 0.0) -> list[dict]:
    """A server sampled every second at its cap, its output tokens growing at ``rate`` per second and its finished
    requests at ``rate / per_request``; ``running(i)`` overrides the running requests of second i."""
    return [{"t": start + i, "server": server, "cap": cap, "running": running(i) if running else cap,
             "generation_tokens": tokens0 + rate * i, "requests": requests0 + rate / per_request * i}
            for i in range(seconds + 1)]


def one_server(samples, window_s=10.0, tp=1, **kwargs):
    return steady_window_rates(samples, window_s=window_s, gpus_per_server={"n:1": tp}, **kwargs)["n:1"]


def test_a_steady_server_measures_its_counters_slope_per_gpu_after_one_turnover_of_its_batch():
    # 2 requests finish per second: the first 10 (one cap) are warm-up, so windows start at second 5
    assert one_server(rows(), tp=2) == [50.0] * 5  # seconds 5..55, 10 s each, per GPU of a tp-2 server


def test_the_warm_up_turnover_is_the_caps_worth_of_completions_however_fast_the_first_ones_finish():
    samples = rows(seconds=60)
    for row in samples:  # the first 5 s (10 completions, one cap) count tokens at 40/s: the counter lags the work
        i = row["t"] - 1000.0
        row["generation_tokens"] = 40.0 * i if i <= 5 else 200.0 + 100.0 * (i - 5)
    assert one_server(samples) == [100.0] * 5  # windows from second 5, none over the warm-up


def test_the_warm_up_is_the_first_caps_worth_of_completions_not_the_first_rows():
    # nothing finishes for 20 s while the batch that was admitted together decodes (the counter lags the work)
    samples = rows(seconds=80)
    for row in samples:
        late = max(0.0, row["t"] - 1020.0)
        row["generation_tokens"], row["requests"] = 100.0 * late, 2.0 * late
    rates = one_server(samples)
    assert rates == [100.0] * 5  # from second 25 (10 completions after 20) to 75
    assert 0.0 not in rates  # the flat start would read as a stalled server


def test_the_queues_drain_and_a_server_below_its_cap_give_no_window():
    drain = rows(seconds=60, running=lambda i: 10 if i < 30 else 5)
    assert one_server(drain) == [100.0, 100.0]  # seconds 5..25 only
    assert one_server(rows(running=lambda i: 8)) == []  # 80 % of the cap is not the batch it was sized for
    assert one_server(rows(running=lambda i: 9)) == [100.0] * 5  # 90 % is


def test_a_server_of_one_request_at_its_batch_is_steady_and_one_with_no_cap_is_not():
    assert one_server(rows(cap=1, running=lambda i: 1, per_request=100.0)) == [100.0] * 5  # warm-up: 1 completion
    assert one_server(rows(cap=0, running=lambda i: 0)) == []


def test_a_server_sampled_once_a_window_still_gives_windows_even_of_one_second():
    every_window = [row for row in rows(seconds=60) if (row["t"] - 1000.0) % 10 == 0]
    assert one_server(every_window) == [100.0] * 5  # a gap of exactly one window is not a gap nobody saw
    assert one_server(rows(seconds=10), window_s=1.0) == [100.0] * 5  # each second from 5 to 10


def test_a_lower_steady_share_admits_a_server_that_runs_under_its_cap():
    assert one_server(rows(running=lambda i: 8), min_running_share=0.8) == [100.0] * 5


def test_rows_of_several_shards_sampling_one_server_interleave_into_the_same_windows():
    single = one_server(rows(seconds=120))
    other_shard = [{**row, "t": row["t"] + 0.4, "generation_tokens": row["generation_tokens"] + 40.0,
                    "requests": row["requests"] + 0.8} for row in rows(seconds=119)]
    merged = rows(seconds=120) + other_shard
    random.Random(7).shuffle(merged)
    assert one_server(merged) == pytest.approx(single)


def test_two_shards_rows_that_cross_by_a_few_completions_are_not_a_restart():
    samples = rows(seconds=60)
    slow_answers = [{**row, "t": row["t"] + 0.2, "generation_tokens": row["generation_tokens"] - 150.0,
                     "requests": row["requests"] - 3.0} for row in rows(seconds=60)[20:]]  # read before the other
    assert one_server(samples + slow_answers) == pytest.approx([100.0] * 5, rel=0.2)


def test_no_window_spans_a_restart_and_the_restarted_server_warms_up_again():
    before = rows(seconds=30)
    after = rows(seconds=30, start=1031.0)  # counters from zero: the server was restarted
    rates = one_server(before + after)
    assert rates == [100.0] * 4  # 2 before (5..25), 2 after its warm-up (36..56); none across the drop
    assert len([rate for rate in rates if rate < 0]) == 0
    early_sample = rows(seconds=30) + rows(seconds=30, start=1031.0, tokens0=1200.0)  # first count 40 % of the old
    assert one_server(early_sample) == [100.0] * 4


def test_no_window_spans_a_relaunch_on_another_cap_or_a_gap_nobody_sampled():
    relaunched = rows(seconds=30) + rows(seconds=30, start=1031.0, cap=20, tokens0=3100.0, requests0=62.0)
    assert one_server(relaunched) == [100.0] * 4  # 5..25, then 20 completions of warm-up on the new cap: 41..61
    gap = rows(seconds=30) + rows(seconds=30, start=1050.0, tokens0=5000.0, requests0=100.0)
    assert one_server(gap) == [100.0] * 4  # 5..25, then 1055..1075


def test_rows_without_the_counters_are_not_measured_and_every_sampled_server_is_named():
    old = [{key: value for key, value in row.items() if key != "generation_tokens"} for row in rows(server="n:2")]
    rates = steady_window_rates(rows() + old, window_s=10.0, gpus_per_server={"n:1": 1, "n:2": 1})
    assert set(rates) == {"n:1"}
    idle = steady_window_rates(rows(server="n:3", running=lambda i: 0), window_s=10.0, gpus_per_server={"n:3": 1})
    assert idle == {"n:3": []}


def test_a_server_without_a_gpu_count_is_an_error_naming_it():
    with pytest.raises(ConfigError) as caught:
        steady_window_rates(rows(server="gpu7:30001"), window_s=10.0, gpus_per_server={"n:1": 1})
    assert "gpu7:30001" in str(caught.value) and caught.value.server == "gpu7:30001"
    assert "no GPU count" in caught.value.message
    assert caught.value.hint == "pass every sampled server's tensor-parallel size"
    with pytest.raises(ConfigError, match="positive"):
        steady_window_rates(rows(), window_s=0, gpus_per_server={"n:1": 1})


def test_pooled_rates_put_each_servers_windows_under_its_candidate():
    pooled = pooled_rates({"a:1": [1.0, 2.0], "a:2": [3.0], "b:1": [4.0]},
                          {"a:1": "incumbent", "a:2": "incumbent", "b:1": "no-spec", "c:1": "cap-half"})
    assert pooled == {"incumbent": [1.0, 2.0, 3.0], "no-spec": [4.0], "cap-half": []}


def test_the_score_is_the_median_less_scaled_mad_and_needs_three_windows():
    judged = score("a", [100.0, 110.0, 90.0, 130.0])
    assert (judged.windows, judged.median, judged.mad) == (4, 105.0, 10.0)
    assert (judged.lower, judged.upper) == (105.0 - MAD_SCALE * 10.0, 105.0 + MAD_SCALE * 10.0)
    assert judged.relative_mad == pytest.approx(10 / 105) and not judged.noisy
    assert score("a", [100.0, 100.0]) is None and MIN_WINDOWS == 3
    assert score("a", [100.0, 80.0, 125.0]).noisy  # MAD 20 of median 100


def test_a_clearly_faster_challenger_replaces_the_incumbent_and_the_reason_says_by_how_much():
    decision = decide({"incumbent": [100.0, 101.0, 99.0, 100.0], "no-spec": [120.0, 121.0, 119.0]},
                      incumbent="incumbent", min_gain=0.03)
    assert decision.winner == "no-spec" and decision.changed
    assert decision.gain == pytest.approx(0.2)
    assert "no-spec replaces incumbent" in decision.reason and "+20.0%" in decision.reason


def test_within_the_minimum_gain_the_incumbent_is_kept_even_when_the_bounds_separate():
    tight = {"incumbent": [100.0] * 4, "cap-3/4": [102.0] * 4}  # bounds apart (MAD 0), median +2 %
    decision = decide(tight, incumbent="incumbent", min_gain=0.03)
    assert decision.winner == "incumbent" and not decision.changed
    assert "+2.0%" in decision.reason and "3%" in decision.reason
    assert decide(tight, incumbent="incumbent", min_gain=0.01).winner == "cap-3/4"


def test_a_challenger_whose_lower_bound_does_not_beat_the_incumbents_upper_bound_loses():
    overlapping = {"incumbent": [95.0, 100.0, 105.0], "mtp-2": [100.0, 108.0, 116.0]}  # median +8 %, MAD 5 and 8
    decision = decide(overlapping, incumbent="incumbent", min_gain=0.03)
    assert decision.winner == "incumbent" and "lower bound" in decision.reason


def test_a_noisy_challenger_cannot_win_and_a_noisy_incumbent_is_kept_and_both_are_said():
    noisy_challenger = decide({"incumbent": [100.0] * 3, "x": [300.0, 200.0, 400.0]}, incumbent="incumbent",
                              min_gain=0.03)
    assert noisy_challenger.winner == "incumbent" and "too noisy" in noisy_challenger.reason
    noisy_incumbent = decide({"incumbent": [100.0, 50.0, 150.0], "x": [400.0] * 3}, incumbent="incumbent",
                             min_gain=0.03)
    assert noisy_incumbent.winner == "incumbent" and "too noisy" in noisy_incumbent.reason
    assert "tuning_trial_window_s" in noisy_incumbent.reason
    with_unscored = decide({"incumbent": [100.0, 50.0, 150.0], "x": [400.0]}, incumbent="incumbent", min_gain=0.03)
    assert (with_unscored.incumbent, with_unscored.min_gain, with_unscored.unscored) == ("incumbent", 0.03, {"x": 1})


def test_an_incumbent_with_too_few_windows_is_kept_and_the_reason_says_how_many():
    decision = decide({"incumbent": [100.0, 100.0], "x": [400.0] * 5}, incumbent="incumbent", min_gain=0.03)
    assert decision.winner == "incumbent" and "2 steady-state window(s)" in decision.reason
    assert "tuning_trial_share" in decision.reason
    assert decision.unscored == {"incumbent": 2} and decision.gain is None
    assert (decision.incumbent, decision.min_gain) == ("incumbent", 0.03)


def test_challengers_that_gave_too_few_windows_are_named_but_not_judged():
    decision = decide({"incumbent": [100.0] * 3, "x": [900.0, 900.0], "y": [900.0]}, incumbent="incumbent",
                      min_gain=0.03)
    assert decision.winner == "incumbent" and "(windows: x (2), y (1))" in decision.reason
    assert decision.candidates == {"incumbent", "x", "y"} and decision.min_gain == 0.03
    alone = decide({"incumbent": [100.0] * 3}, incumbent="incumbent", min_gain=0.03)
    assert alone.reason == "kept incumbent (100 tokens/s per GPU): no challenger gave 3 steady-state windows"


def test_a_challenger_exactly_the_minimum_gain_faster_or_whose_lower_bound_meets_the_upper_bound_loses():
    exactly_the_gain = decide({"incumbent": [100.0] * 3, "x": [125.0] * 3}, incumbent="incumbent", min_gain=0.25)
    assert exactly_the_gain.winner == "incumbent" and "+25.0%, not more than the 25%" in exactly_the_gain.reason
    touching = {"incumbent": [100.0] * 3, "x": [104.826, 114.826, 124.826]}
    assert score("x", touching["x"]).lower == score("incumbent", touching["incumbent"]).upper  # the case itself
    assert decide(touching, incumbent="incumbent", min_gain=0.03).winner == "incumbent"


def test_a_challenger_as_fast_as_the_incumbent_is_kept_for_its_median_not_its_bounds():
    same = decide({"incumbent": [100.0] * 3, "x": [100.0] * 3}, incumbent="incumbent", min_gain=0.0)
    assert "its median is +0.0%, not more than the 0% a change needs" in same.reason


def test_the_shortfall_is_relative_at_any_scale_and_a_stalled_incumbent_is_kept_saying_so():
    slow = decide({"incumbent": [0.5] * 3, "x": [0.51] * 3}, incumbent="incumbent", min_gain=0.03)
    assert "+2.0%" in slow.reason
    stalled = decide({"incumbent": [0.0] * 3, "x": [0.0] * 3}, incumbent="incumbent", min_gain=0.03)
    assert stalled.winner == "incumbent" and "its median is +0.0%" in stalled.reason
    stalled_and_noisy = decide({"incumbent": [0.0] * 3, "x": [0.0, 50.0, 100.0]}, incumbent="incumbent",
                               min_gain=0.03)
    assert "too noisy" in stalled_and_noisy.reason


def test_among_several_winners_the_highest_lower_bound_wins():
    rates = {"incumbent": [100.0] * 3, "fast-wide": [140.0, 128.0, 152.0, 130.0, 150.0],
             "steady": [130.0, 131.0, 129.0], "steadier": [128.0, 128.0, 128.0]}
    assert decide(rates, incumbent="incumbent", min_gain=0.03).winner == "steady"


def test_a_tie_between_two_winners_goes_to_the_first_by_name():
    rates = {"incumbent": [100.0] * 3, "b": [130.0] * 3, "a": [130.0] * 3}
    assert decide(rates, incumbent="incumbent", min_gain=0.03).winner == "a"


def test_a_decision_survives_its_json_and_a_malformed_one_is_a_config_error():
    decision = decide({"incumbent": [100.0, 101.0, 99.0], "x": [130.0] * 3, "y": [1.0]}, incumbent="incumbent",
                      min_gain=0.05)
    again = TrialDecision.from_dict(decision.to_dict())
    assert again == decision and again.min_gain == 0.05 and again.unscored == {"y": 1}
    assert isinstance(again.scores["x"], RateScore)
    with pytest.raises(ConfigError, match="not a tuning trial decision: KeyError") as caught:
        TrialDecision.from_dict({"incumbent": "a", "scores": {}})
    assert caught.value.hint == "the decide task writes it; re-run the run's decide task"
    without_gain = {key: value for key, value in decision.to_dict().items() if key != "min_gain"}
    assert TrialDecision.from_dict(without_gain).min_gain == 0.0  # a record written before it was kept


def test_the_decision_record_charges_each_server_its_trial_seconds():
    decision = decide({"incumbent": [100.0] * 3}, incumbent="incumbent", min_gain=0.03)
    samples = rows("a:1", seconds=40) + rows("b:1", seconds=25, start=1010.0) + [{"server": "a:1", "t": None}]
    samples += [{**rows("b:1", seconds=0)[0], "t": 1035.12345}]
    record = decision_record(decision, servers={"a:1": {"candidate": "incumbent", "cap": 10, "gpus": 2},
                                                "b:1": {"candidate": "x", "cap": 5, "gpus": 1},
                                                "c:1": {"candidate": "x", "cap": 5}}, samples=samples,
                             decided_at=1041.5, auto_sizing="x", window_s=10.0)
    assert record["servers"]["a:1"] == {"candidate": "incumbent", "cap": 10, "gpus": 2, "trial_seconds": 40.0}
    assert record["servers"]["b:1"]["trial_seconds"] == 25.123  # to the millisecond
    assert record["servers"]["c:1"] == {"candidate": "x", "cap": 5, "gpus": 1, "trial_seconds": 0.0}
    assert (record["decided_at"], record["auto_sizing"], record["window_s"]) == (1041.5, "x", 10.0)
    assert TrialDecision.from_dict(record) == decision
    assert skipped_record("the trial is off") == {"skipped": "the trial is off"}


# Properties. Rates are whole numbers so that spreading them about their median is exact in floating point.
RATES = st.lists(st.integers(min_value=100, max_value=5000), min_size=MIN_WINDOWS, max_size=12)
GAIN = st.sampled_from([0.0, 0.01, 0.03, 0.1])


def spread(rates: list[int], factor: int) -> list[float]:
    """Noise: every window moved ``factor`` times as far from the median, on its side (the median stays)."""
    middle = score("x", [float(rate) for rate in rates]).median
    return [middle + factor * (rate - middle) for rate in rates]


@settings(max_examples=300, deadline=None)
@given(RATES, RATES, GAIN)
def test_swapping_which_candidate_is_faster_swaps_the_decision(first, second, min_gain):
    decision = decide({"a": first, "b": second}, incumbent="a", min_gain=min_gain)
    if decision.winner == "b":
        assert decide({"a": second, "b": first}, incumbent="a", min_gain=min_gain).winner == "a"
        assert decide({"a": first, "b": second}, incumbent="b", min_gain=min_gain).winner == "b"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=950, max_value=1050), min_size=MIN_WINDOWS, max_size=10),
       st.floats(min_value=1.5, max_value=3.0), GAIN)
def test_a_clearly_faster_candidate_wins_whichever_side_it_is_on(base, factor, min_gain):
    fast = [rate * factor for rate in base]
    assert decide({"a": base, "b": fast}, incumbent="a", min_gain=min_gain).winner == "b"
    assert decide({"a": fast, "b": base}, incumbent="a", min_gain=min_gain).winner == "a"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["inc", "b", "c", "d"]), RATES, min_size=2), GAIN,
       st.sampled_from(["inc", "b", "c", "d"]), st.integers(min_value=1, max_value=6))
def test_adding_noise_never_makes_a_loser_win(rates, min_gain, noisy, factor):
    rates.setdefault("inc", [1000] * MIN_WINDOWS)
    before = decide(rates, incumbent="inc", min_gain=min_gain)
    eligible = {before.winner, "inc"} | {name for name, value in before.scores.items()
                                         if name != "inc" and "inc" in before.scores and not before.scores["inc"].noisy
                                         and not value.noisy and value.lower > before.scores["inc"].upper
                                         and value.median > before.scores["inc"].median * (1 + min_gain)}
    after = decide({**rates, noisy: spread(rates[noisy], factor)} if noisy in rates else rates, incumbent="inc",
                   min_gain=min_gain)
    assert after.winner in eligible


@settings(max_examples=200, deadline=None)
@given(RATES, st.integers(min_value=1, max_value=4), GAIN)
def test_identical_candidates_keep_the_incumbent(rates, challengers, min_gain):
    candidates = {"inc": rates, **{f"c{index}": list(rates) for index in range(challengers)}}
    assert decide(candidates, incumbent="inc", min_gain=min_gain).winner == "inc"


def test_a_server_whose_running_gauge_leaves_out_the_requests_it_just_admitted_is_steady_while_some_wait():
    # SGLang reads num_running_reqs after an admission without the admitted ones: a cap of 8 turning over two at a
    # time reads 6 at every other scrape, a cap of 1 reads 0; the requests waiting in its queue say it is full
    turning_over = rows(cap=8, running=lambda i: 6 if i % 2 else 8, per_request=25.0)
    for row in turning_over:
        row["queue"] = 2
    assert one_server(turning_over) == [100.0] * 5
    one_at_a_time = rows(cap=1, running=lambda i: i % 2, per_request=100.0)
    for row in one_at_a_time:
        row["queue"] = 1
    assert one_server(one_at_a_time) == [100.0] * 5
    # the drain: the queue empty and the running requests falling, whatever the gauge read before
    for row in turning_over[30:]:
        row["queue"], row["running"] = 0, 5
    assert one_server(turning_over) == [100.0, 100.0]  # seconds 5..25 only
