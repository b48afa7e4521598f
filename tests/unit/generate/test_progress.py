"""The running shard's counters and progress line (generate/progress.py)."""

import pytest

from fleetgen.generate.progress import Progress, format_duration


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_counters_add_up_and_remaining_leaves_out_earlier_tries_done_and_failed():
    progress = Progress(10, 3, clock=Clock())
    progress.add_completion(7, 100)
    progress.add_completion(5, 50)
    progress.add_failure()
    progress.add_failure()
    assert (progress.done, progress.failed, progress.skipped) == (2, 2, 3)
    assert (progress.prompt_tokens, progress.completion_tokens) == (12, 150)
    assert progress.remaining == 10 - 3 - 2 - 2


def test_remaining_never_goes_below_zero():
    progress = Progress(1, 1, clock=Clock())
    progress.add_failure()
    assert progress.remaining == 0


def test_seconds_count_from_the_start():
    clock = Clock(500.0)
    progress = Progress(1, 0, clock=clock)
    clock.now = 512.5
    assert progress.seconds == 12.5


def test_rates_are_tokens_per_second_over_windows_longer_than_a_second():
    clock = Clock()
    progress = Progress(100, 20, clock=clock)
    for _ in range(10):
        progress.add_completion(1, 400)  # 4,000 tokens in the first 10 s
    progress.add_failure()
    clock.now += 10
    line = progress.line({"a:1": 3, "b:1": 0}, {"b:1"})
    # 31 of 100 finished: 20 from earlier tries, 10 done, 1 failed; 69 left x 400 tokens at 400 tok/s
    assert line == ("31/100 done (31.0 %; 1 failed, 20 from earlier tries), 400 tok/s now, 400 tok/s overall, "
                    "ETA 1m09s (0.03M tokens to go); in flight: a:1=3 b:1=DOWN/0")
    progress.add_completion(1, 3000)  # the next 30 s are slower overall, faster than the mean in the window
    clock.now += 30
    line = progress.line({"a:1": 1}, set())
    assert "100 tok/s now, 175 tok/s overall" in line  # 3,000 / 30 s now; 7,000 / 40 s since the start
    # 68 left x (7,000 / 11) tokens each at 175 tok/s
    assert "ETA 4m07s (0.04M tokens to go)" in line and line.startswith("32/100 done (32.0 %; ")


def test_the_eta_is_unknown_until_the_first_completion():
    clock = Clock()
    progress = Progress(10, 4, clock=clock)
    progress.add_failure()
    assert progress.line({}, set()).endswith("0 tok/s now, 0 tok/s overall, ETA unknown until the first "
                                             "completions; in flight: ")
    clock.now += 5
    line = progress.line({"s:1": 2}, set())
    assert "0 tok/s now, 0 tok/s overall, ETA unknown" in line and line.startswith("5/10 done (50.0 %; 1 failed, 4 ")


def test_a_completion_without_tokens_gives_no_eta_rather_than_a_division_by_zero():
    clock = Clock()
    progress = Progress(10, 0, clock=clock)
    progress.add_completion(3, 0)
    clock.now += 2
    assert "ETA unknown" in progress.line({}, set())


def test_a_line_at_the_very_start_reports_zero_rates():
    progress = Progress(0, 0, clock=Clock())
    assert progress.line({}, set()).startswith("0/0 done (0.0 %; 0 failed, 0 from earlier tries), 0 tok/s now, ")


def test_large_rates_have_thousands_separators():
    clock = Clock()
    progress = Progress(10, 0, clock=clock)
    progress.add_completion(1, 2_500_000)
    clock.now += 2
    assert "1,250,000 tok/s now, 1,250,000 tok/s overall, ETA 18s (22.50M tokens to go)" in progress.line({}, set())


def test_the_first_window_counts_every_token_since_the_start():
    clock = Clock()
    progress = Progress(5, 0, clock=clock)
    progress.add_completion(1, 3)
    clock.now += 1
    assert "3 tok/s now, 3 tok/s overall" in progress.line({}, set())


def test_rates_over_windows_shorter_than_a_second_are_still_rates():
    clock = Clock()
    progress = Progress(5, 0, clock=clock)
    progress.add_completion(1, 100)
    clock.now += 0.5
    assert "200 tok/s now, 200 tok/s overall, ETA 2s (0.00M tokens to go)" in progress.line({}, set())


def test_a_rate_under_one_token_a_second_still_gives_an_eta():
    clock = Clock()
    progress = Progress(3, 0, clock=clock)
    progress.add_completion(1, 1)
    clock.now += 2
    assert "ETA 4s (0.00M tokens to go)" in progress.line({}, set())  # 2 prompts x 1 token at 0.5 tok/s


def test_tokens_to_go_are_counted_in_millions():
    clock = Clock()
    progress = Progress(12, 1, clock=clock)
    progress.add_completion(1, 5_000_501)
    clock.now += 100
    assert "(50.01M tokens to go)" in progress.line({}, set())  # 10 prompts left x 5,000,501 tokens


def test_a_shard_of_one_prompt_is_all_done_after_it():
    progress = Progress(1, 0, clock=Clock())
    progress.add_completion(1, 1)
    assert progress.line({}, set()).startswith("1/1 done (100.0 %; ")


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.4, "0s"), (59.4, "59s"), (59.6, "1m00s"), (60, "1m00s"),
                                           (61, "1m01s"), (3599, "59m59s"), (3600, "1h00m"), (3661, "1h01m"),
                                           (36_000 + 59 * 60 + 59, "10h59m")])
def test_durations_read_as_hours_minutes_or_seconds(seconds, text):
    assert format_duration(seconds) == text
