"""The simulator's /metrics: SGLang 0.5.23's names, types and labels, in the Prometheus text format,
and values that follow the load; read back by fleetgen's parser."""

import asyncio
import random
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetgen.generate.server_metrics import parse_metrics
from sglang_sim import observability
from sglang_sim.http_app import build_app
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type", "is_streaming")

SGLANG_METRICS = (Path(__file__).resolve().parents[3] / ".sglang-venv" / "lib" / "python3.11" / "site-packages"
                  / "sglang" / "srt" / "observability" / "metrics_collector.py")
CHAT = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 4096}


# a cap on waiting for the chats to reach the scheduler; under a paused clock that state cannot pass
ARRIVAL_CAP_S = 120.0


def _scrape_while_busy(service, requests: int) -> tuple[str, str]:
    """/metrics once ``requests`` chats reached the scheduler, its clock paused so that none can finish (or
    even decode) before the scrape, then once they are all done."""
    async def main():
        loop = asyncio.get_running_loop()
        service.start_engines(loop)
        service.ready = True
        clock = service.engines[0].clock
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            clock.pause()
            chats = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(requests)]
            deadline = loop.time() + ARRIVAL_CAP_S
            while (seen := [(e.running, e.waiting) for e in service.engines]) and \
                    sum(running + waiting for running, waiting in seen) < requests:
                failed = [chat for chat in chats if chat.done()]
                assert not failed, f"a chat ended while the clock was paused: {failed[0].result()}"
                assert loop.time() < deadline, f"{requests} chats sent, (running, waiting) per engine: {seen}"
                await asyncio.sleep(0.001)
            busy = (await client.get("/metrics")).text
            clock.resume()
            await asyncio.gather(*chats)
            return busy, (await client.get("/metrics")).text

    return asyncio.run(main())


def _families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_metrics_follow_the_load_in_prometheus_text(tools):
    service = tools.make_service(tools.AFTER + ["--enable-metrics"], time_scale=50.0)
    cap = service.plan.max_running_requests  # the effective cap (the seed's mamba pool binds it)
    busy, idle = _scrape_while_busy(service, cap + 6)
    families = _families(busy)
    running = families["sglang:num_running_reqs"].samples[0]
    assert families["sglang:num_running_reqs"].type == "gauge"
    assert running.value == cap  # the rest wait
    assert families["sglang:num_queue_reqs"].samples[0].value == 6
    assert 0 < families["sglang:full_token_usage"].samples[0].value < 1  # KV
    assert families["sglang:token_usage"].samples[0].value == families["sglang:mamba_usage"].samples[0].value == 1
    assert families["sglang:spec_accept_length"].samples[0].value > 1  # NEXTN in the seed's flags
    # a hybrid model at its cap: the Mamba slots bind, and token_usage is the larger of the two usages
    assert set(running.labels) == set(SCHEDULER_LABELS)
    assert running.labels["model_name"] == "/models/qwen3.6-27b" and running.labels["tp_rank"] == "0"
    done = _families(idle)
    assert done["sglang:num_running_reqs"].samples[0].value == 0
    requests = [s for s in done["sglang:num_requests"].samples if s.name == "sglang:num_requests_total"]
    assert done["sglang:num_requests"].type == "counter" and requests[0].value == cap + 6
    assert set(requests[0].labels) == set(TOKENIZER_LABELS)
    sample = parse_metrics(busy, server="sim:30000")
    assert (sample.running, sample.queue) == (cap, 6)
    assert sample.accept_length == families["sglang:spec_accept_length"].samples[0].value
    # SGLang counts a request's output tokens when it finishes (tokenizer_manager.py): none while all are running
    assert (sample.generation_tokens, sample.requests) == (0.0, 0.0)
    tokens = [s for s in done["sglang:generation_tokens"].samples if s.name == "sglang:generation_tokens_total"]
    assert done["sglang:generation_tokens"].type == "counter" and set(tokens[0].labels) == set(TOKENIZER_LABELS)
    finished = parse_metrics(idle, server="sim:30000")
    assert finished.requests == cap + 6 and finished.generation_tokens == tokens[0].value > cap + 6


def test_metrics_are_off_without_the_flag(tools):
    async def scenario():
        service = tools.make_service(tools.AFTER)
        service.start_engines(asyncio.get_running_loop())
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            return (await client.get("/metrics")).status_code

    assert asyncio.run(scenario()) == 404


@pytest.mark.skipif(not SGLANG_METRICS.exists(), reason="SGLang 0.5.23's source (.sglang-venv) is not built")
def test_every_served_metric_has_sglangs_name_type_and_labels(tools):
    source = SGLANG_METRICS.read_text()
    declared = {name: kind for kind, name in re.findall(r'=\s*(Gauge|Counter|Histogram)\(\s*(?:#[^\n]*\n\s*)*name="(sglang:[^"]+)"',
                                                        source)}
    service = tools.make_service(tools.AFTER + ["--enable-metrics"])
    _, idle = _scrape_while_busy(service, 1)
    for family in text_string_to_metric_families(idle):
        served = family.samples[0].name if family.type == "counter" else family.name
        assert served in declared, f"{served} is not one of SGLang's metrics"
        assert declared[served].lower() == family.type, served
    # the scheduler's label set as SGLang builds it (SchedulerMetricsCollector's labels dict)
    for label in SCHEDULER_LABELS:
        assert f'"{label}":' in source
    assert re.search(r'labelnames=list\(labels.keys\(\)\) \+ \["is_streaming"\]', source)


def test_the_trials_steady_windows_measure_what_the_simulated_server_delivered(tools):
    """Requests of mixed lengths queued past the cap, /metrics read every quarter simulated second: the trial's
    windows (fleetgen.tuning.trial), warm-up and drain left out, read the output tokens/s the requests' own finish
    times give over the same span, below the pure decode speed of a full batch (admissions' prefill takes its
    share)."""
    from fleetgen.tuning.trial import score, steady_window_rates

    service = tools.make_service(tools.AFTER + ["--enable-metrics"], time_scale=25.0)
    lengths = random.Random(3)

    async def main():
        service.start_engines(asyncio.get_running_loop())
        engine = service.engines[0]
        cap = engine.capacity
        submitted = engine.clock.now()
        futures = engine.submit_many([(270, lengths.randint(300, 900), 4096) for _ in range(cap * 12)])
        rows, deadline = [], asyncio.get_running_loop().time() + ARRIVAL_CAP_S
        while not all(future.done() for future in futures):
            assert asyncio.get_running_loop().time() < deadline, \
                f"{sum(not future.done() for future in futures)} requests unfinished; last row {rows[-1:]}"
            sample = parse_metrics(observability.metrics_text(service), server="sim:1")
            rows.append(sample.row(at=engine.clock.now(), server="sim:1", cap=cap))  # simulated seconds
            await asyncio.sleep(0.01)
        finished = [(submitted + future.result().e2e_seconds, future.result().completion_tokens)
                    for future in futures]
        return rows, finished, engine.full_batch_throughput(), cap

    rows, finished, full_batch, cap = asyncio.run(main())
    rates = steady_window_rates(rows, window_s=10.0, gpus_per_server={"sim:1": 1})["sim:1"]
    judged = score("seed", rates)
    assert judged is not None and judged.windows >= 4, (len(rows), rates)
    assert not judged.noisy
    # the same span from the requests themselves: from the cap-th finish to the time the queue emptied
    finish_times = sorted(at for at, _ in finished)
    start = finish_times[cap - 1]
    end = next(row["t"] for row in rows if row["t"] > start and row["running"] < 0.9 * cap)
    delivered = sum(tokens for at, tokens in finished if start < at <= end) / (end - start)
    assert judged.median == pytest.approx(delivered, rel=0.05), (judged, delivered)
    # no window is the warm-up (nothing finished yet, then the first batch at once) or the drain
    assert all(rate == pytest.approx(delivered, rel=0.15) for rate in rates), (rates, delivered)
    # the measured rate, not its noise-widened upper bound: a busy machine's late samples widen the MAD, not the rate
    assert judged.median < full_batch, (judged, full_batch)
    assert max(row["running"] for row in rows) == cap and rows[-1]["running"] < 0.9 * cap  # it drained
