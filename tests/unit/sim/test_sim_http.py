"""SGLang's HTTP API served in-process (no port): shapes, errors, auth, info endpoints, faults."""

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_sim.faults import Faults
from sglang_sim.http_app import build_app

CHAT = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 4096}

# The seed's 4 draft tokens at the default per-position acceptance 0.86 (SimSettings.draft_acceptance)
SEED_ACCEPT_LENGTH = 1 + 0.86 + 0.86 ** 2 + 0.86 ** 3


def _run(service, scenario, *, ready=True):
    async def main():
        service.start_engines(asyncio.get_running_loop())
        service.ready = ready
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            return await scenario(client)

    return asyncio.run(main())


def test_chat_completion_shape_and_reproducibility(tools):
    async def scenario(client):
        first = (await client.post("/v1/chat/completions", json=CHAT)).json()
        second = (await client.post("/v1/chat/completions", json=CHAT)).json()
        return first, second

    first, second = _run(tools.make_service(tools.AFTER), scenario)
    assert first["object"] == "chat.completion" and set(first) >= {"id", "created", "model", "choices", "usage"}
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    usage = first["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["reasoning_tokens"] * 4 == len(choice["message"]["reasoning_content"])
    assert "<think>" not in choice["message"]["content"]
    assert second["usage"] == usage and second["choices"][0]["message"] == choice["message"]


def test_truncated_chat_and_inline_thinking_without_parser(tools):
    base = [a for a in tools.SEED_ARGS if a not in ("--reasoning-parser", "qwen3")]

    async def scenario(client):
        body = dict(CHAT, max_tokens=16)
        return (await client.post("/v1/chat/completions", json=body)).json()

    reply = _run(tools.make_service(tools.AFTER, base=base), scenario)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 16
    assert choice["message"]["reasoning_content"] is None
    assert choice["message"]["content"].startswith("<think>\n") and "</think>" not in choice["message"]["content"]


def test_request_longer_than_the_context_is_a_400(tools):
    async def scenario(client):
        long = {"messages": [{"role": "user", "content": "x" * 40000}], "max_tokens": 100}
        too_much = dict(CHAT, max_tokens=8190)
        return (await client.post("/v1/chat/completions", json=long),
                await client.post("/v1/chat/completions", json=too_much))

    long, too_much = _run(tools.make_service(tools.AFTER), scenario)
    assert long.status_code == 400
    assert long.json() == {"object": "error", "message": "The input (10007 tokens) is longer than the model's "
                           "context length (8192 tokens).", "type": "BadRequestError", "param": None, "code": 400}
    assert too_much.status_code == 400
    assert too_much.json()["message"].startswith("Requested token count exceeds the model's maximum context "
                                                 "length of 8192 tokens. You requested a total of 8202 tokens: 12 tokens")


def test_generate_native_shape_single_and_batch(tools):
    async def scenario(client):
        single = (await client.post("/generate", json={"text": "The capital city of France is",
                                                        "sampling_params": {"max_new_tokens": 8}})).json()
        batch = (await client.post("/generate", json={"text": ["a", "b"],
                                                       "sampling_params": {"max_new_tokens": 5}})).json()
        return single, batch

    single, batch = _run(tools.make_service(tools.AFTER), scenario)
    assert single["meta_info"]["completion_tokens"] == 8 and len(single["output_ids"]) == 8
    assert single["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert "spec_accept_length" in single["meta_info"] and single["meta_info"]["prompt_tokens"] == 8
    assert isinstance(batch, list) and len(batch) == 2


def test_server_info_carries_resolved_and_effective_values(tools):
    async def scenario(client):
        return ((await client.get("/server_info")).json(), (await client.get("/get_server_info")).json(),
                (await client.get("/v1/models")).json(), (await client.get("/model_info")).json())

    info, alias, models, model_info = _run(tools.make_service(tools.AFTER), scenario)
    assert info["version"] == "0.5.23" and info["max_total_num_tokens"] > 0
    assert info["max_running_requests"] == 64 and info["mem_fraction_static"] == 0.93
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == 40 and state["max_mamba_cache_size"] == 200
    assert state["avg_spec_accept_length"] == pytest.approx(SEED_ACCEPT_LENGTH)
    # managers/scheduler_components/memory_usage.py::build_memory_usage: these keys, 3 decimals, and every
    # graph phase of model_executor/graph_memory_usage.py (EAGLE: target verify and draft graphs, no decode)
    usage = state["memory_usage"]
    assert set(usage) == {"weight", "kvcache", "startup_available", "token_capacity", "token_capacity_swa", "graph"}
    assert set(usage["graph"]) == {"prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                                   "draft_extend"}
    assert usage["graph"]["decode"] == 0 and usage["graph"]["target_verify"] > 0
    assert usage["token_capacity"] == info["max_total_num_tokens"] and usage["weight"] == round(54e9 / (1 << 30), 3)
    assert state["sim"]["decode_tokens_per_s_at_full_batch"] > 0
    assert alias["internal_states"][0]["effective_max_running_requests_per_dp"] == 40
    assert models["data"][0]["max_model_len"] == 8192
    assert model_info["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "max_total_num_tokens" not in model_info


def test_before_flags_report_the_speculative_default(tools):
    async def scenario(client):
        return (await client.get("/server_info")).json()

    info = _run(tools.make_service(tools.BEFORE), scenario)
    # automatic: the B200 table's 0.854 times adjust_mem_fraction_for_vlm's factor (a multimodal architecture)
    assert info["max_running_requests"] == 48 and info["mem_fraction_static"] == pytest.approx(0.78975, abs=1e-5)
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 16


def test_api_key_guards_all_but_health(tools):
    async def scenario(client):
        return ((await client.get("/v1/models")).status_code, (await client.get("/v1/models")).json(),
                (await client.get("/health")).status_code, (await client.get("/ready")).status_code,
                (await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})).status_code)

    denied, body, health, ready, allowed = _run(tools.make_service(tools.AFTER + ["--api-key", "s3cret"]), scenario)
    assert (denied, body, health, ready, allowed) == (401, {"error": "Unauthorized"}, 200, 200, 200)


def test_health_is_503_until_ready(tools):
    async def scenario(client):
        return (await client.get("/health")).status_code, (await client.get("/ready")).status_code

    assert _run(tools.make_service(tools.AFTER), scenario, ready=False) == (503, 503)


def test_http_500_after_and_hang_faults(tools):
    async def failing(client):
        return [(await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(3)]

    assert _run(tools.make_service(tools.AFTER, faults=Faults(http_500_after=1)), failing) == [200, 500, 500]

    async def hanging(client):
        first = (await client.post("/v1/chat/completions", json=CHAT)).status_code
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.get("/health"), 0.2)
        return first

    assert _run(tools.make_service(tools.AFTER, faults=Faults(hang_after_requests=1)), hanging) == 200


def test_speed_fault_slows_the_server(tools):
    normal = tools.make_service(tools.AFTER)
    slow = tools.make_service(tools.AFTER, faults=Faults(speed=0.7))
    assert slow.timing.request_rate(40) == pytest.approx(0.7 * normal.timing.request_rate(40), rel=1e-6)


def test_streamed_chat_and_metrics(tools):
    async def scenario(client):
        body = dict(CHAT, stream=True, stream_options={"include_usage": True})
        stream = (await client.post("/v1/chat/completions", json=body)).text
        metrics = (await client.get("/metrics")).text
        return stream, metrics

    stream, metrics = _run(tools.make_service(tools.AFTER + ["--enable-metrics"]), scenario)
    events = [line[len("data: "):] for line in stream.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    # sglang/srt/entrypoints/openai/sse_utils.py: every delta names reasoning_content, null when it has none
    assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "reasoning_content" in chunks[1]["choices"][0]["delta"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    families = {family.name: family for family in text_string_to_metric_families(metrics)}
    # observability/metrics_collector.py: names, types and labels as SGLang 0.5.23 exposes them
    assert families["sglang:num_requests"].type == "counter"
    (requests,) = families["sglang:num_requests"].samples
    assert requests.value == 1 and requests.labels == {"model_name": "/models/qwen3.6-27b", "engine_type": "unified",
                                                       "is_streaming": "false"}
    for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                  "sglang:num_used_tokens", "sglang:spec_accept_length", "sglang:mamba_usage"):
        assert families[gauge].type == "gauge", gauge
        (sample,) = families[gauge].samples
        assert sample.labels == {"model_name": "/models/qwen3.6-27b", "engine_type": "unified", "tp_rank": "0",
                                 "pp_rank": "0", "moe_ep_rank": "0"}
    assert families["sglang:spec_accept_length"].samples[0].value == pytest.approx(SEED_ACCEPT_LENGTH)


def test_v1_loads_has_sglangs_shape(tools):
    async def scenario(client):
        await client.post("/v1/chat/completions", json=CHAT)
        return ((await client.get("/v1/loads")).json(), (await client.get("/v1/loads?include=core")).json(),
                await client.get("/v1/loads?include=bogus"), (await client.get("/v1/loads?format=prometheus")).text,
                (await client.get("/v1/loads?dp_rank=3")).json())

    body, core, bad, prometheus, other_rank = _run(tools.make_service(tools.AFTER), scenario)
    # entrypoints/v1_loads.py and managers/load_snapshot.py::LoadSnapshot.to_dict
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert body["version"] == "0.5.23" and body["accelerator"] == "NVIDIA B200" and body["num_accelerators"] == 1
    (load,) = body["loads"]
    assert list(load)[:18] == ["timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs",
                               "num_waiting_uncached_tokens", "num_used_tokens", "num_total_tokens",
                               "num_active_tokens", "num_prealloc_ready_tokens", "max_total_num_tokens",
                               "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate",
                               "utilization", "total_prefill_uncached_tokens", "total_prefill_busy_us",
                               "decode_moments"]
    assert load["max_running_requests"] == 40 and set(load["memory"]) == {"weight_gb", "kv_cache_gb", "graph_gb",
                                                                          "token_capacity"}
    assert load["speculative"]["accept_length"] == pytest.approx(SEED_ACCEPT_LENGTH) and set(load["queues"]) == {
        "waiting", "grammar", "paused", "retracted", "prealloc_ready"}
    assert "memory" not in core["loads"][0] and bad.status_code == 400 and other_rank["loads"] == []
    families = {family.name: family for family in text_string_to_metric_families(prometheus)}
    assert families["sglang_max_running_requests"].samples[0].labels == {"dp_rank": "0"}
    assert families["sglang_memory_token_capacity"].samples[0].value == load["max_total_num_tokens"]


def test_routes_sglang_does_not_serve_answer_its_404(tools):
    async def scenario(client):
        return [await client.get(path) for path in ("/get_load", "/metrics", "/no/such/route")] + \
            [await client.get("/generate")]

    get_load, metrics, unknown, wrong_method = _run(tools.make_service(tools.AFTER), scenario)
    for response in (get_load, metrics, unknown):  # /metrics needs --enable-metrics
        assert response.status_code == 404 and response.json() == {"detail": "Not Found"}
    assert wrong_method.status_code == 405 and wrong_method.json() == {"detail": "Method Not Allowed"}


def test_retraction_counters_under_sglang_metric_names(tools):
    async def scenario(client):
        engine = service.engines[0]
        engine.stats.retracted_requests, engine.stats.retracted_input_tokens = 3, 900
        engine.stats.retracted_output_tokens, engine.stats.last_retracted = 4000, 1
        engine.stats.peak_used_tokens = 12345
        return (await client.get("/metrics")).text, (await client.get("/server_info")).json()

    service = tools.make_service(tools.AFTER + ["--enable-metrics"])
    metrics, info = _run(service, scenario)
    families = {family.name: family for family in text_string_to_metric_families(metrics)}
    values = {name: families[name].samples[0].value for name in families}
    assert families["sglang:num_retracted_requests"].type == "counter"
    assert values["sglang:num_retracted_requests"] == 3 and values["sglang:num_retracted_input_tokens"] == 900
    assert values["sglang:num_retracted_output_tokens"] == 4000 and values["sglang:num_retracted_reqs"] == 1
    assert values["sglang:num_used_tokens"] == 0 and values["sglang:new_token_ratio"] == 0.7
    assert families["sglang:num_retracted_reqs"].samples[0].labels["model_name"] == "/models/qwen3.6-27b"
    state = info["internal_states"][0]
    assert state["sim"]["num_retracted_requests_total"] == 3 and state["sim"]["full_token_usage"] == 0.0
    assert state["sim"]["peak_used_tokens"] == 12345
    assert "num_retracted_requests_total" not in state  # SGLang's internal state has no such key
