"""What a server says about itself on ``/metrics`` (SGLang's Prometheus metrics, ``--enable-metrics``).

The names are SGLang 0.5.23's (``sglang/srt/observability/metrics_collector.py``); docs/output-formats.md
describes the sample rows this module writes. The scheduler reports one series per data-parallel rank
(label ``dp_rank``): running and queued requests add up over the ranks, usages and accept length are
averaged. The tokenizer's counters (one series per ``is_streaming`` label) add up too. A sample keeps only
what the report and the tuning trial read, so a night of samples stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleetgen.errors import ServerError

METRICS_PATH = "/metrics"
RUNNING = "sglang:num_running_reqs"
QUEUE = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
GEN_THROUGHPUT = "sglang:gen_throughput"
ACCEPT_LENGTH = "sglang:spec_accept_length"
MAMBA_USAGE = "sglang:mamba_usage"
# Counters since the server started (TokenizerMetricsCollector): SGLang adds a request's output tokens and
# the request itself when it finishes (tokenizer_manager.py, observe_one_finished_request), so they step at
# completions; fleetgen.tuning.trial measures output tokens/s from their increase.
GENERATION_TOKENS = "sglang:generation_tokens_total"
REQUESTS = "sglang:num_requests_total"
# metric -> how its per-rank series combine into one value for the server
_SUMMED = (RUNNING, QUEUE, GEN_THROUGHPUT, GENERATION_TOKENS, REQUESTS)
_AVERAGED = (TOKEN_USAGE, ACCEPT_LENGTH, MAMBA_USAGE)
# SGLang registers the accept-length gauge on every server and leaves it at 0 without speculative decoding (and
# before the first decode step): a 0 is no acceptance length (sglang/srt/observability/metrics_collector.py).
_ZERO_IS_ABSENT = (ACCEPT_LENGTH,)
# field of a sample row -> metric
SAMPLE_FIELDS = {"running": RUNNING, "queue": QUEUE, "token_usage": TOKEN_USAGE, "gen_throughput": GEN_THROUGHPUT,
                 "accept_length": ACCEPT_LENGTH, "mamba_usage": MAMBA_USAGE,
                 "generation_tokens": GENERATION_TOKENS, "requests": REQUESTS}


@dataclass(frozen=True)
class MetricsSample:
    """One scrape of one server, combined over its DP ranks; None where the server does not report it."""

    running: float | None
    queue: float | None
    token_usage: float | None
    gen_throughput: float | None
    accept_length: float | None
    mamba_usage: float | None
    generation_tokens: float | None = None  # output tokens of the requests finished since the server started
    requests: float | None = None           # requests finished since the server started

    def row(self, *, at: float, server: str, cap: int) -> dict:
        """The compact JSONL row (docs/output-formats.md): absent metrics are left out."""
        row = {"t": round(at, 3), "server": server, "cap": cap}
        for field in SAMPLE_FIELDS:
            value = getattr(self, field)
            if value is not None:
                row[field] = round(value, 4)
        return row


def parse_metrics(text: str, *, server: str) -> MetricsSample:
    """A ``/metrics`` page in the Prometheus text format -> one sample; ServerError naming the server when
    the page is not Prometheus text or lacks ``sglang:num_running_reqs`` (metrics off, or not SGLang)."""
    by_metric: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _ZERO_IS_ABSENT and float(sample.value) == 0:
                    continue
                if sample.name in _SUMMED or sample.name in _AVERAGED:
                    by_metric.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise ServerError(f"{METRICS_PATH} is not in the Prometheus text format: {exc}", server=server,
                          hint="point the fleet at SGLang servers") from None
    if RUNNING not in by_metric:
        raise ServerError(f"{METRICS_PATH} has no {RUNNING}", server=server,
                          hint="fleetgen launches servers with --enable-metrics; a server started by hand lacks it")

    def combined(name: str) -> float | None:
        values = by_metric.get(name)
        if not values:
            return None
        return sum(values) if name in _SUMMED else sum(values) / len(values)

    return MetricsSample(running=combined(RUNNING), queue=combined(QUEUE), token_usage=combined(TOKEN_USAGE),
                         gen_throughput=combined(GEN_THROUGHPUT), accept_length=combined(ACCEPT_LENGTH),
                         mamba_usage=combined(MAMBA_USAGE), generation_tokens=combined(GENERATION_TOKENS),
                         requests=combined(REQUESTS))
