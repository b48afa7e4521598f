"""SGLang's own arithmetic, checked against the worked numbers of docs/sglang-memory-model.md §1.1, §3 and §4."""

import pytest

from fleetgen.tuning.profile import GIB, LaunchOptions, profile_model
from fleetgen.tuning.sizing import (auto_mem_fraction_static, gpu_table, prefill_graph_batch_sizes,
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
