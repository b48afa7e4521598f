"""bench/_common.py: the small mode every bench shares, its last line, and a smoke test for every bench."""

import argparse
from pathlib import Path

import pytest


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    made.add_argument("--prompts", type=int, default=2800)
    made.add_argument("--time-scale", type=float, default=10.0)
    return made


def test_smoke_stands_for_the_declared_values_and_leaves_the_others_at_their_defaults(bench_common):
    args = bench_common.parse_args(parser(), {"prompts": 140}, ["--smoke"])
    assert (args.prompts, args.time_scale, args.smoke) == (140, 10.0, True)


def test_without_smoke_every_argument_keeps_its_default(bench_common):
    args = bench_common.parse_args(parser(), {"prompts": 140}, [])
    assert (args.prompts, args.smoke) == (2800, False)


def test_an_argument_given_beside_smoke_wins(bench_common):
    assert bench_common.parse_args(parser(), {"prompts": 140}, ["--smoke", "--prompts", "700"]).prompts == 700
    assert bench_common.parse_args(parser(), {"prompts": 140}, ["--prompts", "700", "--smoke"]).prompts == 700


def test_a_smoke_value_for_an_argument_the_script_lacks_is_refused(bench_common):
    # a renamed argument must not leave the smoke run at its full size
    with pytest.raises(ValueError, match="prompt_count"):
        bench_common.parse_args(parser(), {"prompt_count": 140}, ["--smoke"])


def test_the_last_line_is_read_into_numbers_per_part(bench_common):
    output = "warming up\nnight 1: 100 generated\nnightly relaunched=1/0/0 generated=100/0/3 plan/hand=1.25\n"
    assert bench_common.read_last_line(output) == (
        "nightly", {"relaunched": [1, 0, 0], "generated": [100, 0, 3], "plan/hand": [1.25]})


def test_a_value_is_read_as_a_word_only_for_the_keys_the_bench_names(bench_common):
    line = "tuning_trial chosen=no_speculation gain_vs_incumbent=1.227 tie_kept_incumbent=yes"
    assert bench_common.read_last_line(line, ("chosen", "tie_kept_incumbent")) == (
        "tuning_trial", {"chosen": "no_speculation", "gain_vs_incumbent": [1.227], "tie_kept_incumbent": "yes"})
    with pytest.raises(ValueError):  # a word where a number belongs is still refused
        bench_common.read_last_line(line, ("chosen",))


@pytest.mark.parametrize("line", ["utilization fleetgen=0.988 seed_client", "utilization fleetgen=",
                                  "utilization fleetgen=fast", ""])
def test_a_last_line_that_is_not_key_equals_number_is_refused(bench_common, line):
    with pytest.raises(ValueError):
        bench_common.read_last_line(f"figures follow\n{line}")


def test_every_bench_script_has_its_smoke_test(bench_folder):
    scripts = sorted(path.stem for path in bench_folder.glob("*.py") if not path.name.startswith("_"))
    here = Path(__file__).resolve().parent
    untested = [name for name in scripts
                if not (here / f"test_{name}.py").is_file()
                or f'run_bench("{name}"' not in (here / f"test_{name}.py").read_text()]
    assert scripts and not untested, f"bench scripts without a smoke test in tests/bench/: {untested}"
