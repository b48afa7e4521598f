"""Pool sizing against the seed scenario and the worked examples of docs/sglang-memory-model.md §1-§4."""

import argparse

import pytest

from sglang_sim.args import parse_args
from sglang_sim.graphs import graph_memory
from sglang_sim.modelcfg import from_config
from sglang_sim.pools import size_pools
from sglang_sim.presets import preset_config
from sglang_sim.resolve import LaunchError, compute_capability, prefill_buckets, resolve_launch


def test_seed_before_caps_at_16_with_21_gib_of_state(tools):
    launch, plan = tools.seed_run(tools.BEFORE)
    # auto: B200 table row 0.854 (docs/sglang-memory-model.md §1.1, §4.2; Qwen3.5 is on SGLang's allow-list of
    # multimodal models that keep the prefill graph), then the VLM factor of a multimodal architecture:
    # 0.95 x (1 - 0.1 x (24 x 1152^2 / (24 x 1024^2) - 1)) for Qwen3.5's default vision tower
    assert launch.mfs_reserved_mb == 512 + 1.5 * 16384 + 1024 / 8 + 2 * 512 + 8 * 74  # 26,832 MB
    assert launch.prefill_graph
    assert launch.mfs_vlm_factor == 0.95 * (1.0 - 0.1 * ((24 * 1152 ** 2) / (24 * 1024 ** 2) - 1.0))
    assert launch.mem_fraction_static == 0.854 * launch.mfs_vlm_factor
    assert launch.mem_fraction_static == pytest.approx(0.78975, abs=1e-5)  # what SGLang 0.5.23 computes
    assert launch.mm_reservation_mb == 100               # SGLANG_VLM_CACHE_SIZE_MB out of the KV budget
    assert launch.max_running_requests == 48             # speculative default
    assert launch.spec_algorithm == "EAGLE"              # NEXTN rewritten
    assert plan.mamba_slot_bytes == 153_944_064
    assert plan.mamba_ratio == 5
    assert plan.max_mamba_cache_size == 80
    assert plan.max_running_requests == 16
    assert plan.mamba_total_bytes == 149 * 153_944_064   # 81 slots + 17 x 4 intermediate
    assert plan.mamba_total_bytes / tools.GIB == pytest.approx(21.36, abs=0.01)
    # mtp_num_hidden_layers is not num_nextn_predict_layers: nothing folded into the budgeted cell...
    assert (launch.draft_layers, launch.draft_kv_layers) == (0, 1)
    assert plan.kv_cell_bytes == 65_536
    # ...but the draft worker's 1-layer pool of the same token count is allocated outside the budget
    assert plan.draft_kv_cell_bytes == 4_096
    assert plan.draft_kv_bytes == plan.draft_kv_outside_bytes == plan.max_total_num_tokens * 4_096
    assert plan.pool_bytes == plan.kv_bytes + plan.draft_kv_bytes + plan.mamba_total_bytes
    assert plan.max_total_num_tokens == pytest.approx(1.14e6, rel=0.02)  # reported: KV cache ~1.14M tokens
    assert any("capped to 16 by the mamba state cache" in w for w in plan.warnings)


def test_target_config_num_nextn_predict_layers_is_folded_into_the_cell(tools):
    """A path-less MTP head declared as num_nextn_predict_layers is budgeted (int(cell x 1/16))."""
    config = preset_config("qwen3.6-27b")
    config["text_config"]["num_nextn_predict_layers"] = 1
    model = from_config(config)
    launch = resolve_launch(parse_args(tools.SEED_ARGS + tools.AFTER), model, [tools.B200_MIB])
    pre = tools.b200_pre_load_free()
    plan = size_pools(model, launch, pre, pre - tools.SEED_WEIGHTS)
    assert (launch.draft_layers, launch.draft_kv_layers) == (1, 1)
    assert plan.kv_cell_bytes == 69_632 and plan.draft_kv_cell_bytes == 4_096
    assert plan.draft_kv_outside_bytes == 0
    unfolded = tools.seed_run(tools.AFTER)[1]
    assert plan.max_total_num_tokens == unfolded.rest_bytes // 69_632 < unfolded.max_total_num_tokens


def test_language_model_only_is_fatal_on_qwen3_5_and_gpu_transport_adds_the_feature_pool(tools):
    # arg_groups/model_hook.py::handle_language_model_only: only four architectures accept it
    with pytest.raises(LaunchError, match="--language-model-only does not support"):
        tools.seed_run(tools.BEFORE + ["--language-model-only"])
    gpu_transport, _ = tools.seed_run(tools.AFTER + ["--mm-feature-transport", "cuda_ipc"])
    assert gpu_transport.mm_reservation_mb == 100 + 1024


def test_seed_after_caps_at_40_with_52_gib_of_state(tools):
    launch, plan = tools.seed_run(tools.AFTER)
    assert launch.mem_fraction_static == 0.93
    assert plan.max_mamba_cache_size == 200
    assert plan.max_running_requests == 40
    assert plan.mamba_total_bytes == 365 * 153_944_064
    assert plan.mamba_total_bytes / tools.GIB == pytest.approx(52.33, abs=0.01)
    # moving memory to state leaves fewer KV tokens than before
    assert plan.max_total_num_tokens < tools.seed_run(tools.BEFORE)[1].max_total_num_tokens


def test_auto_mem_fraction_table_matches_worked_defaults(tools):
    model = tools.preset("llama3.1-8b")
    cases = {(81559, 1): 0.830, (143771, 1): 0.903, (tools.B200_MIB, 1): 0.854, (tools.B200_MIB, 8): 0.849,
             (40960, 1): 0.823}
    for (total, tp), expected in cases.items():
        launch = resolve_launch(parse_args(["--model-path", "m", "--tp", str(tp)]), model, [total])
        assert launch.mem_fraction_static == expected, (total, tp)
    no_graphs = resolve_launch(parse_args(["--model-path", "m", "--disable-cuda-graph"]), model, [81559])
    assert no_graphs.mem_fraction_static == 0.841
    assert len(prefill_buckets(16384)) == 74 and len(prefill_buckets(8192)) == 58


def _qwen3_next_rest_40gib(tools, extra, config_overrides=None):
    config = preset_config("qwen3-next-80b-a3b")
    config.update(config_overrides or {})
    model = from_config(config)
    launch = resolve_launch(parse_args(["--model-path", "m", "--tp", "2", "--mem-fraction-static", "0.9"] + extra),
                            model, [tools.B200_MIB] * 2)
    # rest = available - pre * (1 - 0.9) = 50 - 10 = 40 GiB
    return size_pools(model, launch, 100 * tools.GIB, 50 * tools.GIB)


def test_qwen3_next_auto_examples(tools):
    plain = _qwen3_next_rest_40gib(tools, [])
    assert plain.mamba_slot_bytes == 38_633_472
    assert (plain.max_mamba_cache_size, plain.max_running_requests) == (525, 105)
    assert plain.max_total_num_tokens == pytest.approx(1.84e6, rel=0.01)
    spec = _qwen3_next_rest_40gib(tools, ["--speculative-algorithm", "EAGLE"], {"num_nextn_predict_layers": 1})
    assert spec.kv_cell_bytes == 13_312 and spec.draft_kv_outside_bytes == 0
    assert (spec.max_mamba_cache_size, spec.max_running_requests) == (289, 48)
    assert spec.max_total_num_tokens == pytest.approx(1.82e6, rel=0.01)
    asking = _qwen3_next_rest_40gib(tools, ["--speculative-algorithm", "EAGLE", "--max-running-requests", "64"])
    assert asking.max_running_requests == 57
    explicit = _qwen3_next_rest_40gib(tools, ["--max-mamba-cache-size", "200", "--max-running-requests", "64"])
    assert explicit.max_running_requests == 40


def test_radix_strategy_and_overlap_set_the_ratio(tools):
    assert tools.seed_run(tools.BEFORE + ["--disable-overlap-schedule"])[1].max_running_requests == 20  # ratio 4
    no_buffer = ["--max-mamba-cache-size", "80", "--mamba-radix-cache-strategy", "no_buffer"]
    # on B200 the seed's speculative decoding picks trtllm_mha with 64-token pages, which no_buffer refuses
    with pytest.raises(LaunchError, match="no_buffer only supports page_size=1"):
        tools.seed_run(no_buffer)
    with pytest.raises(LaunchError, match="overlap schedule"):
        tools.seed_run(no_buffer + ["--attention-backend", "triton", "--page-size", "1"])
    assert tools.seed_run(no_buffer + ["--attention-backend", "triton", "--page-size", "1",
                                       "--disable-overlap-schedule"])[1].max_running_requests == 26  # ratio 3
    launch, plan = tools.seed_run(tools.BEFORE + ["--disable-radix-cache"])
    assert plan.mamba_ratio == 1 and plan.max_running_requests == 48


def test_kv_oom_message_is_sglangs(tools):
    model = tools.preset("qwen3.6-27b")
    launch = resolve_launch(parse_args(tools.SEED_ARGS + tools.BEFORE), model, [tools.B200_MIB])
    pre = 100 * tools.GIB
    # rest after the multimodal reservation and the 80-slot pool is a few hundred bytes: no KV token fits
    slot = 153_944_064
    state = (81 + 17 * 4) * slot
    available = int(pre * (1 - launch.mem_fraction_static)) + 100 * tools.MIB + state + 1000
    with pytest.raises(LaunchError) as err:
        size_pools(model, launch, pre, available)
    assert err.value.exc_type == "RuntimeError"
    # SGLang prints the VLM-adjusted automatic fraction unrounded
    assert err.value.message == ("Not enough memory. Please try to increase --mem-fraction-static. "
                                 f"Current value: mem_fraction_static={launch.mem_fraction_static}")
    assert "mem_fraction_static=0.78974984" in err.value.message


def test_weights_that_leave_nothing_fail_with_the_value_error(tools):
    # an explicit state pool: auto sizing would hit the Mamba check first, as SGLang does
    with pytest.raises(LaunchError) as err:
        tools.seed_run(tools.BEFORE + ["--mem-fraction-static", "0.3"])
    assert err.value.exc_type == "ValueError"
    assert err.value.message.startswith("Loaded weights leave no GPU memory for the KV cache under "
                                        "--mem-fraction-static=0.3. Raise --mem-fraction-static above 0.")
    assert err.value.message.endswith("If using speculative decoding, draft weights are now counted.")


def test_state_pool_too_small_for_one_request(tools):
    with pytest.raises(LaunchError) as err:
        tools.seed_run(["--max-mamba-cache-size", "4"])
    assert err.value.message.startswith(
        "Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
        "max_mamba_cache_size=4, mamba_ratio=5, resulting max_num_reqs=0.")


def test_auto_state_pool_with_no_room_fails_with_the_mamba_message(tools):
    model = tools.preset("qwen3.6-27b")
    launch = resolve_launch(parse_args(tools.SEED_ARGS + ["--mem-fraction-static", "0.5"]), model, [tools.B200_MIB])
    with pytest.raises(LaunchError) as err:
        size_pools(model, launch, 100 * tools.GIB, 51 * tools.GIB)  # rest 1 GiB: < one slot plus its draft buffers
    assert err.value.message.startswith("Not enough GPU memory for hybrid (mamba/linear-attention) state "
                                        "cache. Computed max_mamba_cache_size=")
    assert "mamba_cache_per_req=146.81 MB" in err.value.message


def test_context_length_above_the_model_is_refused(tools, monkeypatch):
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    args = parse_args(["--model-path", "m", "--context-length", "300000"])
    with pytest.raises(LaunchError) as err:
        resolve_launch(args, tools.preset("qwen3.6-27b"), [tools.B200_MIB])
    assert err.value.message == (
        "Warning: User-specified context_length (300000) is greater than the derived context_length (262144). "
        "This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may "
        "differ from max_position_embeddings in the model's config. To allow overriding this maximum, set the "
        "env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    assert resolve_launch(args, tools.preset("qwen3.6-27b"), [tools.B200_MIB]).context_len == 300000


def test_llama3_rope_scaling_keeps_the_position_limit(tools):
    assert tools.preset("llama3.1-8b").derived_context_length == 131072


def test_graph_capture_model_on_the_seed(tools):
    assert tools.seed_capture_fits(tools.BEFORE)                       # auto mfs ~0.79
    assert tools.seed_capture_fits(tools.AFTER)                        # 0.93
    # 0.96 leaves ~7.2 GiB, ~3.0 GiB after the ~4.3 GiB MTP draft KV pool: too little for the
    # default 16,384-token prefill graphs, enough with smaller prefill chunks and decode batches
    high = ["--max-mamba-cache-size", "200", "--mem-fraction-static", "0.96", "--max-running-requests", "64"]
    assert not tools.seed_capture_fits(high)
    assert tools.seed_capture_fits(high + ["--chunked-prefill-size", "4096", "--cuda-graph-max-bs-decode", "64"])


def test_dense_model_has_no_state_pool(tools):
    model = tools.preset("llama3.1-8b")
    launch = resolve_launch(parse_args(["--model-path", "m"]), model, [tools.B200_MIB])
    plan = size_pools(model, launch, 170 * tools.GIB, 155 * tools.GIB)
    assert plan.mamba_total_bytes == 0 and plan.mamba_ratio == 0
    assert plan.kv_cell_bytes == 8 * 256 * 32 * 2
    tokens = plan.max_total_num_tokens
    assert plan.max_running_requests == min(max(min(int(tokens / 131072 * 512), 4096), 2048), tokens // 2)


def test_parse_args_is_an_argparse_namespace(tools):
    assert isinstance(parse_args(tools.SEED_ARGS), argparse.Namespace)


def test_decode_capture_sizes_follow_sglangs_lists(tools):
    """cuda_graph_hook.generate_decode_cuda_graph_batch_sizes (finer steps under speculative decoding, max_bs
    always captured) and get_batch_sizes_to_capture (clipped to the request pool, which is added)."""
    spec, plan = tools.seed_run(tools.AFTER)  # NEXTN, --cuda-graph-max-bs-decode not given: B200 row 512
    sizes = graph_memory(tools.preset("qwen3.6-27b"), spec, plan.max_running_requests, 512).decode_batch_sizes
    assert sizes == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40)  # 40 requests
    model = tools.preset("llama3.1-8b")
    plain = resolve_launch(parse_args(["--model-path", "m", "--cuda-graph-max-bs-decode", "100"]), model,
                           [tools.B200_MIB])
    sizes = graph_memory(model, plain, 4096, 512).decode_batch_sizes
    assert sizes[:6] == (1, 2, 4, 8, 12, 16) and sizes[-2:] == (96, 100)


def test_model_type_is_the_top_level_configs(tools):
    """/model_info reports hf_config.model_type: qwen3_5 for the seed, not its text config's qwen3_5_text."""
    assert tools.preset("qwen3.6-27b").model_type == "qwen3_5"


@pytest.mark.parametrize("gpu, extra, backend, page", [
    ("NVIDIA B200", [], "trtllm_mla", 64), ("NVIDIA B200", ["--page-size", "32"], "trtllm_mla", 32),
    ("NVIDIA B200", ["--page-size", "16"], "trtllm_mla", 64), ("NVIDIA H200", [], "fa3", 1)])
def test_deepseek_v3_takes_trtllm_mla_pages_on_blackwell(tools, gpu, extra, backend, page):
    """model_overrides/deepseek_v2.py picks trtllm_mla on SM100; _mla_backend_page_constraints keeps a page of
    32 or 64 and moves any other to 64."""
    launch = resolve_launch(parse_args(["--model-path", "m", "--tp", "8"] + extra), tools.preset("deepseek-v3"),
                            [tools.B200_MIB] * 8, gpu_name=gpu)
    assert (launch.attention_backend, launch.page_size) == (backend, page)


@pytest.mark.parametrize("preset, extra, gpu, message", [
    ("deepseek-v3", ["--attention-backend", "trtllm_mla"], "NVIDIA H200",
     "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend."),
    ("deepseek-v3", ["--kv-cache-dtype", "bfloat16"], "NVIDIA B200",
     "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."),
    ("llama3.1-8b", ["--attention-backend", "trtllm_mha"], "NVIDIA A10G",
     "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs. Please use a "
     "different prefill backend.")])
def test_backends_sglang_cannot_start_fail_at_argument_resolution(tools, preset, extra, gpu, message):
    with pytest.raises(LaunchError) as failure:
        resolve_launch(parse_args(["--model-path", "m"] + extra), tools.preset(preset), [tools.B200_MIB], gpu_name=gpu)
    assert (failure.value.exc_type, failure.value.message, failure.value.kind) == ("ValueError", message, "args")


@pytest.mark.parametrize("gpu, capability", [("NVIDIA A10G", 86), ("NVIDIA L4", 89), ("NVIDIA A100-SXM4-40GB", 80)])
def test_small_gpus_have_their_compute_capability(gpu, capability):
    assert compute_capability(gpu) == capability


@pytest.mark.parametrize("gpu, backend", [("NVIDIA H100 80GB HBM3", "fa3"), ("NVIDIA A100-SXM4-80GB", "triton")])
def test_gpt_oss_resolves_its_own_backend_and_a_separate_swa_pool(tools, gpu, backend):
    """gpt-oss (model_overrides/gpt_oss.py): fa3 on Hopper even with EAGLE top-k 4, triton on A100; its 12
    sliding layers live in the SWA pool at 0.8 x the full pool's tokens."""
    model = tools.preset("gpt-oss-20b")
    args = parse_args(["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                       "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"])
    assert resolve_launch(args, model, [81_559], gpu_name=gpu).attention_backend == backend
    launch = resolve_launch(parse_args(["--model-path", "m"]), model, [81_559], gpu_name=gpu)
    plan = size_pools(model, launch, 70 << 30, (70 << 30) - 13_761_316_904)
    assert launch.hybrid_swa and plan.kv_cell_bytes == 12 * 8 * 128 * 2
    assert plan.swa_max_total_num_tokens == int(plan.max_total_num_tokens * 0.8)
    no_swa = resolve_launch(parse_args(["--model-path", "m", "--disable-hybrid-swa-memory"]), model, [81_559],
                            gpu_name=gpu)
    assert not no_swa.hybrid_swa
