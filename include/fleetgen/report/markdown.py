"""The run report as Markdown: what a person reads first (``report.md``); figures come from ``report.json``."""

from __future__ import annotations


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


def render_markdown(report: dict) -> str:
    """The human page of ``report.json``: headline, tables, plots, validation and comparison."""
    throughput, timing, tokens = report["throughput"], report["timing"], report["completion_tokens"]
    validation = report.get("validation")
    verdict = "not run" if validation is None else ("passed" if validation.get("success") else "FAILED")
    lines = [f"# Generation run {report['run_id']}", "",
             f"Generated {report['generated_at']}. Validation: **{verdict}**.", "",
             *([f"> **Simulated fleet**: the servers reported the simulator's capacity model in /server_info; "
                f"every figure below comes from simulated GPUs, not measured ones.", ""]
               if report.get("simulated") else []),
             f"- Throughput: **{_number(throughput['tokens_per_s'])} completion tokens/s** "
             f"(basis: {timing['basis']}; over the generation span "
             f"{_number(throughput['tokens_per_s_generation'])} tokens/s)",
             f"- Completions: {_number(report['totals']['completions'])}; permanent failures: "
             f"{_number(report['errors']['prompts'])}",
             f"- Tokens: {_number(report['totals']['prompt_tokens'])} prompt, "
             f"{_number(report['totals']['completion_tokens'])} completion",
             f"- Generation span: {_number(timing['generation_seconds'])} s (first request start to last finish)"
             + (f"; wall time given: {_number(timing['wall_seconds'])} s" if timing["wall_seconds"] else ""), ""]
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
        lines += _workload_path(report["tuning"])
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
