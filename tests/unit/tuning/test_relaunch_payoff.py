"""Whether the relaunch round pays: the arithmetic of tuning/relaunch_payoff.py."""

from __future__ import annotations

import pytest

from fleetgen.tuning import relaunch_payoff
from fleetgen.tuning.relaunch_payoff import estimate, first_round_s, rest_seconds, trial_completions


def _times(*events):
    return {server: [{"server": server, "event": event, "t": t} for event, t in rows] for server, rows in events}


def test_the_round_is_the_slowest_launch_to_ready_of_the_first_round_and_kept_servers_do_not_count():
    times = _times(("a", [("launched", 100.0), ("ready", 160.0)]),
                   ("b", [("stopped", 90.0), ("launched", 101.0), ("ready", 185.0), ("stopped", 400.0)]),
                   ("c", [("kept", 100.0), ("ready", 100.5)]))
    assert first_round_s(times) == pytest.approx(84.0)


def test_a_ready_before_the_launch_is_an_earlier_runs_and_no_launch_means_no_round_measured():
    assert first_round_s(_times(("a", [("ready", 50.0), ("launched", 100.0), ("ready", 130.0)]))) == 30.0
    # a kept server before a launched one is passed over, not the end of the look; a ready in the same instant counts
    assert first_round_s(_times(("k", [("kept", 1.0)]), ("a", [("launched", 5.0), ("ready", 5.0)]),
                                ("b", [("launched", 5.0), ("ready", 9.0)]))) == 4.0
    assert first_round_s(_times(("a", [("launched", 5.0), ("ready", 5.0)]))) == 0.0
    assert first_round_s(_times(("a", [("kept", 1.0), ("ready", 2.0)]))) is None
    assert first_round_s(_times(("a", [("launched", 1.0)]))) is None
    assert first_round_s({}) is None


def _row(server, t, requests):
    return {"server": server, "t": t, "requests": requests}


def test_the_trial_counts_each_servers_finished_requests_by_their_rises_and_its_span():
    rows = [_row("a", 10.0, 500), _row("a", 20.0, 530), _row("b", 12.0, 0), _row("b", 30.0, 20),
            _row("a", 15.0, 510),
            _row("b", 25.0, 3), _row("b", 26.0, 2)]  # b restarted at 25 s: its fall adds nothing
    assert trial_completions(rows) == (30 + 3 + 0 + 18, 20.0)
    assert trial_completions([]) == (0, 0.0)


def test_the_rest_of_the_job_is_the_prompts_left_at_the_trials_pace():
    assert rest_seconds(1000, 100, 50.0) == pytest.approx(450.0)
    assert rest_seconds(100, 120, 50.0) == 0  # retried prompts: nothing left
    assert rest_seconds(None, 100, 50.0) is None
    assert rest_seconds(1000, 0, 50.0) is None and rest_seconds(1000, 10, 0.0) is None
    assert rest_seconds(11, 1, 0.5) == pytest.approx(5.0)  # one request in half a second: a pace all the same


POOLED = {"incumbent": [100.0, 101.0, 99.0], "cap_3_4": [98.0, 98.0, 98.0], "no_speculation": [80.0, 80.0]}


def test_a_round_that_costs_more_than_the_losers_shortfall_over_the_rest_is_left_out():
    # 7 servers x 30 s = 210 server-s against (2 % + 20 %) x 900 s = 198 server-s
    moved = {"s5": "cap_3_4", "s6": "no_speculation"}
    kept = estimate(winner="incumbent", moved=moved, pooled=POOLED, servers=7, round_s=30.0, rest_s=900.0)
    assert kept.cost_s == 210 and kept.gain_s == pytest.approx(198.0) and not kept.pays
    assert kept.shortfall == pytest.approx({"s5": 0.02, "s6": 0.2})
    assert "keeping s5, s6 on cap_3_4, no_speculation for the rest of the job" in kept.reason()
    assert relaunch_payoff.POLICY_PARAMETER in kept.reason()
    longer = estimate(winner="incumbent", moved=moved, pooled=POOLED, servers=7, round_s=30.0, rest_s=1100.0)
    assert longer.pays and longer.reason().endswith(": relaunching")


def test_a_loser_faster_than_the_winners_median_gains_nothing_by_moving():
    faster = estimate(winner="incumbent", moved={"s6": "fast"}, pooled={**POOLED, "fast": [120.0]}, servers=3,
                      round_s=1.0, rest_s=10_000.0)
    assert faster.gain_s == 0 and not faster.pays


@pytest.mark.parametrize("change, why", [
    ({"round_s": None}, "the round's length is not measured"),
    ({"rest_s": None}, "the job's size or the trial's pace is not known"),
    ({"moved": {"s6": "draft_minus_1"}}, "draft_minus_1 gave no steady window"),
    ({"winner": "draft_minus_1"}, "gave no steady window"),
])
def test_what_was_not_measured_relaunches_as_decided(change, why):
    fields = {"winner": "incumbent", "moved": {"s6": "cap_3_4"}, "pooled": POOLED, "servers": 7, "round_s": 30.0,
              "rest_s": 10.0, **change}
    unmeasured = estimate(**fields)
    assert unmeasured.pays and why in unmeasured.reason()


def test_a_winner_that_made_nothing_or_little_is_no_yardstick_only_when_it_made_nothing():
    nothing = estimate(winner="w", moved={"s": "l"}, pooled={"w": [0.0], "l": [1.0]}, servers=3, round_s=1.0,
                       rest_s=10.0)
    assert nothing.shortfall == {"s": None} and nothing.pays
    little = estimate(winner="w", moved={"s": "l"}, pooled={"w": [0.5], "l": [0.25]}, servers=3, round_s=2.0,
                      rest_s=10.0)
    assert little.shortfall == {"s": 0.5} and little.gain_s == 5.0 and not little.pays


def test_each_unmeasured_case_says_what_was_not_measured():
    fields = {"winner": "incumbent", "pooled": POOLED, "servers": 7, "round_s": 30.0, "rest_s": 10.0}
    assert estimate(**{**fields, "round_s": None}, moved={"s6": "cap_3_4"}).reason() == (
        "the first round launched no server, so the round's length is not measured: relaunching")
    assert estimate(**{**fields, "rest_s": None}, moved={"s6": "cap_3_4"}).reason() == (
        "the job's size or the trial's pace is not known: relaunching")
    assert estimate(**fields, moved={"s4": "draft_minus_1", "s5": "sglang_auto", "s6": "draft_minus_1"}).reason() == (
        "draft_minus_1, sglang_auto gave no steady window: relaunching")


def test_a_gain_that_only_equals_the_cost_keeps_the_losers():
    even = estimate(winner="w", moved={"s": "l"}, pooled={"w": [100.0], "l": [50.0]}, servers=1, round_s=10.0,
                    rest_s=20.0)
    assert even.gain_s == even.cost_s == 10.0 and not even.pays and "keeping s on l" in even.reason()


def test_no_server_moved_is_no_round():
    none = estimate(winner="incumbent", moved={}, pooled=POOLED, servers=7, round_s=30.0, rest_s=10.0)
    assert none.pays and none.reason() == "no server moves" and none.gain_s == 0


def test_the_record_holds_the_figures_and_the_verdict():
    record = estimate(winner="incumbent", moved={"s5": "cap_3_4"}, pooled=POOLED, servers=7, round_s=30.04,
                      rest_s=900.0).to_dict()
    assert record == {"moved": {"s5": "cap_3_4"}, "servers": 7, "round_s": 30.0, "rest_s": 900.0,
                      "cost_server_s": 210.3, "gain_server_s": 18.0, "shortfall": {"s5": 0.02}, "pays": False,
                      "reason": record["reason"]}
    assert record["reason"].startswith("relaunching would idle 7 server(s) for ~30 s")
    thirds = estimate(winner="w", moved={"s": "l"}, pooled={"w": [3.0], "l": [2.0]}, servers=1, round_s=1.0,
                      rest_s=1.0).to_dict()
    assert thirds["shortfall"] == {"s": 0.3333}
