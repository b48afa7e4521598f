"""The run report as Markdown: what a person reads first (``report.md``); figures come from ``report.json``."""

from __future__ import annotations

from fleetgen.report.drain import drain_lines


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_number(cell) if not isinstance(cell, str) else cell for cell in row) + " |"
              for row in rows]
    return lines + [""]


def _expected_vs_effective(row: dict, key: str) -> str:
    expected, effective = row["expected"][key], row["effective"][key]
    mark = {True: "", False: " **(differs)**", None: ""}[row["matches"][key]]
    return f"{_number(expected)} / {_number(effective)}{mark}"


def _occupancy_section(occupancy: dict | None, plots: dict) -> list[str]:
    lines = ["## Occupancy", ""]
    if not occupancy:
        return lines + ["No metrics samples (the servers' /metrics was not sampled).", ""]
    fleet = occupancy["fleet_occupancy"]
    lines += [f"Fleet occupancy (mean running requests / effective cap over the generation span): "
              f"**{_number(fleet * 100 if fleet is not None else None)} %**", ""]
    lines += _table(["server", "cap", "mean running", "occupancy", "mean queue", "KV use mean / max",
                     "accept length", "in flight from shards"],
                    [[name, row["cap"], row["running_mean"],
                      f"{row['occupancy']:.0%}" if row["occupancy"] is not None else "-", row["queue_mean"],
                      f"{_number(row['token_usage_mean'], 2)} / {_number(row['token_usage_max'], 2)}",
                      _number(row["accept_length_mean"], 2), row["sent_mean"]]
                     for name, row in occupancy["per_server"].items()])
    low = {name: row["low"] for name, row in occupancy["per_server"].items() if row.get("low")}
    if low:
        lines += [f"Below {occupancy['low_threshold']:.0%} of the cap:", ""]
        lines += [f"- **{name}**: {reason}" for name, reason in low.items()] + [""]
    if "occupancy" in plots:
        lines += [f"![Occupancy]({plots['occupancy']})", ""]
    return lines


def _rate(score: dict | None) -> str:
    return "-" if not score else f"{_number(score['median'], 0)}"


def _interval(score: dict | None) -> str:
    return "-" if not score else f"{_number(score['lower'], 0)}..{_number(score['upper'], 0)}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _result(row: dict) -> str:
    if row["winner"]:
        return "kept (incumbent)" if row["incumbent"] else "**chosen**"
    if row["score"] is None:
        return f"not judged ({row['windows']} windows)"
    return "too noisy" if row["noisy"] else ("incumbent, replaced" if row["incumbent"] else "lost")


def _against_line(label: str, against: dict | None) -> str:
    if against is None:
        return f"- {label}: no measurement to compare with."
    if not against.get("measured"):
        return f"- {label}: not measured ({against.get('why', 'no figure')})."
    line = (f"- {label} ({against['source']}): {against['gain']:+.1%} output tokens/s per GPU "
            f"({_number(against['rate'], 0)} there)")
    if against.get("ratio_of_ratios") is not None:
        line += (f"; {_times(against['concurrency_x'])} the running requests gave {_times(against['throughput_x'])} "
                 f"the throughput ({against['ratio_of_ratios']:.2f} of proportional)")
    return line + "."


def _payoff_section(payoff: dict | None, savings: list[str] = ()) -> list[str]:
    """Tuning payoff (docs/tuning-trial.md §6): the candidates measured, the decision, what the one in use gained
    (``savings``: in GPU-hours and money per million output tokens)."""
    if not payoff:
        return []
    lines = ["## Tuning payoff", ""]
    if payoff["simulated"]:
        lines += ["> **Simulated**: these rates come from the simulator's speed model, not from GPUs.", ""]
    in_use = payoff["in_use"]
    if payoff["trial"] != "ran":
        lines += [f"No tuning trial in this run: {payoff['why']}.", ""]
        notes = [note for note in payoff.get("plan_notes") or [] if note != payoff["why"]]
        if notes:
            lines += ["The plan's notes on the trial (derive_plan):", ""] + [f"- {note}" for note in notes] + [""]
    else:
        decision = payoff["decision"]
        lines += [f"Decision: {decision['reason']}.", "",
                  "Output tokens/s per GPU in steady state (the batch at its cap; warm-up and drain left out), "
                  f"windows of {_number(payoff['window_s'], 0)} s, interval median ± 1.4826 x MAD; "
                  f"x: against {decision['incumbent']}.", ""]
        lines += _table(["candidate", "servers", "running requests (cap)", "tokens/s per GPU", "interval", "windows",
                         "concurrency x", "throughput x", "result"],
                        [[row["name"], str(len(row["servers"])), _number(row["cap"], 0), _rate(row["score"]),
                          _interval(row["score"]), str(row["windows"]), _times(row["concurrency_x"]),
                          _times(row["throughput_x"]), _result(row)] for row in payoff["candidates"]])
    lines += [f"- In use: {in_use.get('candidate') or 'the plan'} at {_rate(in_use['score'])} tokens/s per GPU "
              f"({_interval(in_use['score'])}, {in_use['windows']} windows, {in_use['source']}; "
              f"cap {_number(in_use['cap'], 0)})."
              if in_use["score"] else f"- In use: not measured ({in_use['windows']} steady windows, "
                                      f"fewer than 3; {in_use['source']})."]
    lines.append(_against_line("Against SGLang's automatic sizing", payoff["vs_auto_sizing"]))
    lines.append(_against_line("Against the previous night", payoff["vs_previous"]))
    relaunch = payoff.get("relaunch")
    if relaunch and relaunch.get("moved"):
        lines.append(f"- Relaunch round ({relaunch.get('policy', 'when_it_pays')}): {relaunch['reason']}.")
    cost = payoff.get("cost")
    if cost is not None:
        share = f" ({cost['share_of_job']:.2%} of the job's GPU time)" if cost["share_of_job"] is not None else ""
        unmeasured = f"; not measured on {', '.join(cost['unmeasured'])}" if cost["unmeasured"] else ""
        lines.append(f"- Trial cost: {_number(cost['gpu_minutes'], 2)} GPU-minutes at the challengers' lower speed"
                     f"{share}{unmeasured}.")
    return lines + list(savings) + [""]


def _gpus_section(gpus: dict | None, plots: dict) -> list[str]:
    lines = ["## GPUs", ""]
    if not gpus:
        return lines + ["No nvidia-smi samples.", ""]
    lines += [f"Energy over the {_number(gpus['seconds'])} s of generation: {_number(gpus['energy_kwh'], 3)} kWh; "
              f"**{_number(gpus['kwh_per_million_tokens'], 3)} kWh per million output tokens** "
              f"({_number(gpus['joules_per_million_tokens'], 0)} J).", ""]
    lines += _table(["GPU", "samples", "utilisation mean / min %", "power mean / max W", "memory max MiB"],
                    [[name, row["samples"], f"{_number(row['util_mean'])} / {_number(row['util_min'])}",
                      f"{_number(row['power_mean_w'])} / {_number(row['power_max_w'])}", row["mem_max_mib"]]
                     for name, row in gpus["per_gpu"].items()])
    if "gpus" in plots:
        lines += [f"![GPUs]({plots['gpus']})", ""]
    return lines


def _amount(value: float | None, currency: str | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f} {currency}" if abs(value) >= 1 else f"{value:.4f} {currency}"


def _hours(value: float | None) -> str:
    return "-" if value is None else (f"{value:,.2f}" if abs(value) >= 10 else f"{value:.4f}")


def _cost_section(cost: dict | None) -> list[str]:
    """GPU-hours from launch to release, split, and what they cost at gpu_hour_price (report/gpu_hours.py)."""
    if not cost:
        return []
    lines, currency, hours = ["## GPU-hours and cost", ""], cost["currency"], cost["gpu_hours"]
    if not cost["per_server"]:
        return lines + ["No server's launch was recorded in server-times/ (a run made before they were): no "
                        "GPU-hours.", ""]
    lines += [f"From launch (or takeover of a server kept running) to release or the report: "
              f"**{_hours(hours['held'])} GPU-hours** "
              f"(loading {_hours(hours['loading'])}, generating {_hours(hours['generating'])}, idle "
              f"{_hours(hours['idle'])}); {_hours(cost['gpu_hours_per_million_tokens'])} GPU-hours per million "
              "output tokens.", ""]
    if "report" in cost["ends"]:
        lines += ["Servers still up when the report was written (keep_servers_up, or release_servers, which runs "
                  "after the report) are counted to the report's time.", ""]
    if not cost["priced"]:
        lines += ["No money: the DAG parameter gpu_hour_price is empty (set a price per GPU-hour by GPU name).", ""]
    else:
        lines += ["Prices (gpu_hour_price): " + ", ".join(f"{name} {_amount(price, currency)} per GPU-hour" for
                                                            name, price in cost["prices"]["per_gpu_hour"].items())
                  + ".", ""]
    if cost["cost"] is not None:
        lines += [f"Cost: **{_amount(cost['cost'], currency)}**; "
                  f"**{_amount(cost['cost_per_million_tokens'], currency)} per million output tokens**.", ""]
    for name, servers in cost["unpriced"].items():
        lines += [f"- **No price for {name}** (servers {', '.join(servers)}): the run's cost is not given; add it "
                  "to gpu_hour_price."]
    if cost["unused_prices"]:
        lines += [f"- Priced but in no server of the fleet: {', '.join(cost['unused_prices'])} (names must be "
                  "nvidia-smi's)."]
    if cost["not_recorded"]:
        lines += [f"- No launch recorded for {', '.join(cost['not_recorded'])}: not counted."]
    lines += [""] if cost["unpriced"] or cost["unused_prices"] or cost["not_recorded"] else []
    lines += _table(["server", "GPUs", "from", "held s", "loading s", "generating s", "idle s", "GPU-hours",
                     "output tokens", "cost", "cost per M tokens"],
                    [[name, f"{row['gpus']} x {', '.join(sorted(set(row['gpu_names']))) or '?'}",
                      "kept" if row["kept"] else "launch", row["seconds"]["held"], row["seconds"]["loading"],
                      row["seconds"]["generating"], row["seconds"]["idle"], _hours(row["gpu_hours"]["held"]),
                      row["completion_tokens"], _amount(row["cost"], currency),
                      _amount(row["cost_per_million_tokens"], currency)] for name, row in cost["per_server"].items()])
    configurations = cost["configurations"]["rows"]
    if any(row["tokens_per_s_per_gpu"] for row in configurations):
        lines += ["Per configuration, at its steady output tokens/s per GPU (Tuning payoff):", ""]
        lines += _table(["configuration", "tokens/s per GPU", "GPU-hours per M tokens", "cost per M tokens"],
                        [[row["name"], _number(row["tokens_per_s_per_gpu"], 0),
                          _hours(row["gpu_hours_per_million_tokens"]),
                          _amount(row["cost_per_million_tokens"], currency)] for row in configurations])
    return lines


def _savings_lines(cost: dict | None) -> list[str]:
    """What the configuration in use saves per million output tokens (the Tuning payoff's last lines)."""
    currency = (cost or {}).get("currency")
    return [f"- The trial kept {saving['configuration']}: nothing saved per million output tokens against it."
            if saving.get("same") else
            f"- Saved per million output tokens by {saving['configuration']} against {saving['against']}: "
            f"{_hours(saving['gpu_hours_per_million_tokens'])} GPU-hours"
            + (f", {_amount(saving['cost_per_million_tokens'], currency)}" if saving["cost_per_million_tokens"]
               is not None else "") + "."
            for saving in ((cost or {}).get("configurations") or {}).get("savings", [])]


def _failures_section(failures: dict | None) -> list[str]:
    lines = ["## Failures", ""]
    if not failures or not failures["per_server"]:
        return lines + ["No server was marked down; no prompt was retried or written off.", ""]
    lines += [f"{failures['down_events']} time(s) a server was marked down; {failures['retried']} request(s) "
              f"retried; {failures['failed']} prompt(s) written off.", ""]
    lines += _table(["server", "marked down", "seconds down", "retried", "failed"],
                    [[name, len(row["down"]), row["down_seconds"], row["retried"], row["failed"]]
                     for name, row in failures["per_server"].items()])
    periods = [(name, period) for name, row in failures["per_server"].items() for period in row["down"]]
    if periods:
        lines += _table(["server", "down at", "seen by shard", "back at", "down for s", "reason"],
                        [[name, p["at"], p["shard"], p["recovered_at"] or "not recovered", p["down_s"],
                          (p["reason"] or "-").replace("|", "/")[:160]] for name, p in periods[:50]])
    return lines


def _headline(report: dict) -> list[str]:
    throughput, timing, validation = report["throughput"], report["timing"], report.get("validation")
    verdict = "not run" if validation is None else ("passed" if validation.get("success") else "FAILED")
    reuse, servers = report["reuse"], report["servers"]
    return [f"# Generation run {report['run_id']}", "",
            f"Generated {report['generated_at']}. Validation: **{verdict}**.", "",
            *([f"> **Not validated**: {report['not_validated']}. Its completions are not indexed for later runs "
               "to reuse.", ""] if report.get("not_validated") else []),
            *(["> **Simulated fleet**: the servers reported the simulator's capacity model in /server_info; "
               "every figure below comes from simulated GPUs, not measured ones.", ""]
              if report.get("simulated") else []),
            f"- Throughput: **{_number(throughput['tokens_per_s'])} completion tokens/s** "
            f"(basis: {timing['basis']}; over the generation span "
            f"{_number(throughput['tokens_per_s_generation'])} tokens/s)",
            f"- Completions: {_number(report['totals']['completions'])}; permanent failures: "
            f"{_number(report['errors']['prompts'])}",
            f"- Tokens: {_number(report['totals']['prompt_tokens'])} prompt, "
            f"{_number(report['totals']['completion_tokens'])} completion",
            f"- Completions generated tonight: {_number(reuse['generated'])}; reused unchanged from "
            f"earlier runs: {_number(reuse['reused'])}"
            + (f" ({', '.join(reuse['from_runs'])})" if reuse["from_runs"] else ""),
            *_reuse_lines(reuse),
            f"- Servers: {servers['kept']} kept running (already on tonight's plan), {servers['relaunched']} "
            "(re)launched",
            f"- Generation span: {_number(timing['generation_seconds'])} s (first request start to last finish)"
            + (f"; wall time given: {_number(timing['wall_seconds'])} s" if timing["wall_seconds"] else ""), ""]


def _reuse_lines(reuse: dict) -> list[str]:
    """Why fewer completions than the earlier runs held were reused (docs/output-formats.md §3.9)."""
    lines = []
    if reuse.get("source_runs"):
        lines.append(f"  - copied from run {', '.join(reuse['source_runs'])}"
                     + ("; generated again because their earlier copy could not be used: "
                        + ", ".join(f"{_number(count)} ({reason})" for reason, count in reuse["regenerated"].items())
                        if reuse.get("regenerated") else ""))
    for skipped in reuse.get("passed_over", []):
        lines.append(f"  - passed over run {skipped['run']}: {skipped['reason']}")
    if reuse.get("changed"):
        lines.append(f"  - nothing reused from run {reuse['changed']['run']}: changed since "
                     f"{', '.join(reuse['changed']['parts']) or 'its index was written'}")
    return lines


def render_markdown(report: dict) -> str:
    """The human page of ``report.json``: headline, tables, plots, validation and comparison."""
    tokens, validation = report["completion_tokens"], report.get("validation")
    lines = _headline(report)
    plots = report.get("plots", {})
    lines += ["## Per server", ""]
    lines += _table(["server", "GPUs", "completions", "completion tokens", "tokens/s", "tokens/s active",
                     "mean latency s", "p95 latency s", "length share"],
                    [[name, ",".join(map(str, row["gpus"])) or "-", row["completions"], row["completion_tokens"],
                      row["tokens_per_s"], row["tokens_per_s_active"], row["mean_latency_s"], row["p95_latency_s"],
                      _number(row["length_share"], 4)] for name, row in report["per_server"].items()])
    if report["per_gpu"]:
        lines += ["## Per GPU", ""]
        lines += _table(["GPU", "server", "tokens/s"],
                        [[name, row["server"], row["tokens_per_s"]] for name, row in report["per_gpu"].items()])
    for key, title in (("per_server", "Throughput per server"), ("throughput_over_time", "Throughput over time")):
        if key in plots:
            lines += [f"![{title}]({plots[key]})", ""]
    lines += _occupancy_section(report.get("occupancy"), plots)
    lines += _gpus_section(report.get("gpus"), plots)
    lines += _cost_section(report.get("gpu_hours"))
    lines += _failures_section(report.get("failures"))
    lines += ["## Output tokens", ""]
    lines += _table(["mean", "min", "p50", "p90", "p99", "max"],
                    [[tokens["mean"], tokens["min"], tokens["p50"], tokens["p90"], tokens["p99"], tokens["max"]]])
    if "output_tokens" in plots:
        lines += [f"![Output tokens]({plots['output_tokens']})", ""]
    lines += ["## Finish reasons", ""]
    lines += _table(["reason", "completions"], [[name, count] for name, count in report["finish_reasons"].items()])
    if "finish_reasons" in plots:
        lines += [f"![Finish reasons]({plots['finish_reasons']})", ""]
    if report["tuning"]:
        lines += ["## Tuning used", "", "Caps as expected by the plan / as reported by the server.", ""]
        lines += _table(["server", "GPUs", "max running requests", "Mamba slots", "KV tokens", "version", "flags"],
                        [[row["server"], ",".join(map(str, row["gpu_ids"])) or "-",
                          _expected_vs_effective(row, "max_running_requests"),
                          _expected_vs_effective(row, "max_mamba_cache_size"),
                          _expected_vs_effective(row, "max_total_num_tokens"), row["version"] or "-",
                          "`" + " ".join(f"{flag} {value}" for flag, value in row["flags"].items()) + "`"
                          if row["flags"] else "-"] for row in report["tuning"]])
        readbacks = [f"- **{row['server']}**: {row['readback']}" for row in report["tuning"] if row.get("readback")]
        if readbacks:
            lines += ["Readback of the memory the plan assumed:", "", *readbacks, ""]
        lines += _workload_path(report["tuning"])
    lines += _payoff_section(report.get("tuning_payoff"), _savings_lines(report.get("gpu_hours")))
    lines += drain_lines(report.get("drain"))
    lines += _plan_notes_section(report.get("plan_notes"))
    lines += _marker_stops_section(report.get("marker_stops"))
    if report.get("shards"):
        shards = report["shards"]
        lines += ["## Shards", "", f"{shards['count']} shards: {_number(shards['done'])} done, "
                  f"{_number(shards['failed'])} failed, slowest {_number(shards['seconds_max'])} s.", ""]
    if validation is not None:
        lines += ["## Validation", ""]
        lines += _table(["expectation", "result", "observed", "bound"],
                        [[entry["name"], "pass" if entry["success"] else "**FAIL**", str(entry["observed"]),
                          entry["bound"]] for entry in validation.get("expectations", [])])
        if validation.get("data_docs"):
            lines += [f"Data Docs: `{validation['data_docs']}`", ""]
    comparison = report.get("comparison")
    lines += ["## Comparison with the previous run", ""]
    if comparison is None:
        lines += ["No previous successful run.", ""]
    elif not comparison.get("available"):
        lines += [f"Previous report `{comparison['previous_report']}` not usable: {comparison['reason']}", ""]
    else:
        lines += [f"Previous run: {comparison['previous_run_id']}", ""]
        entries = {**comparison["metrics"],
                   **{f"fleet {key}": value for key, value in comparison["fleet_caps"].items()}}
        rows = [[name, entry["previous"], entry["current"], entry["delta"],
                 f"{entry['delta_pct']:+.1f} %" if entry["delta_pct"] is not None else "-"]
                for name, entry in entries.items()]
        lines += _table(["metric", "previous", "current", "delta", "delta %"], rows)
    return "\n".join(lines)


def _marker_stops_section(stops: list[dict] | None) -> list[str]:
    """Servers of ours stop_servers found only by their launch marker: launched under another server.module than
    the fleet file names now, or with their pid file gone."""
    if not stops:
        return []
    lines = ["## Servers of ours stopped that the fleet file no longer describes", ""]
    rows = [[stop["node"], str(stop["port"]), str(stop["pid"]), stop.get("signal") or "-",
             "; ".join(why for flag, why in (("launched_under_other_module", "launched under another server.module"),
                                              ("pid_file_missing", "its pid file was gone")) if stop.get(flag))]
            for stop in stops]
    return lines + _table(["node", "port", "pid", "signal", "why"], rows)


def _plan_notes_section(notes: dict | None) -> list[str]:
    """What the plan left out (nodes unreachable at probe time) or warns about (a prompt that cuts every cap)."""
    left_out, long_prompt = (notes or {}).get("nodes_left_out") or [], (notes or {}).get("long_prompt")
    if not left_out and not long_prompt:
        return []
    lines = ["## Left out of the plan and warnings", ""]
    if left_out:
        lines += ["Nodes left out of tonight's plan (unreachable at probe time; the DAG parameter "
                  "skip_unreachable_nodes is set): the run went on without them.", ""]
        lines += _table(["node", "why"], [[entry["node"], entry["reason"]] for entry in left_out])
    if long_prompt:
        lines += [f"**Warning**: {long_prompt['warning']}.", ""]
    return lines


def _workload_path(tuning: list[dict]) -> list[str]:
    """The workload mode's path per server: full-context cap, previous, tonight, target, ceiling, why."""
    paths = [row for row in tuning if row.get("workload")]
    if not paths:
        return []

    def shown(value) -> str:
        return "-" if value is None else str(value)

    rows = [[row["server"], shown(step["full_context_cap"]), shown(step["previous_cap"]), shown(step["cap"]),
             shown(step["target_cap"]), shown(step["ceiling"]),
             step["reason"] + (" (settled)" if step["settled"] else "")]
            for row in paths for step in (row["workload"],)]
    return ["", "Workload mode: where each server's plan is on its path, and why.", ""] + \
        _table(["server", "full-context cap", "previous cap", "tonight", "target", "ceiling", "why"], rows)
