"""The run report's PNG plots (matplotlib, Agg canvas).

``build.py`` computes the figures; this module only draws them, from the plain data that
``report.json`` holds, so they can be redrawn from the JSON alone (``markdown.py`` writes the text).

``matplotlib.figure.Figure`` is used directly (no ``pyplot``): no global figure state, no GUI
backend, safe in an Airflow worker and in threads.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

__all__ = ["plot_throughput_over_time", "plot_output_tokens", "plot_finish_reasons", "plot_per_server",
           "plot_occupancy", "plot_gpus", "write_plots"]

_SIZE = (9, 4.5)
_DPI = 100


SIMULATED_MARK = "SIMULATED servers: not GPU measurements"


def _save(figure: Figure, path: Path, simulated: bool = False) -> str:
    figure.tight_layout()
    if simulated:  # a figure copied out of the report keeps saying where its numbers came from
        figure.text(0.995, 0.005, SIMULATED_MARK, ha="right", va="bottom", fontsize=9, color="#b00020",
                    fontweight="bold")
    figure.savefig(path, format="png", dpi=_DPI)
    return path.name


def plot_throughput_over_time(timeline: dict, path: Path, *, simulated: bool = False) -> str:
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
    return _save(figure, path, simulated)


def plot_output_tokens(histogram: dict, path: Path, *, simulated: bool = False) -> str:
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
    return _save(figure, path, simulated)


def plot_finish_reasons(counts: dict[str, int], path: Path, *, simulated: bool = False) -> str:
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    names = sorted(counts, key=counts.get, reverse=True)
    bars = axes.bar(names, [counts[name] for name in names], color="#70ad47")
    axes.bar_label(bars, fmt="%d", fontsize="small")
    axes.set_ylabel("completions")
    axes.set_title("Finish reasons")
    return _save(figure, path, simulated)


def plot_per_server(per_server: dict[str, dict], path: Path, *, simulated: bool = False) -> str:
    """Completion tokens/s of each server over the run's generation span (they add up to the total)."""
    figure = Figure(figsize=_SIZE)
    axes = figure.add_subplot()
    names = sorted(per_server)
    rates = [per_server[name]["tokens_per_s"] for name in names]
    # a server whose completions all finished in one instant has no rate (None): no bar, no figure, no crash
    bars = axes.barh(names, [rate or 0.0 for rate in rates], color="#4472c4")
    axes.bar_label(bars, labels=["" if rate is None else f"{rate:.0f}" for rate in rates], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("completion tokens / s")
    axes.set_title("Throughput per server")
    axes.grid(alpha=0.3, axis="x")
    return _save(figure, path, simulated)


def plot_occupancy(occupancy: dict, path: Path, simulated: bool = False) -> str:
    """Per server over time: running requests / effective cap (top), KV pool use (bottom)."""
    figure = Figure(figsize=(9, 7))
    top, bottom = figure.subplots(2, 1, sharex=True)
    width = occupancy["bucket_seconds"]
    for server, row in sorted(occupancy["per_server"].items()):
        series = row["series"]
        minutes = [bucket * width / 60 for bucket in series["bucket"]]
        top.plot(minutes, [value / row["cap"] for value in series["running"]] if row["cap"] else series["running"],
                 linewidth=1, label=f"{server} (cap {row['cap']})")
        if series["token_usage"]:
            bottom.plot(minutes, series["token_usage"], linewidth=1, label=server)
    top.axhline(1.0, color="black", linestyle="--", linewidth=1, label="effective cap")
    top.axhline(occupancy["low_threshold"], color="#c00000", linestyle=":", linewidth=1, label="called out below")
    top.set_ylabel("running / effective cap")
    top.set_ylim(0, 1.1)
    fleet = occupancy["fleet_occupancy"]
    top.set_title(f"Occupancy (fleet {fleet:.0%})" if fleet is not None else "Occupancy")
    top.grid(alpha=0.3)
    top.legend(fontsize="x-small", ncol=2)
    bottom.set_ylabel("KV token usage")
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel(f"minutes since the first sample ({width:g} s buckets)")
    bottom.grid(alpha=0.3)
    return _save(figure, path, simulated)


def plot_gpus(gpus: dict, path: Path, simulated: bool = False) -> str:
    """Per GPU over time: nvidia-smi utilisation (top) and power draw (bottom)."""
    figure = Figure(figsize=(9, 7))
    top, bottom = figure.subplots(2, 1, sharex=True)
    width = gpus["bucket_seconds"]
    for name, row in sorted(gpus["per_gpu"].items()):
        minutes = [bucket * width / 60 for bucket in row["series"]["bucket"]]
        top.plot(minutes, row["series"]["util"], linewidth=1, label=name)
        bottom.plot(minutes, row["series"]["power_w"], linewidth=1, label=name)
    top.set_ylabel("utilization.gpu %")
    top.set_ylim(0, 105)
    top.set_title("GPUs (nvidia-smi)")
    top.grid(alpha=0.3)
    top.legend(fontsize="x-small", ncol=2)
    bottom.set_ylabel("power.draw W")
    bottom.set_xlabel(f"minutes since the first sample ({width:g} s buckets)")
    bottom.grid(alpha=0.3)
    return _save(figure, path, simulated)


def write_plots(report: dict, folder: Path) -> dict[str, str]:
    """Draw every plot the report has data for; return {plot name: file name in ``folder``}."""
    written: dict[str, str] = {}
    simulated = bool(report.get("simulated"))
    if report["timeline"]["overall"]:
        written["throughput_over_time"] = plot_throughput_over_time(
            report["timeline"], folder / "throughput_over_time.png", simulated=simulated)
    if report["completion_tokens"]["histogram"]["counts"]:
        written["output_tokens"] = plot_output_tokens(
            report["completion_tokens"]["histogram"], folder / "output_tokens.png", simulated=simulated)
    if report["finish_reasons"]:
        written["finish_reasons"] = plot_finish_reasons(report["finish_reasons"], folder / "finish_reasons.png",
                                                       simulated=simulated)
    if report.get("occupancy"):
        written["occupancy"] = plot_occupancy(report["occupancy"], folder / "occupancy.png", simulated=simulated)
    if report.get("gpus"):
        written["gpus"] = plot_gpus(report["gpus"], folder / "gpus.png", simulated=simulated)
    if report["per_server"]:
        written["per_server"] = plot_per_server(report["per_server"], folder / "per_server.png", simulated=simulated)
    return written
