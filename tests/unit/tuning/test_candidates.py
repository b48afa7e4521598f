"""The tuning trial's candidates (named edits of the fleet's extra args) and the split of tonight's fleet."""

import pytest

from fleetgen.errors import ConfigError
from fleetgen.tuning import candidates as candidates_module
from fleetgen.nodes.fleet import RESERVED_FLAGS
from fleetgen.tuning.candidates import (CAP_1_2, CAP_3_4, DEFAULT_ORDER, DRAFT_MINUS_1, INCUMBENT, LOSSLESS_FLAGS,
                                        NO_SPECULATION, NUMERICS_FLAGS, SGLANG_AUTO, Candidate, TrialSplit, candidate_set,
                                        choose_split, default_candidates, edit_args, flags_of, user_candidates)

SEED_ARGS = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4", "--reasoning-parser", "qwen3")
SERVERS = [f"n0:{30000 + i}" for i in range(7)]


# --- editing the fleet's extra args -------------------------------------------------------------------------------

def test_a_change_replaces_the_flag_where_it_stands_and_a_new_flag_goes_last():
    assert edit_args(SEED_ARGS, {"--speculative-num-steps": 2, "--page-size": 64}) == (
        "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--reasoning-parser", "qwen3", "--page-size", "64")


def test_none_removes_a_flag_with_its_value_and_a_switch_alone():
    args = ("--disable-radix-cache", "--chunked-prefill-size", "-1", "--context-length=8192", "--enable-metrics")
    assert edit_args(args, {"--chunked-prefill-size": None, "--disable-radix-cache": None}) == (
        "--context-length=8192", "--enable-metrics")
    assert edit_args(args, {"--context-length": None}) == (
        "--disable-radix-cache", "--chunked-prefill-size", "-1", "--enable-metrics")
    # a value of -1 is the flag's value, not a flag of its own
    assert flags_of(args) == {"--disable-radix-cache": True, "--chunked-prefill-size": "-1",
                              "--context-length": "8192", "--enable-metrics": True}


def test_a_repeated_flag_is_set_once_and_true_is_a_bare_switch():
    assert edit_args(("--page-size", "1", "--page-size", "16"), {"--page-size": 64}) == ("--page-size", "64")
    assert edit_args((), {"--disable-overlap-schedule": True, "--mem-fraction-static": 0.9}) == (
        "--disable-overlap-schedule", "--mem-fraction-static", "0.9")


def test_a_word_that_is_no_flags_value_stands_alone_where_it_is():
    args = ("stray", "--context-length=8192", "word", "--page-size", "1")
    assert flags_of(args) == {"--context-length": "8192", "--page-size": "1"}
    assert edit_args(args, {"--page-size": 2}) == ("stray", "--context-length=8192", "word", "--page-size", "2")
    # the word after a --flag=value is not that flag's: it stays when the flag is set anew
    assert edit_args(args, {"--context-length": 4096}) == ("stray", "--context-length", "4096", "word",
                                                           "--page-size", "1")


def test_a_flags_value_may_hold_an_equals_sign():
    args = ("--json-model-override-args=rope=yarn",)
    assert flags_of(args) == {"--json-model-override-args": "rope=yarn"}
    assert edit_args(args, {"--json-model-override-args": None}) == ()


# --- the default candidates ---------------------------------------------------------------------------------------

def test_speculation_off_removes_every_speculative_flag_and_nothing_else():
    candidates = {c.name: c for c in default_candidates(SEED_ARGS, (3, 1, 4), eagle_family=True)}
    assert list(candidates) == list(DEFAULT_ORDER)
    assert candidates[NO_SPECULATION].launch_args(SEED_ARGS) == ("--reasoning-parser", "qwen3")


def test_one_draft_step_fewer_keeps_top_k_and_sglangs_draft_rule():
    candidates = {c.name: c for c in default_candidates(SEED_ARGS, (3, 1, 4), eagle_family=True)}
    assert flags_of(candidates[DRAFT_MINUS_1].launch_args(SEED_ARGS)) == {
        "--speculative-algorithm": "NEXTN", "--speculative-num-steps": "2", "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "3", "--reasoning-parser": "qwen3"}
    # SGLang chose the depth itself (only the algorithm given): the candidate spells the shallower one out
    wider = {c.name: c for c in default_candidates(("--speculative-algorithm", "EAGLE"), (5, 4, 8),
                                                   eagle_family=True)}
    assert wider[DRAFT_MINUS_1].flags == {"--speculative-num-steps": 4, "--speculative-eagle-topk": 4,
                                          "--speculative-num-draft-tokens": 7}
    # top-k 2 is a tree too: one draft token fewer, never under 2
    for speculative, draft in (((3, 2, 6), 5), ((2, 4, 3), 2)):
        tree = {c.name: c for c in default_candidates(("--speculative-algorithm", "EAGLE"), speculative,
                                                      eagle_family=True)}
        assert tree[DRAFT_MINUS_1].flags["--speculative-num-draft-tokens"] == draft, speculative


@pytest.mark.parametrize("args, speculative, eagle, expected", [
    ((), None, False, [CAP_3_4, CAP_1_2, SGLANG_AUTO]),
    (("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "1"), (1, 1, 2), True,
     [NO_SPECULATION, CAP_3_4, CAP_1_2, SGLANG_AUTO]),
    (("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"), (1, 1, 8), False,
     [NO_SPECULATION, CAP_3_4, CAP_1_2, SGLANG_AUTO]),
    (("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2"), (2, 1, 3), True,
     [NO_SPECULATION, DRAFT_MINUS_1, CAP_3_4, CAP_1_2, SGLANG_AUTO]),
])
def test_a_candidate_is_offered_only_where_it_applies(args, speculative, eagle, expected):
    assert [c.name for c in default_candidates(args, speculative, eagle_family=eagle)] == expected


def test_the_default_candidates_never_change_numerics():
    for candidate in default_candidates(SEED_ARGS + ("--kv-cache-dtype", "fp8_e4m3"), (3, 1, 4), eagle_family=True):
        assert set(candidate.flags) <= LOSSLESS_FLAGS and not candidate.changes_numerics, candidate
        kept = flags_of(candidate.launch_args(SEED_ARGS + ("--kv-cache-dtype", "fp8_e4m3")))
        assert kept["--kv-cache-dtype"] == "fp8_e4m3"  # the user's own numerics stay as they are


def test_a_default_candidate_outside_the_lossless_flags_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(candidates_module, "LOSSLESS_FLAGS", frozenset())  # as if a default were edited to one
    with pytest.raises(ConfigError) as caught:
        default_candidates(SEED_ARGS, (3, 1, 4), eagle_family=True)
    assert caught.value.message.startswith(f"default candidate {NO_SPECULATION} changes {{'--speculative-algorithm'")
    assert caught.value.message.endswith("outside the lossless flags")
    assert caught.value.hint == "list a candidate that changes numerics in tuning_candidates"


def test_a_candidate_describes_its_change_in_words():
    assert Candidate(INCUMBENT).describe() == "the fleet file's own server.extra_args"
    edits = Candidate("x", (("--speculative-num-steps", None), ("--enable-mixed-chunk", True), ("--page-size", 64)))
    assert edits.describe() == "--speculative-num-steps removed, --enable-mixed-chunk, --page-size 64"
    numerics = Candidate("y", (("--kv-cache-dtype", "fp8_e4m3"),))
    assert numerics.describe() == "--kv-cache-dtype fp8_e4m3 (changes numerics)"
    assert Candidate(CAP_3_4, cap_share=0.75).describe() == "the request cap at 0.75 of what memory holds"
    assert Candidate(SGLANG_AUTO, mode="sglang_defaults").describe() == (
        "the fleet file's own server.extra_args sized by SGLang itself (no --mem-fraction-static or "
        "--max-running-requests of the tuner's)")


def test_sglang_own_sizing_is_the_fleets_args_unchanged_in_the_sglang_defaults_mode():
    [auto] = [c for c in default_candidates(SEED_ARGS, (3, 1, 4), eagle_family=True) if c.name == SGLANG_AUTO]
    assert (auto.mode, auto.changes, auto.cap_share) == ("sglang_defaults", (), None)
    assert auto.launch_args(SEED_ARGS) == SEED_ARGS and auto.to_dict()["mode"] == "sglang_defaults"
    with pytest.raises(ConfigError, match=r"candidate odd: mode must be one of \('tuned', 'sglang_defaults'\), "
                                          r"got 'fastest'"):
        Candidate("odd", mode="fastest")


def test_the_caps_scale_the_memory_maximum():
    caps = {c.name: c for c in default_candidates((), None, eagle_family=False)}
    assert (caps[CAP_3_4].cap_share, caps[CAP_1_2].cap_share) == (0.75, 0.5)
    assert caps[CAP_1_2].launch_args(SEED_ARGS) == SEED_ARGS  # the planner lowers the cap, not the args


# --- the user's candidates ----------------------------------------------------------------------------------------

def test_the_users_candidates_come_after_the_incumbent_and_before_the_defaults():
    listed = user_candidates([{"name": "bf16_state", "flags": {"--mamba-ssm-dtype": "bfloat16"}},
                              {"name": "big_chunks", "flags": {"--chunked-prefill-size": 16384,
                                                               "--speculative-num-steps": None}}])
    assert [c.changes_numerics for c in listed] == [True, False] and all(c.listed for c in listed)
    assert listed[1].launch_args(SEED_ARGS) == (
        "--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--reasoning-parser", "qwen3", "--chunked-prefill-size", "16384")
    assert "changes numerics" in listed[0].describe()
    order = [c.name for c in candidate_set(default_candidates(SEED_ARGS, (3, 1, 4), eagle_family=True), listed)]
    assert order == [INCUMBENT, "bf16_state", "big_chunks", *DEFAULT_ORDER]


@pytest.mark.parametrize("entries, message, got", [
    ({"name": "x"}, r"tuning_candidates must be a list", {"name": "x"}),
    (["x"], r"tuning_candidates\[0\] must be an object with exactly the keys", "x"),
    ([{"name": "a", "flags": {"--page-size": 1}, "extra": 1}], r"\[0\] must be an object with exactly",
     {"name": "a", "flags": {"--page-size": 1}, "extra": 1}),
    ([{"name": "Fast", "flags": {"--page-size": 1}}], r"\[0\] name must be 1-40 lower-case", "Fast"),
    ([{"name": "a", "flags": {"--page-size": 1}}, {"name": "a", "flags": {"--page-size": 2}}],
     r"\[1\] name a is taken", "a"),
    ([{"name": "cap_1_2", "flags": {"--page-size": 1}}], r"\[0\] name cap_1_2 is taken", "cap_1_2"),
    ([{"name": "incumbent", "flags": {"--page-size": 1}}], r"\[0\] name incumbent is taken", "incumbent"),
    ([{"name": "sglang_auto", "flags": {"--page-size": 1}}], r"\[0\] name sglang_auto is taken", "sglang_auto"),
    ([{"name": "a", "flags": {}}], r"\[0\] \(a\) flags must be a non-empty object", {}),
    ([{"name": "a", "flags": {"page-size": 1}}], r"\[0\] \(a\) a flag must be a long SGLang flag", "page-size"),
    ([{"name": "a", "flags": {"--port": 1}}], r"\[0\] \(a\) sets --port, which the launch decides itself",
     "--port"),
    ([{"name": "a", "flags": {"--config": "x.yaml"}}], r"sets --config", "--config"),
    ([{"name": "a", "flags": {"--page-size": False}}],
     r"\[0\] \(a\) --page-size must be a string, a number, true \(a bare switch\) or null \(removed\)", False),
    ([{"name": "a", "flags": {"--page-size": "--x"}}], r"--page-size must be a string", "--x"),
    ([{"name": "a", "flags": {"--page-size": float("inf")}}], r"--page-size must be a string", float("inf")),
    ([{"name": "a", "flags": {"--page-size": [1]}}], r"--page-size must be a string", [1]),
])
def test_each_bad_entry_is_refused_naming_the_parameter_and_the_entry(entries, message, got):
    with pytest.raises(ConfigError, match=message) as caught:
        user_candidates(entries, reserved=RESERVED_FLAGS)
    assert "tuning_candidates" in caught.value.message and "tuning_candidates" in caught.value.hint
    assert caught.value.message.endswith(f"got {got!r}")


def test_a_refusal_shows_the_shape_a_candidate_takes():
    with pytest.raises(ConfigError) as caught:
        user_candidates([{"name": "a"}])
    assert caught.value.hint.endswith('a list of {"name": "...", "flags": {"--flag": value, "--other": null}} '
                                      "(null removes a flag)")


def test_numerics_flags_are_the_ones_the_issue_names():
    assert NUMERICS_FLAGS == {"--mamba-ssm-dtype", "--kv-cache-dtype", "--quantization"}
    assert not NUMERICS_FLAGS & LOSSLESS_FLAGS


# --- the split ----------------------------------------------------------------------------------------------------

NAMES = [INCUMBENT, "mine", *DEFAULT_ORDER]


@pytest.mark.parametrize("count", [1, 2])
def test_fewer_than_three_servers_run_no_trial_and_say_so(count):
    split = choose_split(SERVERS[:count], NAMES, last_winner=None, tried=set())
    assert not split.trial and set(split.assignment.values()) == {INCUMBENT}
    assert (split.incumbent, split.challengers) == (INCUMBENT, ())
    assert split.notes == (f"no tuning trial: {count} server(s), and a trial needs at least 3 (the incumbent on "
                           "most, each challenger on one)",)


@pytest.mark.parametrize("count, challengers", [(3, 1), (4, 1), (5, 2), (7, 3)])
def test_the_incumbent_keeps_most_servers_and_each_challenger_gets_one(count, challengers):
    split = choose_split(SERVERS[:count], NAMES, last_winner=None, tried=set())
    assert split.challengers == tuple(NAMES[1:1 + challengers])
    assert list(split.assignment) == SERVERS[:count]
    on_incumbent = [s for s, name in split.assignment.items() if name == INCUMBENT]
    assert len(on_incumbent) == count - challengers > challengers
    # the challengers take the last servers, one each, in priority order
    assert [split.assignment[s] for s in SERVERS[count - challengers:count]] == list(split.challengers)


def test_the_trial_note_says_who_runs_where_and_what_waits_for_another_night():
    split = choose_split(SERVERS, NAMES, last_winner=None, tried=set())
    assert split.notes == ("tuning trial: incumbent on 4 server(s), mine on n0:30004, no_speculation on n0:30005, "
                           "draft_minus_1 on n0:30006; not tried tonight: cap_3_4, cap_1_2, sglang_auto",)
    everything = choose_split(SERVERS[:5], [INCUMBENT, "mine", CAP_1_2], last_winner=INCUMBENT, tried=set())
    assert everything.notes == ("tuning trial: incumbent on 3 server(s), mine on n0:30003, cap_1_2 on n0:30004",)


def test_the_next_night_starts_from_the_winner_and_spends_one_server_on_the_next_untried():
    split = choose_split(SERVERS, NAMES, last_winner=NO_SPECULATION, tried={INCUMBENT, "mine", NO_SPECULATION})
    assert split.incumbent == NO_SPECULATION and split.challengers == (DRAFT_MINUS_1,)
    assert split.notes[0] == ("incumbent no_speculation: the winner of the last trial for this fleet, model and "
                              "workload")
    assert list(split.assignment.values()) == [NO_SPECULATION] * 6 + [DRAFT_MINUS_1]


def test_with_everything_tried_the_winner_runs_everywhere_without_a_trial():
    split = choose_split(SERVERS, NAMES, last_winner="mine", tried=set(NAMES))
    assert not split.trial and set(split.assignment.values()) == {"mine"}
    assert (split.incumbent, split.challengers) == ("mine", ())
    assert split.notes[-1] == "no tuning trial: every candidate was tried before for this fleet, model and workload"


def test_a_winner_that_is_no_candidate_tonight_leaves_the_fleets_own_configuration():
    split = choose_split(SERVERS[:3], [INCUMBENT, CAP_1_2], last_winner="gone", tried={INCUMBENT, "gone"})
    assert split.incumbent == INCUMBENT and split.challengers == (CAP_1_2,)
    assert any("gone is not a candidate tonight" in note for note in split.notes)


def test_only_the_incumbent_means_no_trial():
    split = choose_split(SERVERS[:5], [INCUMBENT], last_winner=None, tried=set())
    assert not split.trial and (split.incumbent, split.challengers) == (INCUMBENT, ())
    assert split.notes == ("no tuning trial: no candidate besides the incumbent applies to this fleet",)


def test_the_split_round_trips_through_a_dict():
    split = choose_split(SERVERS[:5], NAMES, last_winner=None, tried=set())
    assert TrialSplit.from_dict(split.to_dict()) == split
    bare = TrialSplit.from_dict({"incumbent": INCUMBENT, "assignment": {"n0:30000": INCUMBENT}})
    assert (bare.challengers, bare.notes, bare.trial) == ((), (), False)
    assert Candidate("x", (("--a", None),)).to_dict() == {"name": "x", "flags": {"--a": None}, "cap_share": None,
                                                          "listed": False, "mode": None}
