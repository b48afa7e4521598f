"""report.md from report.json: every section's lines, numbers formatted for people, edge values shown."""

from __future__ import annotations

import copy

import pytest

from fleetgen.report.markdown import _number, _table, render_markdown


def base_report(**changes) -> dict:
    """The smallest report.json render_markdown reads: one server, nothing optional."""
    report = {
        "run_id": "night7", "generated_at": "2026-11-30T03:00:00+00:00",
        "throughput": {"tokens_per_s": 12345.678, "tokens_per_s_generation": 12000.04},
        "timing": {"basis": "first_start_to_last_finish", "generation_seconds": 600.0, "wall_seconds": None},
        "totals": {"completions": 1500, "prompt_tokens": 405000, "completion_tokens": 7407407},
        "errors": {"prompts": 2},
        "reuse": {"generated": 1400, "reused": 100, "from_runs": {}},
        "servers": {"kept": 1, "relaunched": 2},
        "per_server": {"n1:30000": {"gpus": [0, 1], "completions": 1500, "completion_tokens": 7407407,
                                    "tokens_per_s": 12345.68, "tokens_per_s_active": None, "mean_latency_s": 2.5,
                                    "p95_latency_s": 4.25, "length_share": 0.01234}},
        "per_gpu": {},
        "completion_tokens": {"mean": 493.8, "min": 100.0, "p50": 480.0, "p90": 900.0, "p99": 990.0, "max": 1000.0},
        "finish_reasons": {"stop": 1499, "length": 1},
        "tuning": [], "validation": None, "comparison": None, "plots": {},
    }
    for key, value in changes.items():
        report[key] = value
    return report


def lines_of(report: dict) -> list[str]:
    return render_markdown(report).split("\n")


def test_numbers_for_people():
    assert [_number(None), _number(True), _number(False), _number(0), _number(1234567), _number(-5)] == [
        "-", "yes", "no", "0", "1,234,567", "-5"]
    assert [_number(1234.5678), _number(0.0), _number(2.25, 0), _number(0.12345, 2), _number("x")] == [
        "1,234.6", "0.0", "2", "0.12", "x"]


def test_a_table_formats_cells_that_are_not_text():
    assert _table(["a", "b", "c"], [["1,0", 2, None], ["x", 2.5, False]]) == [
        "| a | b | c |", "|---|---|---|", "| 1,0 | 2 | - |", "| x | 2.5 | no |", ""]
    assert _table(["a"], []) == ["| a |", "|---|", ""]


def test_the_headline_says_the_verdict_throughput_tokens_and_servers():
    lines = lines_of(base_report())
    assert lines[:12] == [
        "# Generation run night7", "",
        "Generated 2026-11-30T03:00:00+00:00. Validation: **not run**.", "",
        "- Throughput: **12,345.7 completion tokens/s** (basis: first_start_to_last_finish; over the generation "
        "span 12,000.0 tokens/s)",
        "- Completions: 1,500; permanent failures: 2",
        "- Tokens: 405,000 prompt, 7,407,407 completion",
        "- Completions generated tonight: 1,400; reused unchanged from earlier runs: 100",
        "- Servers: 1 kept running (already on tonight's plan), 2 (re)launched",
        "- Generation span: 600.0 s (first request start to last finish)", "",
        "## Per server"]
    assert "Simulated" not in "\n".join(lines)


@pytest.mark.parametrize("validation, verdict", [
    ({"success": True, "expectations": []}, "passed"), ({"success": False, "expectations": []}, "FAILED"),
    ({"expectations": []}, "FAILED")])
def test_the_validation_verdict(validation, verdict):
    assert f"Validation: **{verdict}**." in render_markdown(base_report(validation=validation))


def test_a_simulated_fleet_and_a_given_wall_time_are_said_in_the_headline():
    report = base_report(simulated=True)
    report["timing"]["wall_seconds"] = 720.5
    lines = lines_of(report)
    assert lines[4].startswith("> **Simulated fleet**: the servers reported the simulator's capacity model")
    assert lines[5] == ""
    assert "- Generation span: 600.0 s (first request start to last finish); wall time given: 720.5 s" in lines


def test_reuse_says_where_from_what_was_generated_again_passed_over_and_what_changed():
    reuse = {"generated": 10, "reused": 5, "from_runs": {"night5": 3, "night6": 2}, "source_runs": ["night5", "n6"],
             "regenerated": {"unreadable": 4, "torn": 1}, "passed_over": [{"run": "night4", "reason": "torn index"}],
             "changed": {"run": "night3", "parts": []}}
    lines = lines_of(base_report(reuse=reuse))
    start = lines.index("- Completions generated tonight: 10; reused unchanged from earlier runs: 5 (night5, night6)")
    assert lines[start + 1:start + 4] == [
        "  - copied from run night5, n6; generated again because their earlier copy could not be used: "
        "4 (unreadable), 1 (torn)",
        "  - passed over run night4: torn index",
        "  - nothing reused from run night3: changed since its index was written"]
    plain = lines_of(base_report(reuse={**reuse, "regenerated": {}, "passed_over": [], "changed": None}))
    assert "  - copied from run night5, n6" in plain
    assert not any(line.startswith("  - passed over") or "nothing reused" in line for line in plain)


def test_the_per_server_and_per_gpu_tables():
    report = base_report(per_gpu={"n1:gpu0": {"server": "n1:30000", "tokens_per_s": 6172.84}})
    report["per_server"]["n2:30000"] = {**report["per_server"]["n1:30000"], "gpus": []}
    lines = lines_of(report)
    at = lines.index("## Per server")
    assert lines[at + 2:at + 6] == [
        "| server | GPUs | completions | completion tokens | tokens/s | tokens/s active | mean latency s | "
        "p95 latency s | length share |", "|---|---|---|---|---|---|---|---|---|",
        "| n1:30000 | 0,1 | 1,500 | 7,407,407 | 12,345.7 | - | 2.5 | 4.2 | 0.0123 |",
        "| n2:30000 | - | 1,500 | 7,407,407 | 12,345.7 | - | 2.5 | 4.2 | 0.0123 |"]
    at = lines.index("## Per GPU")
    assert lines[at + 2:at + 6] == ["| GPU | server | tokens/s |", "|---|---|---|", "| n1:gpu0 | n1:30000 | 6,172.8 |", ""]
    assert "## Per GPU" not in lines_of(base_report())


def test_each_plot_is_linked_under_its_section():
    plots = {"per_server": "per_server.png", "throughput_over_time": "t.png", "occupancy": "o.png",
             "gpus": "g.png", "output_tokens": "ot.png", "finish_reasons": "fr.png"}
    text = render_markdown(base_report(plots=plots, occupancy=occupancy_of(), gpus=gpus_of()))
    for line in ("![Throughput per server](per_server.png)", "![Throughput over time](t.png)",
                 "![Occupancy](o.png)", "![GPUs](g.png)", "![Output tokens](ot.png)", "![Finish reasons](fr.png)"):
        assert f"\n{line}\n" in text
    bare = render_markdown(base_report(occupancy=occupancy_of(), gpus=gpus_of()))
    assert "![" not in bare


def test_output_tokens_and_finish_reasons():
    lines = lines_of(base_report())
    at = lines.index("## Output tokens")
    assert lines[at + 2:at + 5] == ["| mean | min | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|",
                                    "| 493.8 | 100.0 | 480.0 | 900.0 | 990.0 | 1,000.0 |"]
    at = lines.index("## Finish reasons")
    assert lines[at + 2:at + 6] == ["| reason | completions |", "|---|---|", "| stop | 1,499 |", "| length | 1 |"]


def occupancy_of(fleet=0.4567, **row_changes) -> dict:
    row = {"cap": 40, "running_mean": 18.27, "occupancy": 0.4567, "queue_mean": 0.0, "token_usage_mean": 0.123,
           "token_usage_max": 0.5, "accept_length_mean": 3.14159, "sent_mean": 19.5,
           "low": "the client kept too few requests there"}
    return {"fleet_occupancy": fleet, "low_threshold": 0.5,
            "per_server": {"n1:30000": {**row, **row_changes},
                           "n2:30000": {**row, "occupancy": None, "low": None, "token_usage_max": None}}}


def test_the_occupancy_section_shows_the_fleet_each_server_and_the_low_ones():
    lines = lines_of(base_report(occupancy=occupancy_of()))
    at = lines.index("## Occupancy")
    assert lines[at + 2] == ("Fleet occupancy (mean running requests / effective cap over the generation span): "
                             "**45.7 %**")
    assert lines[at + 4:at + 12] == [
        "| server | cap | mean running | occupancy | mean queue | KV use mean / max | accept length | "
        "in flight from shards |", "|---|---|---|---|---|---|---|---|",
        "| n1:30000 | 40 | 18.3 | 46% | 0.0 | 0.12 / 0.50 | 3.14 | 19.5 |",
        "| n2:30000 | 40 | 18.3 | - | 0.0 | 0.12 / - | 3.14 | 19.5 |", "",
        "Below 50% of the cap:", "",
        "- **n1:30000**: the client kept too few requests there"]
    assert lines[at + 12] == ""
    nobody_low = lines_of(base_report(occupancy=occupancy_of(fleet=None, low=None)))
    assert "Fleet occupancy (mean running requests / effective cap over the generation span): **- %**" in nobody_low
    assert not any(line.startswith("Below ") for line in nobody_low)


def test_without_samples_the_occupancy_and_gpu_sections_say_so():
    text = render_markdown(base_report(occupancy=None, gpus=None))
    assert "## Occupancy\n\nNo metrics samples (the servers' /metrics was not sampled).\n\n## GPUs\n\n" \
           "No nvidia-smi samples.\n\n## Failures" in text


def gpus_of() -> dict:
    return {"seconds": 3600.0, "energy_kwh": 1.8, "kwh_per_million_tokens": 0.24305, "joules_per_million_tokens":
            874980.6, "per_gpu": {"n1:gpu0": {"samples": 7, "util_mean": 91.25, "util_min": 80.0,
                                              "power_mean_w": 800.0, "power_max_w": 950.5, "mem_max_mib": 170000.0},
                                  "n1:gpu1": {"samples": 2, "util_mean": None, "util_min": None,
                                              "power_mean_w": None, "power_max_w": None, "mem_max_mib": None}}}


def test_the_gpu_section_gives_energy_in_kwh_and_per_million_tokens():
    lines = lines_of(base_report(gpus=gpus_of()))
    at = lines.index("## GPUs")
    assert lines[at + 2] == ("Energy over the 3,600.0 s of generation: 1.800 kWh; **0.243 kWh per million output "
                             "tokens** (874,981 J).")
    assert lines[at + 4:at + 9] == [
        "| GPU | samples | utilisation mean / min % | power mean / max W | memory max MiB |", "|---|---|---|---|---|",
        "| n1:gpu0 | 7 | 91.2 / 80.0 | 800.0 / 950.5 | 170,000.0 |", "| n1:gpu1 | 2 | - / - | - / - | - |", ""]


def failures_of(periods: list[dict], **counts) -> dict:
    return {"down_events": len(periods), "retried": 3, "failed": 1, **counts,
            "per_server": {"n1:30000": {"down": periods, "down_seconds": 42.0, "retried": 3, "failed": 1}}}


def test_the_failures_section_lists_each_down_period_and_shard_zero_is_named():
    periods = [{"at": "T1", "shard": 0, "recovered_at": "T2", "down_s": 42.0, "reason": "http_500 | CUDA error"},
               {"at": "T3", "shard": 12, "recovered_at": None, "down_s": None, "reason": None}]
    lines = lines_of(base_report(failures=failures_of(periods)))
    at = lines.index("## Failures")
    assert lines[at + 2] == "2 time(s) a server was marked down; 3 request(s) retried; 1 prompt(s) written off."
    assert lines[at + 4:at + 8] == ["| server | marked down | seconds down | retried | failed |",
                                    "|---|---|---|---|---|", "| n1:30000 | 2 | 42.0 | 3 | 1 |", ""]
    assert lines[at + 8:at + 13] == [
        "| server | down at | seen by shard | back at | down for s | reason |", "|---|---|---|---|---|---|",
        "| n1:30000 | T1 | 0 | T2 | 42.0 | http_500 / CUDA error |",
        "| n1:30000 | T3 | 12 | not recovered | - | - |", ""]


def test_only_the_first_50_down_periods_are_listed_and_a_long_reason_is_cut():
    periods = [{"at": f"T{n}", "shard": n, "recovered_at": "x", "down_s": 1.0, "reason": "r" * 200} for n in range(51)]
    lines = lines_of(base_report(failures=failures_of(periods)))
    rows = [line for line in lines if line.startswith("| n1:30000 | T")]
    assert len(rows) == 50 and rows[-1].startswith("| n1:30000 | T49 | 49 |")
    assert rows[0].endswith("| " + "r" * 160 + " |")


def test_a_server_without_down_periods_has_no_period_table():
    lines = lines_of(base_report(failures=failures_of([], down_events=0)))
    assert "| n1:30000 | 0 | 42.0 | 3 | 1 |" in lines and not any("seen by shard" in line for line in lines)
    for quiet in (None, {"down_events": 0, "retried": 0, "failed": 0, "per_server": {}}):
        assert "## Failures\n\nNo server was marked down; no prompt was retried or written off.\n" in \
            render_markdown(base_report(failures=quiet))


def tuning_row(server="n1:30000", **changes) -> dict:
    row = {"server": server, "gpu_ids": [0, 1], "version": "0.5.23",
           "flags": {"--max-running-requests": 40, "--mem-fraction-static": 0.93},
           "expected": {"max_running_requests": 40, "max_mamba_cache_size": 200, "max_total_num_tokens": 798000},
           "effective": {"max_running_requests": 16, "max_mamba_cache_size": 200, "max_total_num_tokens": None},
           "matches": {"max_running_requests": False, "max_mamba_cache_size": True, "max_total_num_tokens": None},
           "readback": None, "workload": None}
    row.update(changes)
    return row


def test_the_tuning_table_marks_caps_that_differ_from_the_plan():
    lines = lines_of(base_report(tuning=[tuning_row(), tuning_row("n2:30000", gpu_ids=[], version=None, flags={})]))
    at = lines.index("## Tuning used")
    assert lines[at + 2] == "Caps as expected by the plan / as reported by the server."
    assert lines[at + 4:at + 9] == [
        "| server | GPUs | max running requests | Mamba slots | KV tokens | version | flags |",
        "|---|---|---|---|---|---|---|",
        "| n1:30000 | 0,1 | 40 / 16 **(differs)** | 200 / 200 | 798,000 / - | 0.5.23 | "
        "`--max-running-requests 40 --mem-fraction-static 0.93` |",
        "| n2:30000 | - | 40 / 16 **(differs)** | 200 / 200 | 798,000 / - | - | - |", ""]
    assert not any("Readback" in line or "Workload mode" in line for line in lines)
    assert "## Tuning used" not in lines_of(base_report())


def test_readbacks_and_the_workload_path_of_each_server():
    step = {"full_context_cap": 63, "previous_cap": None, "cap": 79, "target_cap": 80, "ceiling": 0,
            "reason": "one step", "settled": True}
    tuning = [tuning_row(readback="plan assumed 10 MiB"), tuning_row("n2:30000", workload=step)]
    lines = lines_of(base_report(tuning=tuning))
    at = lines.index("Readback of the memory the plan assumed:")
    assert lines[at:at + 8] == [
        "Readback of the memory the plan assumed:", "", "- **n1:30000**: plan assumed 10 MiB", "",
        "", "Workload mode: where each server's plan is on its path, and why.", "",
        "| server | full-context cap | previous cap | tonight | target | ceiling | why |"]
    assert lines[at + 9:at + 11] == ["| n2:30000 | 63 | - | 79 | 80 | 0 | one step (settled) |", ""]
    unsettled = lines_of(base_report(tuning=[tuning_row(workload={**step, "settled": False})]))
    assert "| n1:30000 | 63 | - | 79 | 80 | 0 | one step |" in unsettled


def test_the_shards_line():
    lines = lines_of(base_report(shards={"count": 2, "done": 1500, "failed": 0, "seconds_max": 31.5}))
    at = lines.index("## Shards")
    assert lines[at + 2] == "2 shards: 1,500 done, 0 failed, slowest 31.5 s."
    assert "## Shards" not in lines_of(base_report(shards=None))


def test_the_validation_table_and_its_data_docs():
    validation = {"success": False, "data_docs": "/out/night7/validation/data_docs/index.html", "expectations": [
        {"name": "length_share", "success": True, "observed": 0.0, "bound": "<= 0.2"},
        {"name": "error_share", "success": False, "observed": None, "bound": "<= 0.01"}]}
    lines = lines_of(base_report(validation=validation))
    at = lines.index("## Validation")
    assert lines[at + 2:at + 8] == ["| expectation | result | observed | bound |", "|---|---|---|---|",
                                    "| length_share | pass | 0.0 | <= 0.2 |", "| error_share | **FAIL** | None | <= 0.01 |",
                                    "", "Data Docs: `/out/night7/validation/data_docs/index.html`"]
    without_docs = lines_of(base_report(validation={**validation, "data_docs": None}))
    assert not any(line.startswith("Data Docs") for line in without_docs)


def test_the_comparison_section_in_its_three_states():
    assert render_markdown(base_report()).endswith("## Comparison with the previous run\n\nNo previous successful run.\n")
    unusable = {"available": False, "previous_report": "/out/x/report/report.json", "reason": "schema 0, expected 1"}
    assert render_markdown(base_report(comparison=unusable)).endswith(
        "Previous report `/out/x/report/report.json` not usable: schema 0, expected 1\n")
    comparison = {"available": True, "previous_run_id": "night6",
                  "metrics": {"tokens_per_s": {"previous": 1000.0, "current": 1500.0, "delta": 500.0,
                                               "delta_pct": 50.0},
                              "completions": {"previous": 0, "current": 10, "delta": 10, "delta_pct": None}},
                  "fleet_caps": {"max_running_requests": {"previous": 48, "current": 40, "delta": -8,
                                                          "delta_pct": -16.6667}}}
    lines = lines_of(base_report(comparison=comparison))
    at = lines.index("## Comparison with the previous run")
    assert lines[at + 2:] == ["Previous run: night6", "", "| metric | previous | current | delta | delta % |",
                              "|---|---|---|---|---|", "| tokens_per_s | 1,000.0 | 1,500.0 | 500.0 | +50.0 % |",
                              "| completions | 0 | 10 | 10 | - |",
                              "| fleet max_running_requests | 48 | 40 | -8 | -16.7 % |", ""]


def test_rendering_does_not_change_the_report():
    report = base_report(occupancy=occupancy_of(), gpus=gpus_of(), tuning=[tuning_row()])
    before = copy.deepcopy(report)
    render_markdown(report)
    assert report == before


def test_sections_are_separated_by_blank_lines_and_plots_follow_their_tables():
    plots = {"per_server": "per_server.png", "throughput_over_time": "t.png", "occupancy": "o.png",
             "gpus": "g.png", "output_tokens": "ot.png", "finish_reasons": "fr.png"}
    report = base_report(plots=plots, occupancy=occupancy_of(), gpus=gpus_of(), tuning=[tuning_row()],
                         per_gpu={"n1:gpu0": {"server": "n1:30000", "tokens_per_s": 1.0}},
                         failures=failures_of([]))
    text = render_markdown(report)
    assert text.startswith("# Generation run night7\n")
    for joint in ("(first request start to last finish)\n\n## Per server\n\n| server | GPUs |",
                  "| 0.0123 |\n\n## Per GPU\n\n| GPU | server |", "| 1.0 |\n\n![Throughput per server](per_server.png)\n\n"
                  "![Throughput over time](t.png)\n\n## Occupancy\n\nFleet occupancy",
                  "**45.7 %**\n\n| server | cap |", "the client kept too few requests there\n\n![Occupancy](o.png)\n\n"
                  "## GPUs\n\nEnergy over", "(874,981 J).\n\n| GPU |", "| - / - | - |\n\n![GPUs](g.png)\n\n## Failures\n\n",
                  "written off.\n\n| server | marked down |", "| 3 | 1 |\n\n## Output tokens\n\n| mean |",
                  "| 1,000.0 |\n\n![Output tokens](ot.png)\n\n## Finish reasons\n\n| reason |",
                  "| length | 1 |\n\n![Finish reasons](fr.png)\n\n## Tuning used\n\nCaps as expected by the plan / as "
                  "reported by the server.\n\n| server | GPUs | max running requests |"):
        assert joint in text, joint
    quiet = render_markdown(base_report(failures=None))
    assert "## Failures\n\nNo server was marked down; no prompt was retried or written off.\n\n## Output tokens" in quiet


def test_a_report_without_plots_renders_without_images():
    report = base_report()
    del report["plots"]
    assert "![" not in render_markdown(report)


def test_a_simulated_fleet_is_said_in_full():
    assert ("> **Simulated fleet**: the servers reported the simulator's capacity model in /server_info; every figure "
            "below comes from simulated GPUs, not measured ones.\n\n- Throughput") in render_markdown(
        base_report(simulated=True))


def test_the_parts_that_changed_are_listed():
    reuse = {"generated": 1, "reused": 0, "from_runs": {}, "changed": {"run": "n3", "parts": ["model.weights", "x"]}}
    assert "  - nothing reused from run n3: changed since model.weights, x" in lines_of(base_report(reuse=reuse))


def test_the_workload_path_shows_the_previous_cap():
    step = {"full_context_cap": 63, "previous_cap": 70, "cap": 79, "target_cap": 80, "ceiling": None,
            "reason": "r", "settled": False}
    assert "| n1:30000 | 63 | 70 | 79 | 80 | - | r |" in lines_of(base_report(tuning=[tuning_row(workload=step)]))


def test_the_later_sections_keep_the_whole_page_and_their_blank_lines():
    validation = {"success": True, "data_docs": "/d/index.html",
                  "expectations": [{"name": "n", "success": True, "observed": 1, "bound": "b"}]}
    unusable = {"available": False, "previous_report": "/p.json", "reason": "gone"}
    report = base_report(tuning=[tuning_row(readback="r1")], validation=validation, comparison=unusable,
                         shards={"count": 2, "done": 5, "failed": 1, "seconds_max": 3.0})
    text = render_markdown(report)
    assert text.startswith("# Generation run night7\n")
    for joint in ("## Finish reasons\n\n| reason |", "- **n1:30000**: r1\n\n## Shards\n\n2 shards: 5 done, 1 failed, "
                  "slowest 3.0 s.\n\n## Validation\n\n| expectation |",
                  "| n | pass | 1 | b |\n\nData Docs: `/d/index.html`\n\n## Comparison with the previous run\n\n"
                  "Previous report `/p.json` not usable: gone\n"):
        assert joint in text, joint


def test_a_validation_without_expectations_has_an_empty_table():
    lines = lines_of(base_report(validation={"success": True}))
    at = lines.index("## Validation")
    assert lines[at + 2:at + 5] == ["| expectation | result | observed | bound |", "|---|---|---|---|", ""]


def test_the_nodes_left_out_and_a_prompt_that_cuts_every_cap_are_said_under_the_tuning():
    notes = {"nodes_left_out": [{"node": "node1", "reason": "cannot reach the node via connection 'ssh_node1'"}],
             "long_prompt": {"warning": "prompt 'long' (line 61, ~175000 tokens estimated) sets every server's "
                                        "context"}}
    lines = lines_of(base_report(plan_notes=notes))
    at = lines.index("## Left out of the plan and warnings")
    assert lines[at + 1:at + 9] == [
        "", "Nodes left out of tonight's plan (unreachable at probe time; the DAG parameter skip_unreachable_nodes "
            "is set): the run went on without them.", "", "| node | why |", "|---|---|",
        "| node1 | cannot reach the node via connection 'ssh_node1' |", "",
        "**Warning**: prompt 'long' (line 61, ~175000 tokens estimated) sets every server's context."]


@pytest.mark.parametrize("notes", [None, {"nodes_left_out": [], "long_prompt": None}])
def test_a_plan_that_left_nothing_out_has_no_such_section(notes):
    assert "## Left out of the plan and warnings" not in lines_of(base_report(plan_notes=notes))


def test_servers_of_ours_stopped_by_their_launch_marker_are_listed_with_why():
    stops = [{"node": "node0", "port": 30000, "pid": 11, "signal": "TERM", "launched_under_other_module": True,
              "pid_file_missing": False},
             {"node": "node0", "port": 30001, "pid": 12, "signal": "KILL", "launched_under_other_module": True,
              "pid_file_missing": True}]
    lines = lines_of(base_report(marker_stops=stops))
    at = lines.index("## Servers of ours stopped that the fleet file no longer describes")
    assert lines[at + 2:at + 6] == [
        "| node | port | pid | signal | why |", "|---|---|---|---|---|",
        "| node0 | 30000 | 11 | TERM | launched under another server.module |",
        "| node0 | 30001 | 12 | KILL | launched under another server.module; its pid file was gone |"]
    assert "## Servers of ours stopped" not in "\n".join(lines_of(base_report(marker_stops=[])))


# --- GPU-hours and cost (report/gpu_hours.py's figures, rendered) --------------------------------------------------

def _cost(tmp_path, prices, *, released=True):
    """Two one-GPU servers held 2 h and 2.5 h (one released, one still up), 11 M output tokens, a trial's payoff."""
    from gpu_hours_fixtures import B200, plan_entry, record, stats, trial_payoff, where

    from fleetgen.outputs import RunLayout
    from fleetgen.report.gpu_hours import gpu_hours

    layout = RunLayout(tmp_path / "run")
    plan = [plan_entry("a", 1, [B200]), plan_entry("c", 1, [B200])]
    for server in where(plan):
        record(layout, server, ("launched", 0.0), ("ready", 300.0))
    if released:
        record(layout, "a:1", ("stopped", 7200.0))
    rows = stats(("a:1", 4000.0, 3000.0, 5_000_000), ("c:1", 5000.0, 4000.0, 6_000_000))
    return gpu_hours(layout, stats=rows, plan=plan, server_gpus=where(plan), prices=prices, now=9000.0,
                     payoff={**trial_payoff(), "candidates": [dict(row, servers=[server]) for row, server in
                                                             zip(trial_payoff()["candidates"][:2], ("a:1", "c:1"))]})


def test_the_cost_section_with_a_price_gives_the_run_each_server_and_each_configuration(tmp_path):
    from fleetgen.report.prices import GpuHourPrice

    cost = _cost(tmp_path, GpuHourPrice(currency="USD", per_gpu_hour={"NVIDIA B200": 3.6}))
    text = render_markdown(base_report(gpu_hours=cost, tuning_payoff=None))
    section = text[text.index("## GPU-hours and cost"):text.index("## Failures")].split("\n")
    assert section[:11] == [
        "## GPU-hours and cost", "",
        "From launch (or takeover of a server kept running) to release or the report: **4.5000 GPU-hours** (loading "
        "0.1667, "
        "generating 1.9444, idle 2.3889); 0.4091 GPU-hours per million output tokens.", "",
        "Servers still up when the report was written (keep_servers_up, or release_servers, which runs after the "
        "report) are counted to the report's time.", "",
        "Prices (gpu_hour_price): NVIDIA B200 3.60 USD per GPU-hour.", "",
        "Cost: **16.20 USD**; **1.47 USD per million output tokens**.", "",
        "| server | GPUs | from | held s | loading s | generating s | idle s | GPU-hours | output tokens | cost | "
        "cost per M tokens |"]
    assert section[12:14] == [
        "| a:1 | 1 x NVIDIA B200 | launch | 7,200.0 | 300.0 | 3,000.0 | 3,900.0 | 2.0000 | 5,000,000 | 7.20 USD "
        "| 1.44 USD |",
        "| c:1 | 1 x NVIDIA B200 | launch | 9,000.0 | 300.0 | 4,000.0 | 4,700.0 | 2.5000 | 6,000,000 | 9.00 USD "
        "| 1.50 USD |"]
    assert "| cap-3/4 | 1,250 | 0.2222 | 0.8000 USD |" in section and \
        "| in use (cap-3/4) | 1,250 | 0.2222 | 0.8000 USD |" in section
    payoff = render_markdown(base_report(gpu_hours=cost, tuning_payoff=_a_payoff()))
    assert ("- Saved per million output tokens by cap-3/4 against the incumbent (incumbent): 0.0556 GPU-hours, "
            "0.2000 USD.") in payoff.split("## Tuning payoff")[1].split("\n")
    kept = copy.deepcopy(cost)
    kept["configurations"]["savings"][0].update(configuration="incumbent", same=True, gpu_hours_per_million_tokens=0.0)
    assert "- The trial kept incumbent: nothing saved per million output tokens against it." in render_markdown(
        base_report(gpu_hours=kept, tuning_payoff=_a_payoff())).split("\n")


def test_without_a_price_the_cost_section_keeps_the_gpu_hours_and_says_why_there_is_no_money(tmp_path):
    from fleetgen.report.prices import GpuHourPrice

    text = render_markdown(base_report(gpu_hours=_cost(tmp_path, GpuHourPrice(), released=False)))
    section = text[text.index("## GPU-hours and cost"):text.index("## Failures")]
    assert "**4.5000 GPU-hours**" not in section and "**5.0000 GPU-hours**" in section  # both up to the report
    assert "No money: the DAG parameter gpu_hour_price is empty (set a price per GPU-hour by GPU name)." in section
    assert "Cost:" not in section and "USD" not in section and "Prices" not in section
    assert "| a:1 | 1 x NVIDIA B200 | launch | 9,000.0 | 300.0 | 3,000.0 | 5,700.0 | 2.5000 | 5,000,000 | - | - |" \
        in section
    assert "| incumbent | 1,000 | 0.2778 | - |" in section


def test_a_gpu_without_a_price_a_price_for_no_gpu_and_a_server_not_recorded_are_named(tmp_path):
    from fleetgen.report.prices import GpuHourPrice

    cost = _cost(tmp_path, GpuHourPrice(currency="EUR", per_gpu_hour={"NVIDIA H100": 2.0}))
    cost["not_recorded"] = ["z:1"]
    section = render_markdown(base_report(gpu_hours=cost)).split("## GPU-hours and cost")[1].split("## Failures")[0]
    assert "- **No price for NVIDIA B200** (servers a:1, c:1): the run's cost is not given; add it to " \
           "gpu_hour_price." in section
    assert "- Priced but in no server of the fleet: NVIDIA H100 (names must be nvidia-smi's)." in section
    assert "- No launch recorded for z:1: not counted." in section and "Cost:" not in section


def test_a_run_without_recorded_launches_says_so_and_a_report_without_the_figures_has_no_section():
    empty = {"currency": None, "priced": False, "gpu_hours": {}, "per_server": {}}
    assert "No server's launch was recorded in server-times/" in render_markdown(base_report(gpu_hours=empty))
    assert "## GPU-hours and cost" not in render_markdown(base_report())


def _a_payoff() -> dict:
    return {"simulated": False, "trial": "skipped", "why": "the trial was off", "candidates": [], "decision": None,
            "in_use": {"candidate": None, "score": None, "windows": 0, "source": "the whole run", "cap": None},
            "vs_auto_sizing": None, "vs_previous": None, "cost": None}


def test_the_end_of_the_job_follows_the_tuning_payoff_and_a_report_without_it_has_no_such_section():
    drain = {"per_server": {}, "unmeasured": {"n1:30000": "never at its batch"}, "fleet": None}
    text = render_markdown(base_report(tuning_payoff=_a_payoff(), drain=drain,
                                       shards={"count": 1, "done": 1, "failed": 0, "seconds_max": 1.0}))
    assert ("the whole run).\n- Against SGLang's automatic sizing: no measurement to compare with.\n- Against the "
            "previous night: no measurement to compare with.\n\n## End of the job\n\nNo drain measured: no server was "
            "at its batch on its last stretch.\n\n- **n1:30000**: never at its batch.\n\n## Shards\n\n") in text
    assert "End of the job" not in render_markdown(base_report())
    assert "End of the job" not in render_markdown(base_report(drain=None))
