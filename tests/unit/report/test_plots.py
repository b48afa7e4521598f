"""The report's plots drawn from report.json's plain data: what each figure shows, read back from the figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import pytest
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from fleetgen.report import plots
from fleetgen.report.plots import (SIMULATED_MARK, plot_finish_reasons, plot_gpus, plot_occupancy,
                                   plot_output_tokens, plot_per_server, plot_throughput_over_time, write_plots)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def drawn(monkeypatch):
    """Every figure saved, with the arguments of its savefig; no PNG is encoded (the slow part)."""
    figures: list[tuple[Figure, dict]] = []

    def savefig(figure, path, **options):
        figures.append((figure, options))

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def color(artist) -> str:
    return matplotlib.colors.to_hex(artist.get_color() if hasattr(artist, "get_color") else artist.get_facecolor())


def legend_texts(axes) -> list[str]:
    return [text.get_text() for text in axes.get_legend().get_texts()]


def test_throughput_over_time_in_minutes_per_server_and_overall(tmp_path, drawn):
    timeline = {"bucket_seconds": 30.0, "overall": [10.0, 20.0, 30.0],
                "per_server": {"b:1": [4.0, 8.0, 12.0], "a:1": [6.0, 12.0, 18.0]}}
    assert plot_throughput_over_time(timeline, tmp_path / "t.png") == "t.png"
    [(figure, options)] = drawn
    assert options == {"format": "png", "dpi": 100} and tuple(figure.get_size_inches()) == (9, 4.5)
    [axes] = figure.axes
    overall, first, second = axes.get_lines()
    assert list(overall.get_xdata()) == [0.0, 0.5, 1.0] and list(overall.get_ydata()) == [10.0, 20.0, 30.0]
    assert (color(overall), overall.get_linewidth(), overall.get_label()) == ("#000000", 2, "all servers")
    assert (first.get_label(), list(first.get_ydata()), first.get_linewidth(), first.get_alpha()) == (
        "a:1", [6.0, 12.0, 18.0], 1, 0.8)
    assert second.get_label() == "b:1" and list(second.get_xdata()) == [0.0, 0.5, 1.0]
    assert axes.get_xlabel() == "minutes since the first request started (30 s buckets)"
    assert (axes.get_ylabel(), axes.get_title()) == ("completion tokens / s", "Throughput over time")
    assert legend_texts(axes) == ["all servers", "a:1", "b:1"] and axes.get_legend()._ncols == 2
    assert axes.xaxis.get_gridlines()[0].get_visible() and axes.xaxis.get_gridlines()[0].get_alpha() == 0.3
    assert SIMULATED_MARK not in [text.get_text() for text in figure.texts]


def test_every_plot_of_simulated_servers_carries_the_mark(tmp_path, drawn):
    timeline = {"bucket_seconds": 1.0, "overall": [1.0], "per_server": {}}
    plot_throughput_over_time(timeline, tmp_path / "t.png", simulated=True)
    [(figure, _)] = drawn
    [mark] = figure.texts
    assert mark.get_text() == "SIMULATED servers: not GPU measurements"
    assert (mark.get_position(), mark.get_ha(), mark.get_va(), mark.get_fontsize()) == ((0.995, 0.005), "right",
                                                                                         "bottom", 9)
    assert (color(mark), mark.get_fontweight()) == ("#b00020", "bold")


def test_the_output_tokens_histogram_marks_max_tokens(tmp_path, drawn):
    histogram = {"edges": [0.0, 10.0, 30.0, 60.0], "counts": [5, 3, 1], "max_tokens": 60}
    assert plot_output_tokens(histogram, tmp_path / "o.png") == "o.png"
    [(figure, _)] = drawn
    [axes] = figure.axes
    bars = axes.patches
    assert [bar.get_x() for bar in bars] == [0.0, 10.0, 30.0] and [bar.get_width() for bar in bars] == [10, 20, 30]
    assert [bar.get_height() for bar in bars] == [5, 3, 1] and color(bars[0]) == "#4472c4"
    assert matplotlib.colors.to_hex(bars[0].get_edgecolor()) == "#ffffff"
    [line] = axes.get_lines()
    assert list(line.get_xdata()) == [60, 60] and color(line) == "#c00000" and line.get_linestyle() == "--"
    assert legend_texts(axes) == ["max_tokens 60"]
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == ("completion tokens", "completions",
                                                                         "Output tokens per completion")
    assert axes.yaxis.get_gridlines()[0].get_visible() and not axes.xaxis.get_gridlines()[0].get_visible()
    drawn.clear()
    plot_output_tokens({**histogram, "max_tokens": None}, tmp_path / "o2.png")
    [(figure, _)] = drawn
    assert figure.axes[0].get_lines() == [] and figure.axes[0].get_legend() is None


def test_finish_reasons_most_frequent_first_with_their_counts(tmp_path, drawn):
    assert plot_finish_reasons({"length": 3, "stop": 90, "abort": 1}, tmp_path / "f.png") == "f.png"
    [(figure, _)] = drawn
    assert tuple(figure.get_size_inches()) == (6, 4)
    [axes] = figure.axes
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["stop", "length", "abort"]
    assert [bar.get_height() for bar in axes.patches] == [90, 3, 1] and color(axes.patches[0]) == "#70ad47"
    assert [text.get_text() for text in axes.texts] == ["90", "3", "1"]
    assert (axes.get_ylabel(), axes.get_title()) == ("completions", "Finish reasons")


def test_throughput_per_server_as_sorted_horizontal_bars(tmp_path, drawn):
    per_server = {"b:1": {"tokens_per_s": 1500.4}, "a:1": {"tokens_per_s": 2500.6}}
    assert plot_per_server(per_server, tmp_path / "p.png") == "p.png"
    [(figure, _)] = drawn
    [axes] = figure.axes
    assert [tick.get_text() for tick in axes.get_yticklabels()] == ["a:1", "b:1"]
    assert [bar.get_width() for bar in axes.patches] == [2500.6, 1500.4] and color(axes.patches[0]) == "#4472c4"
    assert [text.get_text() for text in axes.texts] == ["2501", "1500"]
    assert axes.yaxis_inverted()  # the first server on top
    assert (axes.get_xlabel(), axes.get_title()) == ("completion tokens / s", "Throughput per server")
    assert axes.xaxis.get_gridlines()[0].get_visible() and not axes.yaxis.get_gridlines()[0].get_visible()


def occupancy_data(fleet=0.45) -> dict:
    return {"bucket_seconds": 30.0, "low_threshold": 0.5, "fleet_occupancy": fleet, "per_server": {
        "b:1": {"cap": 40, "series": {"bucket": [0, 2], "running": [20.0, 40.0], "token_usage": [0.5, 0.9]}},
        "a:1": {"cap": 0, "series": {"bucket": [1], "running": [7.0], "token_usage": []}}}}


def test_occupancy_is_running_over_each_servers_cap_over_time(tmp_path, drawn):
    assert plot_occupancy(occupancy_data(), tmp_path / "o.png") == "o.png"
    [(figure, _)] = drawn
    assert tuple(figure.get_size_inches()) == (9, 7)
    top, bottom = figure.axes
    no_cap, capped, full, low = top.get_lines()
    assert no_cap.get_label() == "a:1 (cap 0)" and list(no_cap.get_ydata()) == [7.0]  # no cap: running as is
    assert list(no_cap.get_xdata()) == [0.5] and no_cap.get_linewidth() == 1
    assert capped.get_label() == "b:1 (cap 40)" and list(capped.get_ydata()) == [0.5, 1.0]
    assert list(capped.get_xdata()) == [0.0, 1.0]
    assert list(full.get_ydata()) == [1.0, 1.0] and full.get_label() == "effective cap" and color(full) == "#000000"
    assert full.get_linestyle() == "--" and full.get_linewidth() == 1
    assert list(low.get_ydata()) == [0.5, 0.5] and low.get_label() == "called out below"
    assert (color(low), low.get_linestyle(), low.get_linewidth()) == ("#c00000", ":", 1)
    [usage] = bottom.get_lines()  # a server without token_usage draws nothing there
    assert usage.get_label() == "b:1" and list(usage.get_ydata()) == [0.5, 0.9] and usage.get_linewidth() == 1
    assert (top.get_ylabel(), top.get_ylim(), top.get_title()) == ("running / effective cap", (0, 1.1),
                                                                   "Occupancy (fleet 45%)")
    assert legend_texts(top) == ["a:1 (cap 0)", "b:1 (cap 40)", "effective cap", "called out below"]
    assert top.get_legend()._ncols == 2
    assert (bottom.get_ylabel(), bottom.get_ylim()) == ("KV token usage", (0, 1.05))
    assert bottom.get_xlabel() == "minutes since the first sample (30 s buckets)"
    assert top.xaxis.get_gridlines()[0].get_visible() and bottom.yaxis.get_gridlines()[0].get_visible()
    assert top.get_shared_x_axes().joined(top, bottom)
    drawn.clear()
    plot_occupancy(occupancy_data(fleet=None), tmp_path / "o2.png", simulated=True)
    [(figure, _)] = drawn
    assert figure.axes[0].get_title() == "Occupancy" and [t.get_text() for t in figure.texts] == [SIMULATED_MARK]


def test_gpus_utilisation_and_power_over_time(tmp_path, drawn):
    gpus = {"bucket_seconds": 120.0, "per_gpu": {
        "n2:gpu0": {"series": {"bucket": [0, 1], "util": [90.0, None], "power_w": [700.0, 650.0]}},
        "n1:gpu1": {"series": {"bucket": [3], "util": [50.0], "power_w": [300.0]}}}}
    assert plot_gpus(gpus, tmp_path / "g.png") == "g.png"
    [(figure, _)] = drawn
    assert tuple(figure.get_size_inches()) == (9, 7)
    top, bottom = figure.axes
    first, second = top.get_lines()
    assert first.get_label() == "n1:gpu1" and list(first.get_xdata()) == [6.0] and list(first.get_ydata()) == [50.0]
    assert second.get_label() == "n2:gpu0" and list(second.get_xdata()) == [0.0, 2.0] and first.get_linewidth() == 1
    power_first, power_second = bottom.get_lines()
    assert list(power_first.get_ydata()) == [300.0] and list(power_second.get_ydata()) == [700.0, 650.0]
    assert power_first.get_label() == "n1:gpu1" and power_first.get_linewidth() == 1
    assert (top.get_ylabel(), top.get_ylim(), top.get_title()) == ("utilization.gpu %", (0, 105), "GPUs (nvidia-smi)")
    assert legend_texts(top) == ["n1:gpu1", "n2:gpu0"] and top.get_legend()._ncols == 2
    assert (bottom.get_ylabel(), bottom.get_xlabel()) == ("power.draw W", "minutes since the first sample (120 s buckets)")
    assert top.xaxis.get_gridlines()[0].get_visible() and bottom.xaxis.get_gridlines()[0].get_visible()
    assert top.get_shared_x_axes().joined(top, bottom)


def full_report(simulated=None) -> dict:
    report = {"timeline": {"bucket_seconds": 1.0, "overall": [1.0, 2.0], "per_server": {"a:1": [1.0, 2.0]}},
              "completion_tokens": {"histogram": {"edges": [0.0, 1.0], "counts": [3], "max_tokens": None}},
              "finish_reasons": {"stop": 3}, "occupancy": occupancy_data(), "per_server": {"a:1": {"tokens_per_s": 1}},
              "gpus": {"bucket_seconds": 1.0, "per_gpu": {"n:gpu0": {"series": {"bucket": [0], "util": [1.0],
                                                                                  "power_w": [2.0]}}}}}
    if simulated is not None:
        report["simulated"] = simulated
    return report


def test_write_plots_draws_each_plot_the_report_has_data_for(tmp_path, drawn):
    written = write_plots(full_report(), tmp_path)
    assert written == {"throughput_over_time": "throughput_over_time.png", "output_tokens": "output_tokens.png",
                       "finish_reasons": "finish_reasons.png", "occupancy": "occupancy.png", "gpus": "gpus.png",
                       "per_server": "per_server.png"}
    assert all(figure.texts == [] for figure, _ in drawn)
    titles = [figure.axes[0].get_title() for figure, _ in drawn]
    assert titles == ["Throughput over time", "Output tokens per completion", "Finish reasons",
                      "Occupancy (fleet 45%)", "GPUs (nvidia-smi)", "Throughput per server"]


def test_the_plots_are_png_files_named_as_the_report_says(tmp_path):
    written = write_plots(full_report(), tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(written.values())
    for name in written.values():
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


def test_write_plots_marks_every_plot_of_a_simulated_run(tmp_path, drawn):
    write_plots(full_report(simulated=True), tmp_path)
    assert len(drawn) == 6 and all([t.get_text() for t in figure.texts] == [SIMULATED_MARK] for figure, _ in drawn)


def test_write_plots_skips_what_the_report_has_no_data_for(tmp_path, drawn):
    empty = {"timeline": {"overall": []}, "completion_tokens": {"histogram": {"counts": []}}, "finish_reasons": {},
             "per_server": {}, "occupancy": None}
    assert write_plots(empty, tmp_path) == {} and drawn == [] and list(tmp_path.iterdir()) == []


def test_figures_are_laid_out_before_saving(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(Figure, "tight_layout", lambda figure, *a, **k: calls.append("layout"))
    monkeypatch.setattr(Figure, "savefig", lambda figure, *a, **k: calls.append("save"))
    plot_finish_reasons({"stop": 1}, tmp_path / "f.png")
    assert calls == ["layout", "save"]


def test_only_the_named_functions_are_exported():
    assert plots.__all__ == ["plot_throughput_over_time", "plot_output_tokens", "plot_finish_reasons",
                             "plot_per_server", "plot_occupancy", "plot_gpus", "write_plots"]


SMALL_POINTS = FontProperties(size="small").get_size_in_points()
X_SMALL_POINTS = FontProperties(size="x-small").get_size_in_points()
HISTOGRAM = {"edges": [0.0, 10.0], "counts": [1], "max_tokens": 10}


def draw_each_plot(tmp_path: Path) -> None:
    """Every plot once, called without ``simulated``, in the order of write_plots' report."""
    plot_throughput_over_time({"bucket_seconds": 1.0, "overall": [1.0], "per_server": {"a:1": [1.0]}},
                              tmp_path / "t.png")
    plot_output_tokens(HISTOGRAM, tmp_path / "o.png")
    plot_finish_reasons({"stop": 1}, tmp_path / "f.png")
    plot_per_server({"a:1": {"tokens_per_s": 1.0}}, tmp_path / "p.png")
    plot_occupancy(occupancy_data(), tmp_path / "occ.png")
    plot_gpus({"bucket_seconds": 60.0, "per_gpu": {"n:gpu0": {"series": {"bucket": [2], "util": [1.0],
                                                                         "power_w": [2.0]}}}}, tmp_path / "g.png")


def test_a_plot_called_without_simulated_carries_no_mark(tmp_path, drawn):
    draw_each_plot(tmp_path)
    assert [figure.texts for figure, _ in drawn] == [[]] * 6


def test_the_histogram_and_the_per_server_plot_have_the_reports_wide_size(tmp_path, drawn):
    draw_each_plot(tmp_path)
    assert [tuple(figure.get_size_inches()) for figure, _ in drawn] == [(9, 4.5), (9, 4.5), (6, 4), (9, 4.5),
                                                                        (9, 7), (9, 7)]


def test_finish_reasons_are_ordered_by_count_not_by_name(tmp_path, drawn):
    plot_finish_reasons({"length": 3, "stop": 90, "abort": 5}, tmp_path / "f.png")
    [axes] = drawn[0][0].axes
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["stop", "abort", "length"]


def test_a_million_completions_are_counted_in_full_on_their_bar(tmp_path, drawn):
    plot_finish_reasons({"stop": 1_500_000, "length": 2}, tmp_path / "f.png")
    [axes] = drawn[0][0].axes
    assert [text.get_text() for text in axes.texts] == ["1500000", "2"]


def test_legends_and_bar_labels_are_small_and_the_crowded_legends_smaller(tmp_path, drawn):
    draw_each_plot(tmp_path)
    throughput, histogram, reasons, per_server, occupancy, gpus = (figure.axes[0] for figure, _ in drawn)
    for axes, size in ((throughput, SMALL_POINTS), (histogram, SMALL_POINTS), (occupancy, X_SMALL_POINTS),
                       (gpus, X_SMALL_POINTS)):
        assert {text.get_fontsize() for text in axes.get_legend().get_texts()} == {size}, axes.get_title()
    assert [text.get_fontsize() for text in reasons.texts + per_server.texts] == [SMALL_POINTS, SMALL_POINTS]


def test_every_grid_is_faint(tmp_path, drawn):
    draw_each_plot(tmp_path)
    throughput, histogram, _, per_server, occupancy, gpus = (figure.axes for figure, _ in drawn)
    shown = [histogram[0].yaxis, per_server[0].xaxis, *(axes.xaxis for axes in occupancy + gpus)]
    assert [axis.get_gridlines()[0].get_alpha() for axis in shown] == [0.3] * 6


def test_kv_usage_and_power_are_drawn_against_minutes(tmp_path, drawn):
    draw_each_plot(tmp_path)
    plot_occupancy({**occupancy_data(), "bucket_seconds": 60.0, "per_server": {"a:1": {"cap": 4, "series": {
        "bucket": [1, 3], "running": [1.0, 2.0], "token_usage": [0.1, 0.2]}}}}, tmp_path / "o2.png")
    gpus, occupancy = (figure.axes[1] for figure, _ in drawn[5:])
    assert list(occupancy.get_lines()[0].get_xdata()) == [1.0, 3.0]  # buckets 1 and 3 of 60 s
    assert list(gpus.get_lines()[0].get_xdata()) == [2.0]  # bucket 2 of 60 s


def test_a_server_without_a_rate_gets_no_bar_and_no_figure_instead_of_failing_the_plot(tmp_path, drawn):
    # every completion of the server finished in one instant: build.py gives it tokens_per_s None
    plot_per_server({"a:1": {"tokens_per_s": None}, "b:1": {"tokens_per_s": 10.4}}, tmp_path / "p.png")
    [axes] = drawn[0][0].axes
    assert [bar.get_width() for bar in axes.patches] == [0.0, 10.4]
    assert [text.get_text() for text in axes.texts] == ["", "10"]
