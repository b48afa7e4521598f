"""SGLang's own arithmetic, checked against the worked numbers of docs/sglang-memory-model.md §1.1, §3 and §4."""

import pytest
from fleetgen.tuning.profile import GIB, LaunchOptions, profile_model
from fleetgen.tuning.sizing import (auto_mem_fraction_static, gpu_table, prefill_graph_batch_sizes,
                                    sglang_reserve_mb, size_pools)
import dataclasses
from fleetgen.tuning.profile import GIB, MIB, LaunchOptions, profile_model
from fleetgen.tuning.sizing import (PoolSizing, ReserveEstimate, auto_mem_fraction_static, gpu_table,
                                    sglang_reserve_mb, size_pools)

@pytest.mark.parametrize("gpu_mib, by_tp", [
    (81_559, (0.830, 0.828, 0.819, 0.812)),    # H100 80GB
    (143_771, (0.903, 0.902, 0.897, 0.893)),   # H200
    (183_359, (0.854, 0.853, 0.852, 0.849)),   # B200
    (40_960, (0.823, 0.820, 0.807, 0.795)),    # A100-40G
])
def test_auto_mem_fraction_static_table(gpu_mib, by_tp):
    for tp, expected in zip((1, 2, 4, 8), by_tp):
        chunk, decode_bs = gpu_table(gpu_mib, tp)
        reserve = sglang_reserve_mb(gpu_mem_mib=gpu_mib, chunked_prefill_size=chunk, decode_max_bs=decode_bs,
                                    tp_size=tp, uses_mla=False, graphs_enabled=True)
        assert auto_mem_fraction_static(gpu_mib, reserve) == expected


def test_h100_reserve_worked_example():
    reserve = sglang_reserve_mb(gpu_mem_mib=81_559, chunked_prefill_size=8192, decode_max_bs=256, tp_size=1,
                                uses_mla=False, graphs_enabled=True)
    assert reserve.total_mb == 512 + 12_288 + 128 + 512 + 8 * 58 == 13_904
    no_graphs = sglang_reserve_mb(gpu_mem_mib=81_559, chunked_prefill_size=8192, decode_max_bs=256, tp_size=1,
                                  uses_mla=False, graphs_enabled=False)
    assert round((81_559 - no_graphs.total_mb) / 81_559, 3) == 0.841


def test_prefill_graph_buckets_and_big_gpu_floor():
    assert len(prefill_graph_batch_sizes(8192)) == 58
    assert len(prefill_graph_batch_sizes(16384)) == 74
    small = sglang_reserve_mb(gpu_mem_mib=183_359, chunked_prefill_size=2048, decode_max_bs=64, tp_size=1,
                              uses_mla=False, graphs_enabled=True)
    assert small.total_mb == 10_240 and "floored" in small.formula()
    mla = sglang_reserve_mb(gpu_mem_mib=40_960, chunked_prefill_size=4096, decode_max_bs=32, tp_size=1,
                            uses_mla=True, graphs_enabled=True)
    assert mla.prefill_graph_mb == 1536


def test_gpu_table_rows():
    assert gpu_table(16_000, 1) == (2048, 8)
    assert gpu_table(24_000, 4) == (4096, 160)
    assert gpu_table(81_559, 1) == (8192, 256)
    assert gpu_table(143_771, 4) == (8192, 512)
    assert gpu_table(183_359, 1) == (16384, 512)
    assert gpu_table(None, 1) == (4096, 160)


def _seed_sizing(profile, **overrides):
    values = dict(pre_load_free_bytes=(183_359 - 600) << 20, mem_fraction_static=0.854,
                  max_running_requests=48, max_mamba_cache_size=80, context_length=8192)
    values.update(overrides)
    return size_pools(profile, **values)


def test_section_3_narrative_16_then_40(seed_profile):
    # K 80 with the speculative default of 48 requests -> 80 // 5 = 16.
    before = _seed_sizing(seed_profile)
    assert (before.max_mamba_cache_size, before.effective_max_running_requests) == (80, 16)
    assert before.state_bytes == 81 * 153_944_064
    assert before.spec_bytes == 17 * 4 * 153_944_064  # README: 81 + 17 x 4 = 149 slots
    # K 200, mfs 0.93, 64 requested -> 200 // 5 = 40.
    after = _seed_sizing(seed_profile, mem_fraction_static=0.93, max_running_requests=64, max_mamba_cache_size=200)
    assert after.effective_max_running_requests == 40
    assert after.state_bytes + after.spec_bytes == 365 * 153_944_064  # README: 201 + 41 x 4 = 365 slots


def _qwen3_next_tp2(qwen3_next_config, **options):
    # 100 GiB of weights over tp 2 = 50 GiB per GPU; 100 GiB pre-load free at mfs 0.9 -> rest 40 GiB.
    return profile_model(qwen3_next_config, 100 * GIB, LaunchOptions(tp_size=2, **options))


def _rest_40(profile, **kwargs):
    return size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, context_length=262_144,
                      **kwargs)


def test_section_4_auto_example_without_spec(qwen3_next_config):
    sizing = _rest_40(_qwen3_next_tp2(qwen3_next_config), max_running_requests=None, max_mamba_cache_size=None)
    assert sizing.max_mamba_cache_size == 525
    assert sizing.effective_max_running_requests == 105
    assert 1_830_000 < sizing.max_total_num_tokens < 1_850_000  # "about 1.84 M tokens"


def test_section_4_auto_example_with_eagle(qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = _qwen3_next_tp2(qwen3_next_config, speculative_algorithm="EAGLE")
    assert profile.kv_bytes_per_token == 13_312
    sizing = _rest_40(profile, max_running_requests=48, max_mamba_cache_size=None)
    assert sizing.max_mamba_cache_size == 289
    assert sizing.effective_max_running_requests == 48
    assert 1_810_000 < sizing.max_total_num_tokens < 1_830_000  # "about 1.82 M tokens"
    assert _rest_40(profile, max_running_requests=64, max_mamba_cache_size=None).effective_max_running_requests == 57
    assert _rest_40(profile, max_running_requests=48, max_mamba_cache_size=80).effective_max_running_requests == 16
    assert _rest_40(profile, max_running_requests=64, max_mamba_cache_size=200).effective_max_running_requests == 40


def test_failures_carry_sglang_messages(seed_profile):
    weights = _seed_sizing(seed_profile, mem_fraction_static=0.25)
    assert weights.failure == "oom_weights"
    assert weights.message.startswith("Loaded weights leave no GPU memory for the KV cache under "
                                      "--mem-fraction-static=0.25.")
    mamba = _seed_sizing(seed_profile, mem_fraction_static=0.29, max_mamba_cache_size=None)
    assert mamba.failure == "oom_mamba"
    assert "Computed max_mamba_cache_size=" in mamba.message
    too_few_slots = _seed_sizing(seed_profile, max_mamba_cache_size=4)
    assert too_few_slots.failure == "oom_mamba"
    assert "too small to serve any requests" in too_few_slots.message


def test_dense_request_count_follows_the_kv_pool(cases):
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, LaunchOptions())
    sizing = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85,
                        max_running_requests=None, max_mamba_cache_size=None, context_length=8192)
    tokens = int((80 * 0.85 - 16 * 10**9 / GIB) * GIB) // 131_072
    assert sizing.max_total_num_tokens == tokens
    assert sizing.effective_max_running_requests == max(min(int(tokens / 8192 * 512), 4096), 2048)
    capped = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85, max_running_requests=64,
                        max_mamba_cache_size=None, context_length=8192, max_total_tokens=100)
    assert (capped.max_total_num_tokens, capped.effective_max_running_requests) == (100, 50)


def test_page_size_floors_the_token_count(cases):
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, LaunchOptions(page_size=64))
    sizing = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85, max_running_requests=8,
                        max_mamba_cache_size=None, context_length=8192, page_size=64)
    unpaged = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85, max_running_requests=8,
                         max_mamba_cache_size=None, context_length=8192)
    assert sizing.ok and unpaged.ok and unpaged.max_total_num_tokens % 64
    assert sizing.max_total_num_tokens == unpaged.max_total_num_tokens // 64 * 64 > 0
    assert sizing.kv_bytes == sizing.max_total_num_tokens * profile.kv_bytes_per_token


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 24, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128, "torch_dtype": "bfloat16",
           "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072}


def test_sliding_window_budget_splits_between_full_and_swa_pools():
    """HybridSWAPoolConfigurator: full tokens = budget // (full cell + 0.8 x SWA cell), page-floored; the
    SWA pool holds int(full x 0.8), page-floored."""
    profile = profile_model(GPT_OSS, 13 * 10**9, LaunchOptions())
    sizing = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.9, max_running_requests=64,
                        max_mamba_cache_size=None, context_length=8192, page_size=64)
    budget = int((80 * 0.9 - 13 * 10**9 / GIB) * GIB)
    full = int(budget // (24_576 + 0.8 * 24_576)) // 64 * 64
    assert (sizing.max_total_num_tokens, sizing.swa_max_total_num_tokens) == (full, int(full * 0.8) // 64 * 64)
    assert sizing.swa_kv_bytes == sizing.swa_max_total_num_tokens * 24_576


def test_swa_pool_that_cannot_hold_one_window_fails_as_sglang_does():
    profile = profile_model(GPT_OSS, 13 * 10**9, LaunchOptions(swa_full_tokens_ratio=0.001))
    sizing = size_pools(profile, pre_load_free_bytes=int(13.2 * GIB), mem_fraction_static=0.99,
                        max_running_requests=1, max_mamba_cache_size=None, context_length=4096)
    assert sizing.failure == "swa_pool" and "cannot hold even one request" in sizing.message


@pytest.mark.parametrize("gpu_mib, tp, row", [
    (15_360, 1, (2048, 8)),            # T4
    (20 * 1024 - 1, 1, (2048, 8)),
    (20 * 1024, 1, (4096, 48)),        # "< 20 * 1024" is strict
    (24_564, 1, (4096, 48)),           # RTX 4090
    (24_564, 4, (4096, 160)),
    (35 * 1024 - 1, 1, (4096, 48)),
    (35 * 1024, 1, (4096, 32)),
    (40_960, 1, (4096, 32)),           # A100-40G
    (46_068, 2, (4096, 32)),           # L40S
    (46_068, 4, (4096, 160)),
    (60 * 1024 - 1, 1, (4096, 32)),
    (60 * 1024, 1, (8192, 256)),
    (81_559, 4, (8192, 512)),          # H100
    (143_771, 1, (8192, 256)),         # H200
    (160 * 1024 - 1, 8, (8192, 512)),
    (160 * 1024, 1, (16384, 512)),
    (183_359, 8, (16384, 512)),        # B200
])
def test_gpu_table_rows_and_boundaries(gpu_mib, tp, row):
    assert gpu_table(gpu_mib, tp) == row


def _reserve(**overrides) -> ReserveEstimate:
    values = dict(gpu_mem_mib=40_960, chunked_prefill_size=4096, decode_max_bs=32, tp_size=1, uses_mla=False,
                  graphs_enabled=True)
    values.update(overrides)
    return sglang_reserve_mb(**values)


def test_reserve_breakdown_of_an_a100_40g():
    # 4096 prefill tokens: 50 prefill graph sizes (4..32 by 4, 48..256 by 16, 288..512 by 32, 576..1024 by 64,
    # 1280..4096 by 256), 8 MB each.
    assert _reserve() == ReserveEstimate(activation_tokens=4096, activation_mb=6144.0, base_mb=512.0,
                                         parallel_mb=128.0, decode_graph_mb=64.0, prefill_graph_mb=400.0,
                                         prefill_graph_sizes=50, floor_mb=0.0, total_mb=7248.0)


def test_reserve_without_prefill_graphs_counts_no_graph_sizes():
    no_graphs = _reserve(graphs_enabled=False)
    assert (no_graphs.prefill_graph_sizes, no_graphs.prefill_graph_mb, no_graphs.decode_graph_mb) == (0, 0.0, 0.0)
    assert no_graphs.total_mb == 512 + 6144 + 128
    mla = _reserve(uses_mla=True)
    assert (mla.prefill_graph_sizes, mla.prefill_graph_mb) == (0, 1536.0)
    multimodal = _reserve(prefill_graph=False)
    assert (multimodal.prefill_graph_sizes, multimodal.prefill_graph_mb) == (0, 0.0)
    assert multimodal.decode_graph_mb == 64.0


@pytest.mark.parametrize("chunk, max_prefill, tokens", [
    (-1, 16384, 16384),    # chunked prefill off: --max-prefill-tokens (default 16384) drives the activations
    (-1, 1024, 2048),      # ... floored at 2048 tokens
    (-1, 20_000, 20_000),
    (1, 16384, 2048),      # a 1-token chunk is still chunked prefill: the 2048 floor, not max-prefill-tokens
    (3000, 16384, 3000),
])
def test_activation_tokens_follow_chunking(chunk, max_prefill, tokens):
    reserve = _reserve(chunked_prefill_size=chunk, max_prefill_tokens=max_prefill, graphs_enabled=False)
    assert (reserve.activation_tokens, reserve.activation_mb) == (tokens, tokens * 1.5)
    assert reserve.total_mb == 512 + tokens * 1.5 + 128


@pytest.mark.parametrize("gpu_mib, floor", [(60 * 1024, 0.0), (60 * 1024 + 1, 10240.0), (None, 0.0)])
def test_reserve_floor_applies_only_above_60_gib(gpu_mib, floor):
    """memory_hook: ``if gpu_mem is not None and gpu_mem > 60 * 1024: reserved = max(reserved, 10 * 1024)``."""
    reserve = _reserve(gpu_mem_mib=gpu_mib, chunked_prefill_size=2048, decode_max_bs=8)
    assert reserve.floor_mb == floor
    unfloored = 512 + 2048 * 1.5 + 128 + 2 * 8 + 8 * 42  # 42 prefill graph sizes up to 2048
    assert reserve.total_mb == max(unfloored, floor)
    assert ("floored to 10240 MB" in reserve.formula()) == bool(floor)


def test_unknown_gpu_size_gives_0_95():
    assert auto_mem_fraction_static(None, _reserve(gpu_mem_mib=None)) == 0.95


@pytest.mark.parametrize("vision, factor", [
    ((12, 768), 1.05),     # a small ViT: 1 - 0.1 x (0.28 - 1) = 1.072, capped at 1.05
    ((24, 1024), 1.0),     # the ViT-L/14 baseline
    ((64, 2048), 0.8),     # a large ViT: floored at 0.8
])
def test_vlm_factor_is_capped_both_ways(vision, factor):
    """adjust_mem_fraction_for_vlm: mfs x 0.95 x max(0.8, min(1.05, 1 - 0.1 x (complexity - 1)))."""
    assert auto_mem_fraction_static(None, _reserve(gpu_mem_mib=None), vision) == 0.95 * (0.95 * factor)


def _llama(cases, **options):
    return profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * GIB, LaunchOptions(**options))


def _qwen3_next(qwen3_next_config, **options):
    """Qwen3-Next at tp 2: 50 GiB of weights per GPU, P = 38,633,472 B (fp32 SSM), 12,288 B of KV per token."""
    return profile_model(qwen3_next_config, 100 * GIB, LaunchOptions(tp_size=2, **options))


def _failed(mfs, pre, k, mrr, kind, message) -> PoolSizing:
    return PoolSizing(mfs, pre, pre * mfs, k, 0, 0, 0, 0, 0, 0, mrr, 0, kind, message)


def test_oom_kv_when_the_pool_holds_no_token(cases):
    profile = _llama(cases)
    # Pre-load 32 GiB + 200 KiB at mfs 0.5: 100 KiB over the 16 GiB of weights, under one 128 KiB token.
    pre = 32 * GIB + 200 * 1024
    sizing = size_pools(profile, pre_load_free_bytes=pre, mem_fraction_static=0.5, max_running_requests=8,
                        max_mamba_cache_size=None, context_length=8192)
    assert 0 < sizing.static_budget_bytes - 16 * GIB < profile.kv_bytes_per_token
    assert sizing == _failed(0.5, pre, None, 8, "oom_kv", "Not enough memory. Please try to increase "
                             "--mem-fraction-static. Current value: mem_fraction_static=0.5")


def test_weights_that_use_the_whole_static_budget_are_oom_weights(cases):
    """_profile_available_bytes raises on rest_memory <= 0: exactly 0 is a failure too."""
    sizing = size_pools(_llama(cases), pre_load_free_bytes=32 * GIB, mem_fraction_static=0.5,
                        max_running_requests=None, max_mamba_cache_size=None, context_length=8192)
    assert sizing == _failed(0.5, 32 * GIB, None, None, "oom_weights",
                             "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5. "
                             "Raise --mem-fraction-static above 0.500 (minimum viable = 1 - available/pre = "
                             "0.5000).")


def test_less_than_a_gib_of_rest_still_sizes_a_pool(cases):
    # rest 0.5 GiB: 4096 tokens of 131,072 B.
    sizing = size_pools(_llama(cases), pre_load_free_bytes=33 * GIB, mem_fraction_static=0.5,
                        max_running_requests=None, max_mamba_cache_size=None, context_length=8192)
    assert sizing.ok and sizing.max_total_num_tokens == 4096 and sizing.kv_budget_bytes == GIB // 2


def test_oom_weights_after_a_pinned_mamba_cache_keeps_its_size(qwen3_next_config):
    profile = _qwen3_next(qwen3_next_config)
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9,
                        max_running_requests=None, max_mamba_cache_size=2000, context_length=8192)
    # 40 GiB of rest minus 2001 slots of 38,633,472 B: negative.
    assert sizing.failure == "oom_weights" and sizing.max_mamba_cache_size == 2000
    assert dataclasses.replace(sizing, message=None) == dataclasses.replace(
        _failed(0.9, 100 * GIB, 2000, None, "oom_weights", ""), message=None)


def _pre_for_mamba_budget(profile, slots: float) -> int:
    """Pre-load free bytes (mfs 0.9) whose auto Mamba budget rest x 0.9 / 1.9 holds ``slots`` state slots."""
    rest = slots * profile.state_bytes_per_slot * 1.9 / 0.9
    return int((rest + profile.weights_bytes_per_gpu) / 0.9)


def test_mamba_budget_under_two_slots_is_oom_mamba_with_sglangs_message(qwen3_next_config):
    profile = _qwen3_next(qwen3_next_config)
    pre = _pre_for_mamba_budget(profile, 1.5)  # K = (1.5 P - P) // P = 0
    sizing = size_pools(profile, pre_load_free_bytes=pre, mem_fraction_static=0.9, max_running_requests=None,
                        max_mamba_cache_size=None, context_length=8192)
    rest = ((pre - profile.weights_bytes_per_gpu) / GIB) - (pre / GIB) * (1 - 0.9)
    assert sizing == _failed(0.9, pre, 0, None, "oom_mamba",
                             "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
                             f"max_mamba_cache_size=0 (total_rest_memory={rest:.2f} GB, "
                             "mamba_cache_per_req=36.84 MB).")


def test_mamba_budget_under_one_slot_floors_to_minus_one(qwen3_next_config):
    """SGLang floors with ``//`` before int(): half a slot left after the first gives K = -1, not 0."""
    profile = _qwen3_next(qwen3_next_config)
    sizing = size_pools(profile, pre_load_free_bytes=_pre_for_mamba_budget(profile, 0.5), mem_fraction_static=0.9,
                        max_running_requests=None, max_mamba_cache_size=None, context_length=8192)
    assert (sizing.failure, sizing.max_mamba_cache_size) == ("oom_mamba", -1)
    assert "Computed max_mamba_cache_size=-1 " in sizing.message
    spec = _qwen3_next(qwen3_next_config, speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    # Joint solve: (B - 3P) // (P x (1 + 2/5)) with B = 2.5 P: -0.5 P // 1.4 P = -1.
    sizing = size_pools(spec, pre_load_free_bytes=_pre_for_mamba_budget(spec, 2.5), mem_fraction_static=0.9,
                        max_running_requests=48, max_mamba_cache_size=None, context_length=8192)
    assert (sizing.failure, sizing.max_mamba_cache_size) == ("oom_mamba", -1)


def test_one_pinned_mamba_slot_serves_no_request(qwen3_next_config):
    """K = 1 passes the K > 0 check; resolve_max_num_reqs then gives 1 // 5 = 0 requests."""
    sizing = size_pools(_qwen3_next(qwen3_next_config), pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9,
                        max_running_requests=None, max_mamba_cache_size=1, context_length=8192)
    assert sizing == _failed(0.9, 100 * GIB, 1, None, "oom_mamba",
                             "Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                             "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.")


def _expected_tokens(profile, pre, mfs, reserved_bytes):
    rest = (pre - profile.weights_bytes_per_gpu) / GIB - (pre / GIB) * (1 - mfs) - reserved_bytes / GIB
    return int(rest * GIB), int(rest * GIB) // profile.kv_bytes_per_token


def test_dense_record_with_one_request(cases):
    profile = _llama(cases)
    sizing = size_pools(profile, pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85, max_running_requests=1,
                        max_mamba_cache_size=None, context_length=8192)
    budget, tokens = _expected_tokens(profile, 80 * GIB, 0.85, 0)
    assert sizing == PoolSizing(0.85, 80 * GIB, 80 * GIB * 0.85, None, 0, 0, 0, budget, tokens,
                                tokens * 131_072, 1, 1)


@pytest.mark.parametrize("total_tokens, mrr, effective", [
    (50_000, None, 3125),     # 50,000 / 8192 x 512 = 3125 (between the 2048 floor and the 4096 cap)
    (20_000, None, 2048),     # 1250 -> floored at 2048 (under tokens // 2 = 10,000)
    (3001, None, 1500),       # the floor is above tokens // 2 = 1500
    (101, 64, 50),            # 64 requested, 101 // 2 = 50 tokens' worth
    (1, None, 0),             # a 1-token pool passes SGLang's "<= 0" check and serves 0 requests
])
def test_request_count_from_the_token_pool(cases, total_tokens, mrr, effective):
    """resolve_max_num_reqs: estimated = max(min(int(tokens / context x 512), 4096), 2048), then min with
    tokens // 2 (and the user's max(1, mrr))."""
    sizing = size_pools(_llama(cases), pre_load_free_bytes=80 * GIB, mem_fraction_static=0.85,
                        max_running_requests=mrr, max_mamba_cache_size=None, context_length=8192,
                        max_total_tokens=total_tokens)
    assert sizing.ok
    assert sizing.max_total_num_tokens == total_tokens
    assert sizing.effective_max_running_requests == effective
    assert type(sizing.effective_max_running_requests) is int


def test_hybrid_without_speculation_reserves_no_spec_requests(qwen3_next_config):
    sizing = size_pools(_qwen3_next(qwen3_next_config), pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9,
                        max_running_requests=None, max_mamba_cache_size=None, context_length=262_144)
    assert (sizing.max_mamba_cache_size, sizing.spec_requests, sizing.spec_bytes) == (525, 0, 0)


def test_page_size_can_floor_a_small_pool_to_oom_kv(qwen3_next_config):
    """pool_configurator floors the tokens to whole pages before its "<= 0" check: under one 64-token page
    left after a pinned Mamba cache of 40 slots is oom_kv, and the record keeps K."""
    profile = _qwen3_next(qwen3_next_config)
    p = profile.state_bytes_per_slot
    pre = int((profile.weights_bytes_per_gpu + 41 * p + 32 * profile.kv_bytes_per_token) / 0.9)
    values = dict(pre_load_free_bytes=pre, mem_fraction_static=0.9, max_running_requests=None,
                  max_mamba_cache_size=40, context_length=8192)
    assert 0 < size_pools(profile, **values).max_total_num_tokens < 64
    assert size_pools(profile, page_size=64, **values) == _failed(
        0.9, pre, 40, None, "oom_kv", "Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.9")


def test_pinned_mamba_cache_with_one_requested_request(qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = _qwen3_next(qwen3_next_config, speculative_algorithm="EAGLE")
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=1,
                        max_mamba_cache_size=100, context_length=8192)
    assert (sizing.spec_requests, sizing.spec_bytes) == (1, 2 * 4 * profile.state_bytes_per_slot)
    assert sizing.effective_max_running_requests == 1


def test_pinned_mamba_cache_not_divisible_by_the_ratio(qwen3_next_config):
    """_handle_max_mamba_cache: capped_reqs = min(max(1, mrr), K // ratio) = min(48, 82 // 5) = 16."""
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = _qwen3_next(qwen3_next_config, speculative_algorithm="EAGLE")
    p = profile.state_bytes_per_slot
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=48,
                        max_mamba_cache_size=82, context_length=8192)
    assert (sizing.spec_requests, sizing.spec_bytes, sizing.state_bytes) == (16, 17 * 4 * p, 83 * p)
    budget, tokens = _expected_tokens(profile, 100 * GIB, 0.9, 17 * 4 * p + 83 * p)
    assert (sizing.kv_budget_bytes, sizing.max_total_num_tokens) == (budget, tokens)
    assert sizing.effective_max_running_requests == 16


def test_auto_mamba_cache_with_one_requested_request(qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = _qwen3_next(qwen3_next_config, speculative_algorithm="EAGLE")
    p = profile.state_bytes_per_slot
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=1,
                        max_mamba_cache_size=None, context_length=8192)
    assert (sizing.max_mamba_cache_size, sizing.spec_requests, sizing.spec_bytes) == (289, 1, 2 * 4 * p)
    assert sizing.effective_max_running_requests == 1


@pytest.mark.parametrize("mrr", [1, 10])
def test_radix_cache_off_sizes_the_mamba_cache_from_the_requests(qwen3_next_config, mrr):
    """_handle_max_mamba_cache, disable_radix_cache with max_running_requests: K = max(1, mrr), and the
    speculative buffers for K + 1 requests come off the rest first."""
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = _qwen3_next(qwen3_next_config, speculative_algorithm="EAGLE", disable_radix_cache=True)
    assert profile.state_slots_per_request == 1 and profile.draft_tokens == 4
    p = profile.state_bytes_per_slot
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=mrr,
                        max_mamba_cache_size=None, context_length=8192, disable_radix_cache=True)
    budget, tokens = _expected_tokens(profile, 100 * GIB, 0.9, (mrr + 1) * 4 * p + (mrr + 1) * p)
    assert sizing == PoolSizing(0.9, 100 * GIB, 100 * GIB * 0.9, mrr, mrr, (mrr + 1) * p, (mrr + 1) * 4 * p,
                                budget, tokens, tokens * profile.kv_bytes_per_token, mrr, mrr)


def test_radix_cache_off_without_requests_falls_back_to_the_memory_budget(qwen3_next_config):
    profile = _qwen3_next(qwen3_next_config, disable_radix_cache=True)
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=None,
                        max_mamba_cache_size=None, context_length=262_144, disable_radix_cache=True)
    assert sizing.max_mamba_cache_size == 525


def test_a_single_draft_token_still_reserves_speculative_state(qwen3_next_config):
    """has_spec_dec is any algorithm: NGRAM with one draft token reserves P x (K' + 1) x 1."""
    profile = _qwen3_next(qwen3_next_config, speculative_algorithm="NGRAM", speculative_num_draft_tokens=1)
    assert profile.draft_tokens == 1
    p = profile.state_bytes_per_slot
    sizing = size_pools(profile, pre_load_free_bytes=100 * GIB, mem_fraction_static=0.9, max_running_requests=48,
                        max_mamba_cache_size=100, context_length=8192)
    assert (sizing.spec_requests, sizing.spec_bytes) == (20, 21 * p)


def _gpt_oss_sizing(pre=80 * GIB, **kwargs):
    profile = profile_model(GPT_OSS, 13 * 10**9, LaunchOptions())
    return size_pools(profile, pre_load_free_bytes=pre, mem_fraction_static=0.9, max_running_requests=64,
                      max_mamba_cache_size=None, context_length=8192, **kwargs)


def test_swa_full_tokens_are_the_float_floor_division_sglang_makes():
    """HybridSWAPoolConfigurator.calculate_pool_sizes: int(budget // cell) with the float cell 24,576 + 0.8 x 24,576.
    A budget of exactly 1,453,755 real-valued cells floors one token lower, because the float cell is a hair
    above 44,236.8; a true division would round up to the whole count."""
    sizing = _gpt_oss_sizing(pre=85_899_410_205)
    assert sizing.kv_budget_bytes == 64_309_469_184 == 1_453_755 * 442_368 // 10
    assert (sizing.max_total_num_tokens, sizing.swa_max_total_num_tokens) == (1_453_754, int(1_453_754 * 0.8))


def test_max_total_tokens_caps_the_full_pool_then_page_floors_both_pools():
    """KVCacheConfigurator._apply_token_constraints caps the full pool at --max-total-tokens and
    calculate_pool_sizes_from_max_tokens page-aligns it; the SWA pool follows at the ratio."""
    sizing = _gpt_oss_sizing(page_size=64, max_total_tokens=10_000)
    assert (sizing.max_total_num_tokens, sizing.swa_max_total_num_tokens) == (9_984, 7_936)
    assert type(sizing.max_total_num_tokens) is int and sizing.kv_bytes == 9_984 * 24_576
    assert sizing.swa_kv_bytes == 7_936 * 24_576


def test_swa_pool_of_exactly_window_plus_page_tokens_cannot_admit_a_request():
    """validate_swa_pool_size fails when sliding_window_size + page_size >= SWA tokens: gpt-oss's window is 127,
    so at page size 1 an SWA pool of 128 tokens (a full pool of 160 at 0.8) fails and one of 129 serves."""
    at_floor = _gpt_oss_sizing(max_total_tokens=160)
    assert (at_floor.failure, at_floor.message) == (
        "swa_pool", "SWA pool (128 tokens) cannot hold even one request: the prefill admission floor is "
        "sliding_window_size (127) + page_size (1). Increase --swa-full-tokens-ratio or the total KV budget.")
    above = _gpt_oss_sizing(max_total_tokens=162)
    assert above.ok and (above.max_total_num_tokens, above.swa_max_total_num_tokens) == (162, 129)
