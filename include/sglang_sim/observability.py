"""What a router or monitor reads from a running server: ``GET /v1/loads`` and ``GET /metrics``.

``/v1/loads`` follows ``entrypoints/v1_loads.py`` and ``managers/load_snapshot.py::LoadSnapshot`` (the core
scalars, then the ``memory``, ``speculative`` and ``queues`` sections; ``include`` picks sections,
``dp_rank`` filters, ``format=prometheus`` gives SGLang's gauge text). ``/metrics`` (with
``--enable-metrics``) serves, in Prometheus text format, the scheduler gauges and tokenizer counters of
``observability/metrics_collector.py`` that the simulated scheduler can derive, with SGLang's names, help
texts and labels.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
_SECTION_PREFIX = {"speculative": "spec", "disaggregation": "disagg"}
GB = 1 << 30


class LoadsError(ValueError):
    """An ``include`` SGLang rejects (HTTP 400)."""


def load_snapshot(service, engine, dp_rank: int, include: set[str] | None) -> dict:
    """One DP rank's ``LoadSnapshot.to_dict(include)``."""
    plan, graphs = service.plan, service.graphs
    used = engine.used_tokens
    total = used + engine.waiting_prompt_tokens
    capacity = plan.max_total_num_tokens
    core = {"timestamp": service.clock_time(), "dp_rank": dp_rank, "num_running_reqs": engine.running,
            "num_waiting_reqs": engine.waiting, "num_waiting_uncached_tokens": engine.waiting_prompt_tokens,
            "num_used_tokens": used, "num_total_tokens": total, "num_active_tokens": total,
            "num_prealloc_ready_tokens": 0, "max_total_num_tokens": capacity,
            "max_running_requests": plan.max_running_requests, "token_usage": round(used / capacity, 4),
            "gen_throughput": round(engine.throughput(), 2), "cache_hit_rate": 0.0,
            "utilization": round(engine.running / max(1, plan.max_running_requests), 4),
            "total_prefill_uncached_tokens": engine.stats.prompt_tokens,
            "total_prefill_busy_us": int(engine.stats.prefill_busy_us),
            # Scheduler.decode_moment_totals: null until the first decode step
            "decode_moments": [round(v, 3) for v in engine.stats.decode_moments]
            if engine.stats.decode_moments[0] > 0 else None}
    if include is not None and "all" not in include:
        if not include <= LOAD_SECTIONS:
            raise LoadsError(f"Invalid include sections: {include - LOAD_SECTIONS}. "
                             f"Valid options: {sorted(LOAD_SECTIONS)}")
        if include == {"core"}:
            return core
    wanted = include is None or "all" in include
    sections = {"memory": ("memory", {"weight_gb": round(service.weights_bytes / service.launch.tp / GB, 3),
                                      "kv_cache_gb": round(plan.kv_bytes / GB, 3),
                                      "graph_gb": round(graphs.total_bytes / GB, 3), "token_capacity": capacity}),
                # sent by every server, "null" outside PD disaggregation (scheduler_components/load_inquirer.py)
                "disaggregation": ("disagg", {"mode": "null", "prefill_bootstrap_queue_reqs": 0,
                                              "prefill_inflight_queue_reqs": 0, "decode_prealloc_queue_reqs": 0,
                                              "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                                              "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}),
                "queues": ("queues", {"waiting": engine.waiting, "grammar": 0, "paused": 0, "retracted": 0,
                                      "prealloc_ready": 0})}
    if service.launch.spec_algorithm and engine.stats.finished:
        accept = service.timing.accept_length
        sections["speculative"] = ("spec", {"accept_length": accept,
                                            "accept_rate": (accept - 1) / max(1, service.launch.spec_steps)})
    for field in ("memory", "speculative", "disaggregation", "queues"):
        if field in sections and (wanted or sections[field][0] in include):
            core[field] = sections[field][1]
    return core


def loads_body(service, *, dp_rank: int | None, include: set[str] | None) -> dict:
    """The JSON of ``GET /v1/loads``."""
    loads = [load_snapshot(service, engine, rank, include) for rank, engine in enumerate(service.engines)
             if dp_rank is None or rank == dp_rank]
    return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": service.version,
            "accelerator": service.gpu_name, "num_accelerators": service.launch.tp * service.launch.pp,
            "loads": loads}


def loads_prometheus(loads: list[dict]) -> str:
    """``v1_loads._format_loads_prometheus``: one gauge per numeric field, labelled by dp_rank."""
    samples: dict[str, list] = {}
    for load in loads:
        load = dict(load)
        rank = load.pop("dp_rank")
        for key, value in load.items():
            if isinstance(value, dict):
                prefix = _SECTION_PREFIX.get(key, key)
                for sub_key, sub_value in value.items():
                    if isinstance(sub_value, (int, float)):
                        samples.setdefault(f"sglang_{prefix}_{sub_key}", []).append((rank, sub_value))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
    return "\n".join(lines) + "\n"


def _labels(values: dict) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in values.items()) + "}"


def metrics_text(service) -> str:
    """``GET /metrics``: SGLang's scheduler gauges and counters (one series for TP rank 0 of the server,
    summed over DP workers) and the tokenizer's request and token counters.

    SGLang registers every scheduler gauge whatever the model, so a dense server reports ``sglang:mamba_usage``
    0 and one without speculative decoding ``sglang:spec_accept_length`` 0. Labelled counters have no sample
    until their first increment (prometheus_client), so the retraction counters appear with the first
    retraction."""
    scheduler = {"model_name": service.served_model_name, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
                 "moe_ep_rank": 0}
    engines = service.engines
    counters = service.scheduler_counters()
    accept = service.timing.accept_length if service.launch.spec_algorithm else 0.0
    gauges = [("sglang:num_running_reqs", "The number of running requests.", sum(e.running for e in engines)),
              ("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
               sum(e.waiting for e in engines)),
              ("sglang:num_used_tokens", "The number of used tokens.", counters["num_used_tokens"]),
              ("sglang:token_usage", "The token usage.", counters["token_usage"]),
              ("sglang:full_token_usage", "The token usage for full attention layers.", counters["full_token_usage"]),
              ("sglang:gen_throughput", "The generation throughput (token/s).", sum(e.throughput() for e in engines)),
              ("sglang:new_token_ratio", "The new token ratio.", counters["new_token_ratio"]),
              ("sglang:mamba_usage", "The token usage for Mamba layers.", counters["mamba_usage"]),
              ("sglang:spec_accept_length", "Mean acceptance length of speculative decoding (accepted "
               "drafts + bonus token per forward).", accept)]
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{_labels(scheduler)} {float(value)}"]
    # a gauge of prometheus_client's multiprocess mode "all": one series per process, labelled with its pid
    retracted = "sglang:num_retracted_reqs"
    lines += [f"# HELP {retracted} The number of retracted requests.", f"# TYPE {retracted} gauge",
              f"{retracted}{_labels({**scheduler, 'pid': os.getpid()})} {float(counters['num_retracted_reqs'])}"]
    if counters["num_retracted_requests_total"]:
        retractions = [("sglang:num_retracted_requests", "Total number of retracted requests.",
                        counters["num_retracted_requests_total"]),
                       ("sglang:num_retracted_input_tokens", "Total number of retracted input tokens.",
                        counters["num_retracted_input_tokens_total"]),
                       ("sglang:num_retracted_output_tokens", "Total number of retracted output tokens.",
                        counters["num_retracted_output_tokens_total"])]
        lines += _counters(retractions, scheduler)
    tokenizer = {"model_name": service.served_model_name, "engine_type": "unified", "is_streaming": "false"}
    lines += _counters([("sglang:prompt_tokens", "Number of prefill tokens processed.",
                         sum(e.stats.prompt_tokens for e in engines)),
                        ("sglang:generation_tokens", "Number of generation tokens processed.",
                         sum(e.stats.generated_tokens for e in engines)),
                        ("sglang:num_requests", "Number of requests processed.",
                         sum(e.stats.finished for e in engines))], tokenizer)
    return "\n".join(lines) + "\n"


def _counters(rows: list[tuple[str, str, float]], labels: dict) -> list[str]:
    """Counters as prometheus_client writes them: HELP and TYPE on the ``_total`` name."""
    lines = []
    for name, help_text, value in rows:
        lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter",
                  f"{name}_total{_labels(labels)} {float(value)}"]
    return lines
