"""A server's /metrics page -> one sample (generate/server_metrics.py)."""

import pytest

from fleetgen.errors import ServerError
from fleetgen.generate.server_metrics import SAMPLE_FIELDS, MetricsSample, parse_metrics


def page(**series: list[float]) -> str:
    """A Prometheus page with one gauge series per DP rank for each ``sglang:<name>``."""
    lines = []
    for name, values in series.items():
        lines += [f"# HELP sglang:{name} x.", f"# TYPE sglang:{name} gauge"]
        lines += [f'sglang:{name}{{dp_rank="{rank}",model_name="m"}} {value}' for rank, value in enumerate(values)]
    return "\n".join(lines) + "\n"


def test_with_three_ranks_counts_add_up_and_usages_average():
    sample = parse_metrics(page(num_running_reqs=[5, 7, 0], num_queue_reqs=[1, 0, 2], gen_throughput=[100, 50, 25],
                                token_usage=[0.5, 0.25, 0.0], mamba_usage=[0.1, 0.2, 0.6],
                                spec_accept_length=[2.0, 3.0, 4.0]), server="n:1")
    assert sample == MetricsSample(running=12.0, queue=3.0, token_usage=pytest.approx(0.25),
                                   gen_throughput=175.0, accept_length=pytest.approx(3.0),
                                   mamba_usage=pytest.approx(0.3))


def test_one_rank_reads_as_itself():
    sample = parse_metrics(page(num_running_reqs=[0], token_usage=[0.0], gen_throughput=[0]), server="n:1")
    assert (sample.running, sample.token_usage, sample.gen_throughput) == (0.0, 0.0, 0.0)  # zero is not absent
    assert sample.queue is None and sample.mamba_usage is None and sample.accept_length is None


def test_a_zero_accept_length_is_left_out_of_the_average_and_only_accept_length_is():
    sample = parse_metrics(page(num_running_reqs=[0, 4], mamba_usage=[0.0, 0.4], spec_accept_length=[0.0, 3.5]),
                           server="n:1")
    assert sample.accept_length == 3.5 and sample.mamba_usage == pytest.approx(0.2) and sample.running == 4


def counter(name: str, values: dict[str, float]) -> str:
    """A counter as prometheus_client writes it: HELP and TYPE on the ``_total`` name, one series per label value,
    and the ``_created`` sample beside each."""
    lines = [f"# HELP sglang:{name}_total x.", f"# TYPE sglang:{name}_total counter"]
    for streaming, value in values.items():
        labels = f'{{is_streaming="{streaming}",model_name="m"}}'
        lines += [f"sglang:{name}_total{labels} {value}", f"sglang:{name}_created{labels} 1.7645e+09"]
    return "\n".join(lines) + "\n"


def test_the_output_token_and_request_counters_add_up_over_their_series():
    text = page(num_running_reqs=[2]) + counter("generation_tokens", {"false": 90000.0, "true": 1234.0}) \
        + counter("num_requests", {"false": 88.0, "true": 2.0})
    sample = parse_metrics(text, server="n:1")
    assert (sample.generation_tokens, sample.requests) == (91234.0, 90.0)  # the _created samples are not counts
    row = sample.row(at=1.0, server="n:1", cap=4)
    assert (row["generation_tokens"], row["requests"]) == (91234.0, 90.0)


def test_a_server_without_the_counters_reads_none():
    sample = parse_metrics(page(num_running_reqs=[1]), server="n:1")
    assert sample.generation_tokens is None and sample.requests is None
    assert "generation_tokens" not in sample.row(at=0.0, server="n:1", cap=1)


def test_other_metrics_and_counters_are_ignored():
    text = page(num_running_reqs=[2]) + ("# TYPE sglang:prompt_tokens counter\nsglang:prompt_tokens_total 99.0\n"
                                          "# TYPE other gauge\nother 5\n")
    assert parse_metrics(text, server="n:1") == MetricsSample(2.0, None, None, None, None, None)


def test_a_page_without_running_requests_names_the_server_and_the_fix():
    with pytest.raises(ServerError) as caught:
        parse_metrics(page(token_usage=[0.5]), server="n:30000")
    text = str(caught.value)
    assert "/metrics has no sglang:num_running_reqs" in text and "n:30000" in text
    assert caught.value.hint == "fleetgen launches servers with --enable-metrics; a server started by hand lacks it"


@pytest.mark.parametrize("text", ["<html>Not Found</html>", "sglang:num_running_reqs{dp_rank=\"0\" 3\n",
                                  "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs abc\n"])
def test_a_page_that_is_not_prometheus_text_is_a_server_error(text):
    with pytest.raises(ServerError) as caught:
        parse_metrics(text, server="n:30000")
    assert "is not in the Prometheus text format" in str(caught.value) and "n:30000" in str(caught.value)
    assert caught.value.hint == "point the fleet at SGLang servers"


def test_a_row_keeps_what_the_server_reports_rounded_and_leaves_out_the_rest():
    sample = MetricsSample(running=3.0, queue=None, token_usage=0.123456, gen_throughput=1234.56789,
                           accept_length=None, mamba_usage=0.0)
    row = sample.row(at=1764500000.12345, server="n:1", cap=48)
    assert row == {"t": 1764500000.123, "server": "n:1", "cap": 48, "running": 3.0, "token_usage": 0.1235,
                   "gen_throughput": 1234.5679, "mamba_usage": 0.0}
    assert list(row)[:3] == ["t", "server", "cap"]


def test_every_field_of_a_full_sample_is_in_its_row():
    sample = MetricsSample(*(float(n) for n in range(1, 9)))
    row = sample.row(at=0.0, server="s", cap=1)
    assert {field: row[field] for field in SAMPLE_FIELDS} == {"running": 1.0, "queue": 2.0, "token_usage": 3.0,
                                                              "gen_throughput": 4.0, "accept_length": 5.0,
                                                              "mamba_usage": 6.0, "generation_tokens": 7.0,
                                                              "requests": 8.0}
