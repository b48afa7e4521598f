"""The end of the job apart from steady state (report/drain.py): each server's drain on its last stretch against
its steady rate and its generation, per GPU, and the fleet's totals, from metrics rows written by hand."""

from __future__ import annotations

import math

import pytest

from fleetgen.report.drain import NEVER_AT_BATCH, NO_GPUS, drain_lines, drain_report

# One server of cap 8 sampled every 10 s: idle, at its batch from t=0 (queue waiting) to t=30, then draining to
# empty at t=60. (t, running, queue, generation_tokens, requests)
STEADY_THEN_DRAINING = [(-10, 0, 0, 0, 0), (0, 8, 4, 0, 0), (10, 8, 4, 700, 8), (20, 8, 2, 1700, 18),
                        (30, 8, 0, 2700, 28), (40, 5, 0, 3000, 31), (50, 2, 0, 3300, 34), (60, 0, 0, 3600, 36),
                        (70, 0, 0, 3600, 36)]
# Its figures: the drain from t=30 (the last row at its batch) to t=60 (the first reading it empty), 900 tokens in
# 30 s; running 8, 5 and 2 for 10 s each; steady from t=10 (8 completions, one turnover of the cap, after t=0) to
# t=30, 2,000 tokens in 20 s; the generation from t=0 (the first row with requests) to t=60, 3,600 tokens.
EXPECTED = {"gpus": 1, "cap": 8, "start": 30.0, "end": 60.0, "drain_s": 30.0, "generation_s": 60.0,
            "running_mean": 5.0, "steady_s": 20.0, "gpu_seconds": 30.0, "generation_gpu_seconds": 60.0,
            "gpu_time_share": 0.5, "tokens": 900.0, "generation_tokens": 3600.0, "token_share": 0.25,
            "tokens_per_s_per_gpu": 30.0, "steady_tokens_per_s_per_gpu": 100.0, "rate_vs_steady": 0.3,
            "running_share": 0.625}


def rows(table, *, server: str = "a:1", cap: int = 8, shift: float = 0.0) -> list[dict]:
    return [{"t": float(t + shift), "server": server, "cap": cap, "running": running, "queue": queue,
             "generation_tokens": tokens, "requests": requests, "sent": running}
            for t, running, queue, tokens, requests in table]


def test_a_server_at_its_batch_then_draining_has_its_drain_against_its_steady_rate_and_its_generation():
    drain = drain_report(rows(STEADY_THEN_DRAINING), gpus_per_server={"a:1": 1})
    assert drain["per_server"] == {"a:1": EXPECTED} and drain["unmeasured"] == {}
    assert drain["fleet"] == {"servers": 1, "start": 30.0, "end": 60.0, "seconds": 30.0,
                              **{key: value for key, value in EXPECTED.items() if key not in (
                                  "gpus", "cap", "start", "end", "drain_s", "generation_s", "running_mean",
                                  "steady_s")}}


def test_two_shards_interleaved_rows_of_one_server_are_read_in_time_order_and_their_crossing_is_no_restart():
    # every 5 s, shard 0 at the tens and shard 1 between; at t=25 shard 1 read fewer tokens than shard 0 at t=20
    # (shard 0's answer came later): a fall by less than half, not a restart
    merged = [(0, 8, 4, 0, 0), (5, 8, 4, 300, 4), (10, 8, 4, 700, 8), (15, 8, 3, 1200, 13), (20, 8, 2, 1700, 18),
              (25, 8, 1, 1650, 17), (30, 8, 0, 2700, 28), (35, 7, 0, 2800, 29), (40, 6, 0, 3000, 31),
              (45, 4, 0, 3100, 32), (50, 3, 0, 3300, 34), (55, 2, 0, 3400, 35), (60, 0, 0, 3600, 36),
              (65, 0, 0, 3600, 36)]
    shard_0, shard_1 = rows(merged[0::2]), rows(merged[1::2])
    drain = drain_report(shard_0 + shard_1, gpus_per_server={"a:1": 1})
    # running 8, 7, 6, 4, 3, 2 for 5 s each: 30 x 5 / 30 s
    assert drain["per_server"]["a:1"] == EXPECTED


def test_each_reading_of_the_running_requests_weighs_the_seconds_until_the_next_row():
    # two shards 3 s apart: 8 running for 3 s, then 2 for 27 s, where a mean of the rows would say 5
    uneven = rows([(0, 8, 1, 0, 0), (10, 8, 0, 900, 9)]) + rows([(13, 2, 0, 1000, 10), (40, 0, 0, 1200, 12)])
    server = drain_report(uneven, gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["drain_s"], server["running_mean"], server["running_share"]) == (30.0, 2.6, 0.325)


@pytest.mark.parametrize("first_cap, first_tokens", [(8, 5000), (4, 0)], ids=["restart", "relaunch"])
def test_only_the_last_stretch_after_a_restart_or_a_relaunch_counts(first_cap, first_tokens):
    # at its batch from t=0 to t=20, then its counters start again (a restart) or its cap changes (a relaunch on
    # another configuration, counting on from 0); the stretch of STEADY_THEN_DRAINING 100 s later is the last
    first = rows([(0, first_cap, 3, 0, 0), (10, first_cap, 3, first_tokens / 2, 40), (20, first_cap, 3, first_tokens,
                                                                                          80)], cap=first_cap)
    drain = drain_report(first + rows(STEADY_THEN_DRAINING, shift=100.0), gpus_per_server={"a:1": 1})
    server = drain["per_server"]["a:1"]
    # the drain and steady part are the last stretch's; the generation runs from t=0 and holds both stretches' tokens
    assert (server["start"], server["end"], server["steady_tokens_per_s_per_gpu"], server["cap"]) == (
        130.0, 160.0, 100.0, 8)
    assert (server["generation_s"], server["generation_tokens"]) == (160.0, first_tokens + 3600.0)
    assert server["gpu_time_share"] == round(30 / 160, 4)
    assert server["token_share"] == round(900 / (first_tokens + 3600), 4)


def test_a_server_never_at_its_batch_on_its_last_stretch_is_said_so_without_figures():
    at_batch_then_restarted = rows([(0, 8, 2, 0, 0), (10, 8, 2, 4000, 40)], server="b:1") + rows(
        [(20, 6, 0, 0, 0), (30, 3, 0, 500, 5), (40, 0, 0, 900, 9)], server="b:1")  # 6 of 8: under 90 %, none queued
    drain = drain_report(at_batch_then_restarted, gpus_per_server={"b:1": 1})
    assert drain == {"per_server": {}, "unmeasured": {"b:1": NEVER_AT_BATCH}, "fleet": None}
    assert drain_lines(drain) == ["## End of the job", "",
                                  "No drain measured: no server was at its batch on its last stretch.", "",
                                  f"- **b:1**: {NEVER_AT_BATCH}.", ""]


def test_a_server_without_a_gpu_count_is_not_measured_and_the_others_are():
    both = rows(STEADY_THEN_DRAINING) + rows(STEADY_THEN_DRAINING, server="c:1")
    drain = drain_report(both, gpus_per_server={"a:1": 1})
    assert list(drain["per_server"]) == ["a:1"] and drain["unmeasured"] == {"c:1": NO_GPUS}
    assert drain["fleet"]["servers"] == 1


def test_rows_without_both_counters_are_skipped_and_none_at_all_is_no_drain():
    usable = rows(STEADY_THEN_DRAINING)
    # at their batch after t=30: were they read, the drain would start later, with no tokens to count
    without = [{**usable[4], "t": 55.0, "generation_tokens": math.nan},
               {**usable[4], "t": 56.0, "requests": None},
               {key: value for key, value in usable[4].items() if key != "requests"} | {"t": 57.0}]
    assert drain_report(usable + without, gpus_per_server={"a:1": 1})["per_server"]["a:1"] == EXPECTED
    assert drain_report(without, gpus_per_server={"a:1": 1}) is None
    assert drain_report([], gpus_per_server={}) is None


def test_a_server_on_four_gpus_has_its_rates_per_gpu_and_its_running_requests_whole():
    server = drain_report(rows(STEADY_THEN_DRAINING), gpus_per_server={"a:1": 4})["per_server"]["a:1"]
    assert (server["tokens_per_s_per_gpu"], server["steady_tokens_per_s_per_gpu"]) == (7.5, 25.0)
    assert (server["gpu_seconds"], server["generation_gpu_seconds"]) == (120.0, 240.0)
    assert (server["running_mean"], server["running_share"], server["rate_vs_steady"]) == (5.0, 0.625, 0.3)


def test_without_a_row_that_reads_the_server_empty_the_drain_ends_at_its_last_row():
    cut = rows(STEADY_THEN_DRAINING[:7])  # the shards stopped sampling at t=50, two requests still running
    server = drain_report(cut, gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["end"], server["drain_s"], server["tokens"], server["running_mean"]) == (50.0, 20.0, 600.0, 6.5)


def test_a_warm_up_that_outlasts_the_batch_leaves_the_steady_rate_unmeasured():
    # 4 completions at the last row at its batch, fewer than the cap of 8: still warming up
    short = rows([(0, 8, 1, 0, 0), (10, 8, 0, 300, 4), (20, 0, 0, 900, 12)])
    server = drain_report(short, gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["steady_s"], server["steady_tokens_per_s_per_gpu"], server["rate_vs_steady"]) == (None, None, None)
    assert server["tokens_per_s_per_gpu"] == 60.0


def two_servers() -> dict:
    # b:1 on 2 GPUs, cap 4, from t=-15: at its batch to t=25 (steady from t=5, 8 completions in), empty at t=65;
    # it leaves its batch before a:1 and empties after it
    b = rows([(0, 4, 2, 0, 0), (20, 4, 1, 2000, 8), (40, 4, 0, 4000, 16), (60, 2, 0, 4400, 18),
              (80, 0, 0, 4800, 20)], server="b:1", cap=4, shift=-15.0)
    return drain_report(rows(STEADY_THEN_DRAINING) + b, gpus_per_server={"a:1": 1, "b:1": 2})


def test_the_fleet_sums_the_servers_gpu_seconds_and_tokens():
    drain = two_servers()
    b = drain["per_server"]["b:1"]
    # 800 tokens over 40 s on 2 GPUs; 2,000 over 20 s on 2 GPUs; running 4 then 2 for 20 s each
    assert (b["tokens_per_s_per_gpu"], b["steady_tokens_per_s_per_gpu"], b["running_mean"], b["token_share"]) == (
        10.0, 50.0, 3.0, round(800 / 4800, 4))
    fleet = drain["fleet"]
    assert (fleet["servers"], fleet["start"], fleet["end"], fleet["seconds"]) == (2, 25.0, 65.0, 40.0)
    # a: 30 s of drain and 60 s of generation on 1 GPU; b: 40 s and 80 s on 2
    assert (fleet["gpu_seconds"], fleet["generation_gpu_seconds"], fleet["gpu_time_share"]) == (110.0, 220.0, 0.5)
    assert (fleet["tokens"], fleet["generation_tokens"], fleet["token_share"]) == (1700.0, 8400.0,
                                                                                   round(1700 / 8400, 4))
    assert fleet["tokens_per_s_per_gpu"] == round(1700 / 110, 2)
    assert fleet["steady_tokens_per_s_per_gpu"] == round((2000 + 2000) / (20 * 1 + 20 * 2), 2)
    assert fleet["rate_vs_steady"] == round((1700 / 110) / (4000 / 60), 4)
    # running x seconds over cap x seconds: (5 x 30 + 3 x 40) / (8 x 30 + 4 x 40)
    assert fleet["running_share"] == 0.675


def test_the_section_says_the_drain_its_share_its_rate_against_steady_its_running_requests_and_why():
    lines = drain_lines(two_servers())
    assert lines == [
        "## End of the job", "",
        "From the first server leaving its batch to the last one empty: 40 s. The drain took 50.0% of the servers' "
        "GPU time generating and made 20.2% of their output tokens, at 15 output tokens/s per GPU against 67 in "
        "steady state (0.23x), with 67.5% of the cap running on average.", "",
        "Speculative decoding gains most at small batch (SGLang PR #34307: MTP on Qwen3.6-27B-FP8 on one H200, "
        "2.76x at batch 1, about 1.08x at batch 64): the configuration chosen in steady state may not be the "
        "fastest here.", "",
        "| server | GPUs | drain s | share of its generation | output tokens | tokens/s per GPU: drain / steady | "
        "mean running / cap |", "|---|---|---|---|---|---|---|",
        "| a:1 | 1 | 30.0 | 50.0% | 900 | 30 / 100 | 5.0 / 8 (62.5%) |",
        "| b:1 | 2 | 40.0 | 50.0% | 800 | 10 / 50 | 3.0 / 4 (75.0%) |", ""]
    assert drain_lines(None) == []


def test_a_measured_server_without_a_steady_rate_shows_a_dash_and_an_unmeasured_one_is_listed_under():
    short = rows([(0, 8, 1, 0, 0), (10, 8, 0, 300, 4), (20, 0, 0, 900, 12)])
    never = rows([(0, 2, 0, 0, 0), (10, 0, 0, 100, 1)], server="b:1")
    lines = drain_lines(drain_report(short + never, gpus_per_server={"a:1": 1, "b:1": 1}))
    assert "| a:1 | 1 | 10.0 | 50.0% | 600 | 60 / - | 8.0 / 8 (100.0%) |" in lines
    assert "steady state" not in lines[2] and lines[2].endswith("at 60 output tokens/s per GPU, with 100.0% of the "
                                                                 "cap running on average.")
    assert lines[-2:] == [f"- **b:1**: {NEVER_AT_BATCH}.", ""]


def test_the_figures_keep_their_declared_precision_and_a_kept_servers_counters_count_from_where_they_stood():
    # STEADY_THEN_DRAINING on a clock running 1.0152427x and counters 1.00041x, from 10,000 tokens already counted
    # (a server kept from an earlier run): seconds to 3 decimals, tokens to 1, rates to 2
    k, m = 1.0152427, 1.00041
    table = [(t * k, running, queue, 10_000 + tokens * m, requests)
             for t, running, queue, tokens, requests in STEADY_THEN_DRAINING]
    drain = drain_report(rows(table), gpus_per_server={"a:1": 1})
    server = drain["per_server"]["a:1"]
    assert (server["drain_s"], server["generation_s"], server["steady_s"]) == (30.457, 60.915, 20.305)
    assert (server["gpu_seconds"], server["generation_gpu_seconds"]) == (30.457, 60.915)
    assert (server["tokens"], server["generation_tokens"]) == (900.4, 3601.5)
    assert server["tokens_per_s_per_gpu"] == round(900 * m / (30 * k), 2) == 29.56
    assert drain["fleet"]["seconds"] == 30.457


def test_a_single_request_running_or_waiting_keeps_the_server_busy():
    # one request queued before any runs starts the generation; one still running at t=50 keeps the drain open
    table = [(-10, 0, 1, 0, 0), (0, 8, 4, 0, 0), (10, 8, 4, 700, 8), (20, 8, 2, 1700, 18), (30, 8, 0, 2700, 28),
             (40, 5, 0, 3000, 31), (50, 1, 0, 3500, 35), (60, 0, 0, 3600, 36), (70, 0, 0, 3600, 36)]
    server = drain_report(rows(table), gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["generation_s"], server["end"], server["drain_s"]) == (70.0, 60.0, 30.0)


def test_a_server_without_a_steady_rate_adds_no_steady_tokens_to_the_fleets():
    short = rows([(0, 8, 1, 0, 0), (10, 8, 0, 300, 4), (20, 0, 0, 900, 12)], server="b:1")
    drain = drain_report(rows(STEADY_THEN_DRAINING) + short, gpus_per_server={"a:1": 1, "b:1": 1})
    assert drain["per_server"]["b:1"]["steady_s"] is None
    assert drain["fleet"]["steady_tokens_per_s_per_gpu"] == 100.0  # a:1's 2,000 tokens in 20 s alone


def test_a_drain_and_a_steady_part_under_a_second_still_have_their_rates():
    # STEADY_THEN_DRAINING sampled every 0.3 s: the drain takes 0.9 s, the steady part 0.6 s
    fast = [(t * 0.03, running, queue, tokens, requests) for t, running, queue, tokens, requests in STEADY_THEN_DRAINING]
    server = drain_report(rows(fast), gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["drain_s"], server["steady_s"]) == (0.9, 0.6)
    assert (server["tokens_per_s_per_gpu"], server["steady_tokens_per_s_per_gpu"], server["running_mean"]) == (
        1000.0, pytest.approx(3333.33), 5.0)


def test_a_server_still_at_its_batch_and_warming_up_at_its_last_row_has_a_drain_of_nothing_and_no_rates():
    # the shards stopped sampling while it ran at its cap with 4 of 8 completions in: no drain, no steady part
    busy = rows([(0, 8, 1, 0, 0), (10, 8, 1, 300, 4)])
    drain = drain_report(busy, gpus_per_server={"a:1": 1})
    server = drain["per_server"]["a:1"]
    assert (server["drain_s"], server["steady_s"], server["running_mean"]) == (0.0, None, None)
    assert (server["tokens_per_s_per_gpu"], server["steady_tokens_per_s_per_gpu"], server["running_share"]) == (
        None, None, None)
    assert any(line.startswith("| a:1 | 1 | 0.0 | 0.0% |") and line.endswith(" 8 (-) |") for line in drain_lines(drain))


def test_the_mean_of_the_running_requests_keeps_two_decimals():
    # 8 running for 1 s, then 3 for 29 s: 95 request-seconds over the drain's 30 s
    server = drain_report(rows([(0, 8, 1, 0, 0), (10, 8, 0, 900, 9), (11, 3, 0, 1000, 10), (40, 0, 0, 1200, 12)]),
                          gpus_per_server={"a:1": 1})["per_server"]["a:1"]
    assert (server["drain_s"], server["running_mean"]) == (30.0, 3.17)
