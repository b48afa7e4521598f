"""Memory profile numbers against docs/sglang-memory-model.md §4 (the Qwen3-Next table, the seed scenario)
and hand arithmetic."""

import pytest
from fleetgen.errors import ModelConfigError
from fleetgen.tuning.profile import LaunchOptions, MemoryProfile, profile_model, weights_bytes_from_index
from fleetgen.tuning.geometry import model_geometry
import json
from fleetgen.tuning.profile import LaunchOptions, MemoryProfile, profile_geometry, profile_model, \
    weights_bytes_from_index

MIB = 1 << 20


def test_seed_profile_matches_the_worked_case(seed_profile):
    # Seed README "Computed per-unit sizes (tp 1)".
    assert seed_profile.layout == "hybrid_gdn"
    assert seed_profile.state_conv_bytes_per_slot == 61_440 * 48
    assert seed_profile.state_ssm_bytes_per_slot == 3_145_728 * 48
    assert seed_profile.state_bytes_per_slot == 153_944_064
    assert round(seed_profile.state_bytes_per_slot / MIB, 2) == 146.81
    # 4 KV heads x (256 + 256) x 16 full-attention layers x 2 bytes.
    assert seed_profile.kv_bytes_per_token == 65_536
    assert seed_profile.state_slots_per_request == 5  # extra_buffer with overlap
    assert (seed_profile.spec_algorithm, seed_profile.spec_steps, seed_profile.spec_topk,
            seed_profile.draft_tokens) == ("EAGLE", 3, 1, 4)
    assert seed_profile.spec_bytes_per_request == 4 * 153_944_064
    assert seed_profile.weights_bytes_per_gpu == 54_000_000_000
    assert seed_profile.model_context_length == 262_144
    assert seed_profile.ssm_dtype == "float32"


def test_seed_mtp_head_is_a_draft_pool_outside_the_budget(seed_profile):
    # Qwen3.5 names its MTP head mtp_num_hidden_layers; SGLang folds only num_nextn_predict_layers.
    assert seed_profile.draft_kv_bytes_per_token_outside == 4 * 512 * 2
    assert any("outside SGLang's static budget" in note for note in seed_profile.notes)


def test_num_nextn_predict_layers_folds_the_draft_layer_into_the_cell(seed_config, seed_options):
    seed_config["text_config"]["num_nextn_predict_layers"] = 1
    profile = profile_model(seed_config, 54_000_000_000, seed_options)
    assert profile.kv_bytes_per_token == 69_632  # README: "69,632 B with the MTP layer folded in"
    assert profile.draft_kv_bytes_per_token_outside == 0


def test_seed_is_multimodal_and_reserves_the_vlm_cache(seed_profile, seed_config, seed_options):
    assert seed_profile.multimodal_reserve_bytes == 100 * MIB
    # SGLang 0.5.23 refuses --language-model-only on Qwen3.5/3.6 (arg_groups/model_hook.py): the tuner says so
    # before anything is launched instead of planning a server that dies at start-up.
    with pytest.raises(ModelConfigError, match="refuses --language-model-only"):
        profile_model(seed_config, 54_000_000_000, seed_options.replace(language_model_only=True))


def test_multimodal_follows_sglangs_architecture_list():
    """configs/model_config.py: a text_config alone does not make a model multimodal; the architecture does."""
    text_with_sub_config = {"architectures": ["Qwen3ForCausalLM"], "text_config": {
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "torch_dtype": "bfloat16"}}
    assert not profile_model(text_with_sub_config, 10**9, LaunchOptions()).multimodal_reserve_bytes
    off_by_default = dict(text_with_sub_config, architectures=["Gemma3ForConditionalGeneration"])
    assert not profile_model(off_by_default, 10**9, LaunchOptions()).multimodal_reserve_bytes
    vlm = dict(text_with_sub_config, architectures=["Qwen3VLForConditionalGeneration"])
    assert profile_model(vlm, 10**9, LaunchOptions()).multimodal_reserve_bytes == 100 * MIB


@pytest.mark.parametrize("tp, conv_per_layer, ssm_per_layer, p_fp32, p_bf16, kv", [
    (1, 49_152, 2_097_152, 77_266_944, 39_518_208, 24_576),
    (2, 24_576, 1_048_576, 38_633_472, 19_759_104, 12_288),
    (4, 12_288, 524_288, 19_316_736, 9_879_552, 12_288),
    (8, 6_144, 262_144, 9_658_368, 4_939_776, 12_288),
])
def test_qwen3_next_matches_sglang_facts_section_4(qwen3_next_config, tp, conv_per_layer, ssm_per_layer,
                                                   p_fp32, p_bf16, kv):
    fp32 = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=tp))
    bf16 = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=tp, mamba_ssm_dtype="bfloat16"))
    assert fp32.state_conv_bytes_per_slot == conv_per_layer * 36
    assert fp32.state_ssm_bytes_per_slot == ssm_per_layer * 36
    assert fp32.state_bytes_per_slot == p_fp32
    assert bf16.state_bytes_per_slot == p_bf16
    assert fp32.kv_bytes_per_token == kv
    assert fp32.weights_bytes_per_gpu == 160 * 10**9 // tp


def test_qwen3_next_mtp_layer_adds_a_twelfth_when_sglang_knows_it(qwen3_next_config):
    qwen3_next_config["num_nextn_predict_layers"] = 1
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(speculative_algorithm="NEXTN"))
    assert profile.kv_bytes_per_token == 26_624  # 24,576 + 24,576 / 12
    assert profile.spec_bytes_per_request == 4 * 77_266_944


@pytest.mark.parametrize("args, ratio, strategy", [
    ([], 5, "extra_buffer"),                                   # auto + overlap -> extra_buffer
    (["--disable-overlap-schedule"], 3, "no_buffer"),          # auto, no overlap, page 1 -> no_buffer
    (["--disable-overlap-schedule", "--page-size", "16"], 4, "extra_buffer"),
    (["--mamba-radix-cache-strategy", "extra_buffer", "--disable-overlap-schedule"], 4, "extra_buffer"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"], 4, "extra_buffer_lazy"),
    (["--mamba-radix-cache-strategy", "no_buffer"], 3, "no_buffer"),
    (["--disable-radix-cache"], 1, None),
])
def test_state_slots_per_request(qwen3_next_config, args, ratio, strategy):
    profile = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(args))
    assert (profile.state_slots_per_request, profile.radix_strategy) == (ratio, strategy)


def test_lazy_extra_buffer_without_overlap_is_refused(qwen3_next_config):
    options = LaunchOptions.from_args(["--mamba-radix-cache-strategy", "extra_buffer_lazy",
                                       "--disable-overlap-schedule"])
    with pytest.raises(ModelConfigError, match="extra_buffer_lazy needs overlap"):
        profile_model(qwen3_next_config, 10**9, options)


@pytest.mark.parametrize("tp, kv_dtype, expected", [
    (1, "auto", 8 * 256 * 32 * 2),
    (8, "auto", 1 * 256 * 32 * 2),
    (16, "auto", 1 * 256 * 32 * 2),  # fewer KV heads than ranks: each keeps one
    (1, "fp8_e4m3", 8 * 256 * 32 * 1),
])
def test_dense_gqa_kv_per_token(tp, kv_dtype, expected, cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    profile = profile_model(config, 16 * 10**9, LaunchOptions(tp_size=tp, kv_cache_dtype=kv_dtype))
    assert profile.layout == "dense" and not profile.is_hybrid
    assert profile.kv_bytes_per_token == expected
    assert profile.state_bytes_per_slot == 0 and profile.spec_bytes_per_request == 0
    # head_dim is derived from hidden_size / heads; the llama3 rope factor does not stretch the context.
    assert profile.model_context_length == 131_072


MODELOPT_FP8_KV = {"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


@pytest.mark.parametrize("kv_dtype, expected", [("auto", 8 * 256 * 32 * 1), ("bf16", 8 * 256 * 32 * 2),
                                                ("fp8_e4m3", 8 * 256 * 32 * 1)])
def test_a_checkpoint_with_fp8_kv_in_hf_quant_config_sizes_an_fp8_kv_cache(kv_dtype, expected, cases):
    """ModelOpt's hf_quant_config.json says kv_cache_quant_algo FP8: under --kv-cache-dtype auto SGLang stores
    the KV cache in FP8 (kv_cache_dtype.py::configure_kv_cache_dtype), twice the tokens of the model's bf16; an
    explicit --kv-cache-dtype still wins."""
    config = cases.load_config("llama-3.1-8b-style.json")
    profile = profile_model(config, 9 * 10**9, LaunchOptions(kv_cache_dtype=kv_dtype), hf_quant_config=MODELOPT_FP8_KV)
    assert profile.kv_bytes_per_token == expected
    assert (profile.quantization, profile.kv_cache_quant_algo) == ("modelopt_fp8", "FP8")
    assert MemoryProfile.from_dict(profile.to_dict()) == profile


def test_dense_llama_speculative_defaults_are_5_4_8(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    profile = profile_model(config, 16 * 10**9, options, draft_config=draft, draft_weights_bytes=10**9)
    assert (profile.spec_steps, profile.spec_topk, profile.draft_tokens) == (5, 4, 8)
    assert profile.kv_bytes_per_token == 131_072 + 131_072 // 32  # one draft layer folded in
    assert profile.weights_bytes_per_gpu == 17 * 10**9


def test_separate_draft_model_needs_its_config(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    with pytest.raises(ModelConfigError, match="draft's config.json"):
        profile_model(config, 16 * 10**9, options)


def test_mla_latent_is_replicated_and_folds_nextn(cases):
    config = cases.load_config("deepseek-v3-style.json")
    plain = profile_model(config, 10**12, LaunchOptions(tp_size=8))
    assert plain.layout == "mla" and plain.uses_mla
    assert plain.kv_bytes_per_token == (512 + 64) * 61 * 2  # not divided by tp
    spec = profile_model(config, 10**12, LaunchOptions(tp_size=8, speculative_algorithm="NEXTN"))
    assert spec.kv_bytes_per_token == 70_272 + 70_272 // 61
    assert spec.draft_tokens == 4
    # yarn with original_max_position_embeddings keeps the factor at 1.
    assert plain.model_context_length == 163_840


def test_nemotron_h_pattern_and_state(cases):
    profile = profile_model(cases.load_config("nemotron-h-8b-style.json"), 16 * 10**9, LaunchOptions())
    geometry = model_geometry(cases.load_config("nemotron-h-8b-style.json"))
    assert (geometry.num_layers, geometry.attention_layers, geometry.state_layers) == (52, 4, 24)
    conv = (128 * 64 + 2 * 8 * 128) * 3 * 2
    ssm = 128 * 64 * 128 * 4
    assert profile.state_bytes_per_slot == (conv + ssm) * 24
    assert profile.kv_bytes_per_token == 8 * 256 * 4 * 2


def test_falcon_h1_has_attention_and_mamba_in_every_layer_and_extends_groups(cases):
    config = cases.load_config("falcon-h1-7b-style.json")
    tp1 = profile_model(config, 15 * 10**9, LaunchOptions())
    assert tp1.state_bytes_per_slot == ((6144 + 2 * 256) * 3 * 2 + 24 * 256 * 256 * 4) * 44
    assert tp1.kv_bytes_per_token == 2 * 256 * 44 * 2
    tp2 = profile_model(config, 15 * 10**9, LaunchOptions(tp_size=2))
    # n_groups 1 does not divide by 2: SGLang extends it to 2 groups (extra_groups_for_head_shards).
    assert tp2.state_conv_bytes_per_slot == (6144 + 2 * 2 * 256) // 2 * 3 * 2 * 44


def test_unknown_dense_layout_names_the_missing_keys():
    with pytest.raises(ModelConfigError) as error:
        profile_model({"architectures": ["FooForCausalLM"], "hidden_size": 1024, "torch_dtype": "bfloat16"},
                      10**9, LaunchOptions(), config_path="/models/foo/config.json")
    text = str(error.value)
    assert "num_hidden_layers" in text and "num_attention_heads" in text
    assert "/models/foo/config.json" in text and "FooForCausalLM" in text


def test_unknown_stateful_layout_is_not_sized_as_dense():
    jamba_like = {"architectures": ["JambaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16",
                  "mamba_d_state": 16, "mamba_d_conv": 4, "attn_layer_period": 8}
    with pytest.raises(ModelConfigError, match="unknown layout.*attn_layer_period.*mamba_d_conv"):
        profile_model(jamba_like, 10**9, LaunchOptions())


def test_hybrid_config_missing_a_key_names_it(qwen3_next_config):
    del qwen3_next_config["full_attention_interval"]
    with pytest.raises(ModelConfigError, match="missing: full_attention_interval"):
        profile_model(qwen3_next_config, 10**9, LaunchOptions())


def test_tp_that_does_not_divide_the_state_heads_is_an_error(qwen3_next_config):
    with pytest.raises(ModelConfigError, match="tp 3 does not divide"):
        profile_model(qwen3_next_config, 10**9, LaunchOptions(tp_size=3))


@pytest.mark.parametrize("dtype", [None, "float32", "float", "int8"])
def test_kv_auto_of_a_float32_or_unnamed_model_dtype_is_float16(cases, dtype):
    """_get_and_verify_dtype: no dtype (MiniMax-M2's config.json) or one SGLang does not know is float32, which
    --dtype auto runs in float16, and the KV cache with it: 2 bytes, not 4."""
    config = cases.load_config("llama-3.1-8b-style.json")
    del config["torch_dtype"]
    if dtype is not None:
        config["dtype"] = dtype
    assert profile_model(config, 10**9, LaunchOptions()).kv_bytes_per_token == 131_072
    assert profile_model(config, 10**9, LaunchOptions(kv_cache_dtype="float32")).kv_bytes_per_token == 262_144


@pytest.mark.parametrize("model_type, dtype", [("gemma3_text", "bfloat16"), ("gemma", "bfloat16"),
                                               ("llama", "float16")])
def test_the_dtype_sglang_runs_a_float32_model_in(model_type, dtype):
    from fleetgen.tuning.profile import auto_model_dtype

    geometry = model_geometry({"model_type": model_type, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "head_dim": 8, "torch_dtype": "float32"})
    assert auto_model_dtype(geometry) == dtype
    assert auto_model_dtype(model_geometry({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                                            "dtype": "half"})) == "float16"


def test_nextn_without_an_mtp_head_is_an_error(cases):
    with pytest.raises(ModelConfigError, match="needs a built-in MTP head"):
        profile_model(cases.load_config("llama-3.1-8b-style.json"), 10**9, LaunchOptions(speculative_algorithm="NEXTN"))


def test_weights_bytes_from_index():
    assert weights_bytes_from_index({"metadata": {"total_size": 54_000_000_000}, "weight_map": {}}) == 54 * 10**9
    with pytest.raises(ModelConfigError, match="total_size") as error:
        weights_bytes_from_index({"weight_map": {}}, path="/models/x/model.safetensors.index.json")
    assert "/models/x/model.safetensors.index.json" in str(error.value)


def test_profile_round_trips_through_a_dict(seed_profile):
    assert MemoryProfile.from_dict(seed_profile.to_dict()) == seed_profile


@pytest.mark.parametrize("extra, message", [
    ({"architectures": ["Gemma4ForCausalLM"], "layer_types": ["sliding_attention", "full_attention"] * 16},
     "sliding-window KV pool"),
    ({"index_topk": 2048}, "DSA sparse attention"),
])
def test_layouts_with_unmodeled_pools_are_refused(cases, extra, message):
    config = {**cases.load_config("llama-3.1-8b-style.json"), **extra}
    with pytest.raises(ModelConfigError, match=message):
        profile_model(config, 10**9, LaunchOptions())


GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 24, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
               "quantization_config": {"quant_method": "mxfp4"}}


@pytest.mark.parametrize("tp, heads", [(1, 8), (2, 4)])
def test_sliding_window_layers_go_to_their_own_pool(tp, heads):
    """gpt-oss: 12 full layers in the full pool, 12 sliding layers (window 128 - 1) in the SWA pool at
    SGLang's 0.8 tokens per full token; its MXFP4 checkpoint runs (and keeps KV) in bfloat16."""
    profile = profile_model(GPT_OSS_20B, 10**9, LaunchOptions(tp_size=tp))
    assert profile.kv_bytes_per_token == 12 * heads * 128 * 2
    assert profile.swa_kv_bytes_per_token == 12 * heads * 128 * 2
    assert (profile.swa_full_tokens_ratio, profile.sliding_window_size) == (0.8, 127)


def test_disabling_hybrid_swa_memory_keeps_every_layer_in_the_full_pool():
    profile = profile_model(GPT_OSS_20B, 10**9, LaunchOptions(disable_hybrid_swa_memory=True))
    assert profile.kv_bytes_per_token == 24 * 8 * 128 * 2
    assert (profile.swa_kv_bytes_per_token, profile.swa_full_tokens_ratio) == (0, None)


def test_gemma3_sliding_layers_keep_full_kv_because_sglang_has_no_swa_pool_for_it(cases):
    """Gemma-2/3 are not hybrid-SWA architectures for SGLang (model_overrides/gemma2_gemma3.py turns the
    SWA pool off): every layer, sliding or not, keeps full KV."""
    config = {**cases.load_config("llama-3.1-8b-style.json"), "architectures": ["Gemma3ForCausalLM"],
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "num_hidden_layers": 6,
              "sliding_window": 512}
    profile = profile_model(config, 10**9, LaunchOptions())
    assert profile.kv_bytes_per_token == 6 * 8 * (128 + 128) * 2 and profile.swa_full_tokens_ratio is None


@pytest.mark.parametrize("extra_args, message", [(["--disable-radix-cache"], "request cap"),
                                                 (["--speculative-algorithm", "EAGLE3"], "draft layers")])
def test_sliding_window_pool_layouts_not_modelled_are_refused_before_launch(extra_args, message):
    options = LaunchOptions.from_args(extra_args + (["--speculative-draft-model-path", "/d"] if "EAGLE3" in extra_args
                                                    else []))
    with pytest.raises(ModelConfigError, match=message):
        profile_model(GPT_OSS_20B, 10**9, options, draft_config={"num_hidden_layers": 1})


def _error(call, *args, **kwargs) -> ModelConfigError:
    with pytest.raises(ModelConfigError) as caught:
        call(*args, **kwargs)
    return caught.value


def _assert_error(error: ModelConfigError, *, message: str, path: str | None, hint: str | None) -> None:
    assert (error.message, error.path, error.hint) == (message, path, hint)
    assert str(error) == (f"[{path}] {message}" if path else message) + (
        f"\nWhat to check next: {hint}" if hint else "")


def test_weights_must_be_positive_and_the_error_names_the_config(cases):
    geometry = model_geometry(cases.load_config("llama-3.1-8b-style.json"))
    _assert_error(_error(profile_geometry, geometry, 0, LaunchOptions(), config_path="/m/llama/config.json"),
                  message="weights bytes must be positive, got 0", path="/m/llama/config.json", hint=None)
    # Without a path the error still says which file: the model's config.json.
    assert _error(profile_geometry, geometry, -5, LaunchOptions()).path == "config.json"
    # One byte is a (tiny) positive weight: profiled, not refused.
    assert profile_geometry(geometry, 1, LaunchOptions()).weights_bytes_total == 1


def test_profile_geometry_without_a_draft_counts_only_the_target_weights(cases):
    geometry = model_geometry(cases.load_config("llama-3.1-8b-style.json"))
    profile = profile_geometry(geometry, 16 * 10**9, LaunchOptions(tp_size=2))
    assert (profile.weights_bytes_total, profile.weights_bytes_per_gpu, profile.draft_weights_bytes) == \
        (16 * 10**9, 8 * 10**9, 0)


def test_weights_per_gpu_are_whole_bytes(cases):
    # An odd byte count over tp 2: each rank holds a whole number of bytes, and the plan's JSON an integer.
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 10**9 + 1, LaunchOptions(tp_size=2))
    assert profile.weights_bytes_per_gpu == 500_000_000
    assert json.dumps(profile.to_dict()["weights_bytes_per_gpu"]) == "500000000"


def test_index_total_size_must_be_positive_and_names_the_index_file():
    _assert_error(_error(weights_bytes_from_index, {"metadata": {"total_size": 0}}, path="/m/x/index.json"),
                  message="metadata.total_size is 0, not a positive byte count", path="/m/x/index.json", hint=None)
    missing = _error(weights_bytes_from_index, {"metadata": {}})
    _assert_error(missing, message="the safetensors index has no numeric metadata.total_size (found None)",
                  path="model.safetensors.index.json",
                  hint="pass the model's model.safetensors.index.json; a single-file checkpoint's weight bytes "
                       "are the file size")
    assert weights_bytes_from_index({"metadata": {"total_size": "1"}}) == 1


def test_language_model_only_refusal_names_file_supported_list_and_hint(seed_config, seed_options):
    """model_hook.handle_language_model_only raises for any architecture off SGLang's list."""
    error = _error(profile_model, seed_config, 54 * 10**9, seed_options.replace(language_model_only=True),
                   config_path="/m/qwen3.6/config.json")
    _assert_error(error, message="Qwen3_5ForConditionalGeneration: SGLang 0.5.23 refuses --language-model-only for "
                                 "this architecture (supported: Cosmos3EdgeForConditionalGeneration, "
                                 "Cosmos3ForConditionalGeneration, DeepseekV4ForCausalLM, "
                                 "MuseGlimmerForConditionalGeneration)",
                  path="/m/qwen3.6/config.json", hint="drop --language-model-only from the extra SGLang args")


def test_eagle_without_a_draft_path_uses_the_mtp_head_like_nextn(seed_config):
    """speculative_hook rewrites NEXTN to EAGLE: a path-less EAGLE on Qwen3.5 builds the same 1-layer pool."""
    args = dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    eagle = profile_model(seed_config, 54 * 10**9, LaunchOptions(speculative_algorithm="EAGLE", **args))
    nextn = profile_model(seed_config, 54 * 10**9, LaunchOptions(speculative_algorithm="NEXTN", **args))
    assert eagle.draft_kv_bytes_per_token_outside == nextn.draft_kv_bytes_per_token_outside == 4 * 512 * 2
    assert eagle.kv_bytes_per_token == nextn.kv_bytes_per_token == 65_536
    assert eagle.spec_algorithm == nextn.spec_algorithm == "EAGLE"


def test_nextn_without_an_mtp_head_error_names_file_and_hint(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    for algorithm in ("NEXTN", "EAGLE3"):
        error = _error(profile_model, config, 10**9, LaunchOptions(speculative_algorithm=algorithm),
                       config_path="/m/llama/config.json")
        _assert_error(error, message=f"LlamaForCausalLM: --speculative-algorithm {algorithm} without "
                                     "--speculative-draft-model-path needs a built-in MTP head, but config.json has "
                                     "neither num_nextn_predict_layers nor mtp_num_hidden_layers",
                      path="/m/llama/config.json",
                      hint="give the draft model path in the extra SGLang args, or drop speculative decoding")


def test_draft_path_without_its_config_error_names_the_draft(cases):
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options)
    _assert_error(error, message="--speculative-draft-model-path is set but the draft's config.json was not given",
                  path="/models/eagle3", hint="read the draft model's config.json too and pass it as draft_config")


def test_draft_config_without_a_layer_count_error_names_its_file(cases):
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/eagle3")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options,
                   draft_config={"architectures": ["LlamaForCausalLMEagle3"]})
    _assert_error(error, message="the draft config has neither num_nextn_predict_layers nor num_hidden_layers",
                  path="/models/eagle3/config.json", hint=None)


# 32 layers x 8 KV heads x (128 + 128) x 2 bytes: the llama-style target's cell.
LLAMA_CELL = 131_072


@pytest.mark.parametrize("draft, layers", [
    # ModelConfig reads a draft's text_config like a target's (get_hf_text_config).
    ({"architectures": ["X"], "text_config": {"num_hidden_layers": 2}, "num_hidden_layers": 7}, 2),
    # spec_aux_hidden_state: the draft's num_nextn_predict_layers wins over its num_hidden_layers.
    ({"architectures": ["X"], "num_nextn_predict_layers": 1, "num_hidden_layers": 3}, 1),
    ({"architectures": ["X"], "num_hidden_layers": 3}, 3),
])
def test_separate_draft_layers_are_folded_into_the_cell(cases, draft, layers):
    """DefaultPoolConfigurator: cell += int(cell * draft_layers / L_kv)."""
    options = LaunchOptions(speculative_algorithm="EAGLE3", speculative_draft_model_path="/models/draft")
    profile = profile_model(cases.load_config("llama-3.1-8b-style.json"), 16 * 10**9, options,
                            draft_config=draft, draft_weights_bytes=10**9)
    assert profile.draft_model_layers == layers
    assert profile.kv_bytes_per_token == LLAMA_CELL + int(LLAMA_CELL * layers / 32)
    assert profile.draft_kv_bytes_per_token_outside == 0


def test_draft_errors_raised_in_profiling_name_the_callers_config_path(cases):
    """profile_model hands its config_path on: an error found past the geometry still names that file."""
    options = LaunchOptions(speculative_algorithm="NEXTN")
    error = _error(profile_model, cases.load_config("llama-3.1-8b-style.json"), 10**9, options,
                   config_path="/m/llama/config.json")
    assert error.path == "/m/llama/config.json"


def test_config_mamba_ssm_dtype_sizes_the_ssm_state(qwen3_next_config):
    """mamba2_state_dtype: a valid config mamba_ssm_dtype sizes the temporal state (no flag given)."""
    qwen3_next_config["mamba_ssm_dtype"] = "bfloat16"
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions())
    assert profile.ssm_dtype == "bfloat16"
    assert profile.state_ssm_bytes_per_slot == 32 * 128 * 128 * 2 * 36
    assert profile.notes == ()
    # The flag wins over the config.
    flagged = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(mamba_ssm_dtype="float32"))
    assert flagged.ssm_dtype == "float32"
    assert flagged.state_ssm_bytes_per_slot == 32 * 128 * 128 * 4 * 36


def test_invalid_config_mamba_ssm_dtype_falls_back_to_float32_with_a_note(qwen3_next_config):
    """mamba2_state_dtype logs 'Invalid mamba_ssm_dtype ... Using default float32' and sizes fp32 state."""
    qwen3_next_config["mamba_ssm_dtype"] = "fp8"
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions())
    assert profile.ssm_dtype == "float32"
    assert profile.state_ssm_bytes_per_slot == 32 * 128 * 128 * 4 * 36
    assert profile.notes == ("config mamba_ssm_dtype 'fp8' is invalid; SGLang falls back to float32",)


def test_tp_that_does_not_divide_the_state_heads_error_names_file_and_hint(cases):
    """Mamba2StateShape.create divides both conv_dim and the heads by tp; either one failing kills SGLang.
    Falcon-H1 at tp 16: its 1 group is extended to 16, conv_dim 6144 + 2 x 16 x 256 = 14336 divides, 24 heads do not."""
    config = cases.load_config("falcon-h1-7b-style.json")
    error = _error(profile_model, config, 15 * 10**9, LaunchOptions(tp_size=16), config_path="/m/falcon/config.json")
    _assert_error(error, message="FalconH1ForCausalLM: tp 16 does not divide the state shapes (conv_dim 14336, "
                                 "24 heads); SGLang's divide() would fail",
                  path="/m/falcon/config.json", hint="choose a tp size that divides the linear-attention head count")
    # tp 3: 1 group -> 3, conv_dim 7680 and 24 heads both divide: profiled.
    profile = profile_model(config, 15 * 10**9, LaunchOptions(tp_size=3))
    assert profile.state_conv_bytes_per_slot == 7680 // 3 * 3 * 2 * 44
    assert profile.state_ssm_bytes_per_slot == 8 * 256 * 256 * 4 * 44


def test_state_bytes_are_whole_numbers_in_the_plans_json(qwen3_next_config):
    profile = profile_model(qwen3_next_config, 160 * 10**9, LaunchOptions(tp_size=2))
    stored = json.loads(json.dumps(profile.to_dict()))
    for key in ("state_conv_bytes_per_slot", "state_ssm_bytes_per_slot", "state_bytes_per_slot",
                "spec_bytes_per_request", "kv_bytes_per_token", "weights_bytes_per_gpu"):
        assert type(stored[key]) is int, key
    assert stored["state_conv_bytes_per_slot"] == 24_576 * 36
    assert stored["state_ssm_bytes_per_slot"] == 1_048_576 * 36


@pytest.mark.parametrize("args, ratio, strategy, overlap", [
    # overrides._mamba_radix_cache_resolution: paging is page_size > 1, so 2 already asks for extra_buffer.
    (["--disable-overlap-schedule", "--page-size", "2"], 4, "extra_buffer", False),
    # auto without overlap or paging: no_buffer, and SGLang turns overlap scheduling off.
    (["--disable-overlap-schedule"], 3, "no_buffer", False),
    (["--disable-overlap-schedule", "--page-size", "1"], 3, "no_buffer", False),
    ([], 5, "extra_buffer", True),
])
def test_auto_radix_strategy_and_overlap(qwen3_next_config, args, ratio, strategy, overlap):
    profile = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(args))
    assert (profile.state_slots_per_request, profile.radix_strategy, profile.overlap_schedule) == \
        (ratio, strategy, overlap)


def test_lazy_extra_buffer_without_overlap_error_says_what_to_change(qwen3_next_config):
    options = LaunchOptions.from_args(["--mamba-radix-cache-strategy", "extra_buffer_lazy",
                                       "--disable-overlap-schedule"])
    _assert_error(_error(profile_model, qwen3_next_config, 10**9, options),
                  message="--mamba-radix-cache-strategy extra_buffer_lazy needs overlap scheduling (SGLang asserts "
                          "against --disable-overlap-schedule)",
                  path=None, hint="drop --disable-overlap-schedule or use extra_buffer")


def test_mamba_full_memory_ratio_flag_is_kept(qwen3_next_config):
    """schedule.py: --mamba-full-memory-ratio falls back to 0.9 only when unset."""
    assert profile_model(qwen3_next_config, 10**9, LaunchOptions()).mamba_full_memory_ratio == 0.9
    pinned = profile_model(qwen3_next_config, 10**9, LaunchOptions.from_args(["--mamba-full-memory-ratio", "0.5"]))
    assert pinned.mamba_full_memory_ratio == 0.5


@pytest.mark.parametrize("transport, reserve_mib", [
    (None, 100), ("cpu", 100), ("cuda_ipc", 100 + 1024), ("cuda_vmm", 100 + 1024),
])
def test_gpu_feature_transport_reserves_the_feature_pool(seed_config, seed_options, transport, reserve_mib):
    """kv_cache_configurator.mm_runtime_reservation_gb: SGLANG_VLM_CACHE_SIZE_MB (100), plus
    SGLANG_MM_FEATURE_CACHE_MB (1024) with --mm-feature-transport cuda_ipc or cuda_vmm."""
    profile = profile_model(seed_config, 54 * 10**9, seed_options.replace(mm_feature_transport=transport))
    assert profile.multimodal_reserve_bytes == reserve_mib * MIB


def test_a_stored_profile_without_notes_reads_back(seed_profile):
    data = seed_profile.to_dict()
    del data["notes"]
    assert MemoryProfile.from_dict(data).notes == ()


def test_swa_pool_refusals_name_the_config_and_what_to_change(cases):
    path = "/m/gpt-oss/config.json"
    gemma4 = {**cases.load_config("llama-3.1-8b-style.json"), "architectures": ["Gemma4ForCausalLM"],
              "layer_types": ["sliding_attention", "full_attention"] * 16}
    _assert_error(_error(profile_model, gemma4, 10**9, LaunchOptions(), config_path="/m/gemma4/config.json"),
                  message="Gemma4ForCausalLM: SGLang keeps a separate sliding-window KV pool for this architecture "
                          "with a layer split the tuner does not model", path="/m/gemma4/config.json",
                  hint="add --disable-hybrid-swa-memory to the extra SGLang args (every layer then keeps full KV), "
                       "or plan this model by hand")
    _assert_error(_error(profile_model, GPT_OSS_20B, 10**9, LaunchOptions(disable_radix_cache=True), config_path=path),
                  message="GptOssForCausalLM: with the radix cache off SGLang sizes the SWA pool from the request cap "
                          "(pool_configurator.SWARequestCapPoolConfigurator), which the tuner does not model",
                  path=path, hint="drop --disable-radix-cache, or add --disable-hybrid-swa-memory")
    eagle3 = LaunchOptions.from_args(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"])
    _assert_error(_error(profile_model, GPT_OSS_20B, 10**9, eagle3, config_path=path,
                         draft_config={"num_hidden_layers": 1}),
                  message="GptOssForCausalLM: speculative decoding splits its draft layers between SGLang's full and "
                          "SWA pools in a way the tuner does not model",
                  path=path, hint="drop speculative decoding, or add --disable-hybrid-swa-memory")


def test_swa_pool_keeps_one_kv_head_per_rank_and_whole_bytes():
    """get_swa_num_kv_heads: max(1, heads // tp) per rank; the per-token bytes are integers in the plan's JSON."""
    tp8 = profile_model(GPT_OSS_20B, 10**9, LaunchOptions(tp_size=8))
    assert tp8.swa_kv_bytes_per_token == 12 * 1 * 128 * 2
    tp2 = profile_model(GPT_OSS_20B, 10**9, LaunchOptions(tp_size=2))
    assert json.dumps(tp2.to_dict()["swa_kv_bytes_per_token"]) == str(12 * 4 * 128 * 2)


def test_swa_full_tokens_ratio_flag_is_kept():
    profile = profile_model(GPT_OSS_20B, 10**9, LaunchOptions.from_args(["--swa-full-tokens-ratio", "0.5"]))
    assert (profile.swa_full_tokens_ratio, profile.sliding_window_size) == (0.5, 127)


def test_without_an_swa_pool_the_profile_reports_no_window():
    """With --disable-hybrid-swa-memory SGLang builds no SWA pool, so no admission floor depends on the window."""
    profile = profile_model(GPT_OSS_20B, 10**9, LaunchOptions(disable_hybrid_swa_memory=True))
    assert (profile.swa_full_tokens_ratio, profile.sliding_window_size) == (None, None)


def test_quantization_flag_on_an_unquantized_checkpoint_is_refused_naming_the_config(cases):
    config = cases.load_config("llama-3.1-8b-style.json")
    error = _error(profile_model, config, 16 * 10**9, LaunchOptions(quantization="fp8"),
                   config_path="/m/llama/config.json")
    assert error.path == "/m/llama/config.json" and error.message.startswith("--quantization fp8 quantizes an")
