"""Rendering of a run report: PNG plots (matplotlib, Agg canvas) and the Markdown page.

``report.py`` computes the figures; this module only draws them, from the plain data that
``report.json`` holds, so both can be redrawn from the JSON alone.

``matplotlib.figure.Figure`` is used directly (no ``pyplot``): no global figure state, no GUI
backend, safe in an Airflow worker and in threads.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

__all__ = ["plot_throughput_over_time", "plot_output_tokens", "plot_finish_reasons", "plot_per_server",
           "write_plots", "render_markdown"]

_SIZE = (9, 4.5)
_DPI = 100


def _save(figure: Figure, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=_DPI)
    return path.name


def plot_throughput_over_time(timeline: dict, path: Path) -> str:
    """Completion tokens/s per time bucket, overall and per server (tokens counted at finish time)."""
    figure = Figure(figsize=_SIZE)
    axes = figure.add_subplot()
    width = timeline["bucket_seconds"]
    minutes = [index * width / 60 for index in range(len(timeline["overall"]))]
    axes.plot(minutes, timeline["overall"], color="black", linewidth=2, label="all servers")
    for server, series in sorted(timeline["per_server"].items()):
        axes.plot(minutes, series, linewidth=1, alpha=0.8, label=server)
    axes.set_xlabel(f"minutes since the first request started ({width:g} s buckets)")
    axes.set_ylabel("completion tokens / s")
    axes.set_title("Throughput over time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", ncol=2)
    return _save(figure, path)


def plot_output_tokens(histogram: dict, path: Path) -> str:
    """Histogram of completion tokens per completion."""
    figure = Figure(figsize=_SIZE)
    axes = figure.add_subplot()
    edges, counts = histogram["edges"], histogram["counts"]
    widths = [right - left for left, right in zip(edges, edges[1:])]
    axes.bar(edges[:-1], counts, width=widths, align="edge", color="#4472c4", edgecolor="white")
    if histogram.get("max_tokens"):
        axes.axvline(histogram["max_tokens"], color="#c00000", linestyle="--",
                     label=f"max_tokens {histogram['max_tokens']}")
        axes.legend(fontsize="small")
    axes.set_xlabel("completion tokens")
    axes.set_ylabel("completions")
    axes.set_title("Output tokens per completion")
    axes.grid(alpha=0.3, axis="y")
    return _save(figure, path)


def plot_finish_reasons(counts: dict[str, int], path: Path) -> str:
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    names = sorted(counts, key=counts.get, reverse=True)
    bars = axes.bar(names, [counts[name] for name in names], color="#70ad47")
    axes.bar_label(bars, fmt="%d", fontsize="small")
    axes.set_ylabel("completions")
    axes.set_title("Finish reasons")
    return _save(figure, path)


def plot_per_server(per_server: dict[str, dict], path: Path) -> str:
    """Completion tokens/s of each server over the run's generation span (they add up to the total)."""
    figure = Figure(figsize=_SIZE)
    axes = figure.add_subplot()
    names = sorted(per_server)
    bars = axes.barh(names, [per_server[name]["tokens_per_s"] for name in names], color="#4472c4")
    axes.bar_label(bars, fmt="%.0f", fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("completion tokens / s")
    axes.set_title("Throughput per server")
    axes.grid(alpha=0.3, axis="x")
    return _save(figure, path)


def write_plots(report: dict, folder: Path) -> dict[str, str]:
    """Draw every plot the report has data for; return {plot name: file name in ``folder``}."""
    written: dict[str, str] = {}
    if report["timeline"]["overall"]:
        written["throughput_over_time"] = plot_throughput_over_time(
            report["timeline"], folder / "throughput_over_time.png")
    if report["completion_tokens"]["histogram"]["counts"]:
        written["output_tokens"] = plot_output_tokens(
            report["completion_tokens"]["histogram"], folder / "output_tokens.png")
    if report["finish_reasons"]:
        written["finish_reasons"] = plot_finish_reasons(report["finish_reasons"], folder / "finish_reasons.png")
    if report["per_server"]:
        written["per_server"] = plot_per_server(report["per_server"], folder / "per_server.png")
    return written


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
